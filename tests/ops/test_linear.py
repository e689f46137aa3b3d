"""aten.linear.default, aten.addmm.default and aten.bmm.default against eager."""
import numpy as np
import pytest
import torch

from tests.ops.harness import check_op
from tests.runtime.graphs import GraphMaker, rand

LINEAR, ADDMM, BMM = "aten.linear.default", "aten.addmm.default", "aten.bmm.default"


@pytest.mark.parametrize("x_shape,out_features,bias", [
    ((3, 29), 7, True), ((1, 1280), 1000, True), ((5, 11), 1, False),
    ((2, 3, 5, 13), 6, True), ((2, 1, 3, 1, 2, 7), 3, True), ((0, 5), 3, True)],
    ids=["2d", "classifier", "one_output_no_bias", "rank4", "rank6", "empty"])
def test_linear_module(x_shape, out_features, bias):
    # nn.Linear exports as permute + addmm (rank 2) or view + mm; the lowering pass
    # turns those back into aten.linear.default.
    torch.manual_seed(0)
    layer = torch.nn.Linear(x_shape[-1], out_features, bias=bias)
    check_op(layer, (torch.randn(x_shape),), ops=[LINEAR])


def test_linear_resize_and_fp16():
    torch.manual_seed(0)
    layer = torch.nn.Linear(13, 5)
    n = torch.export.Dim("n", min=1, max=16)
    check_op(layer, (torch.randn(7, 13),), ops=[LINEAR], dynamic_shapes={"input": {0: n}},
             resize_inputs=(torch.randn(16, 13),))
    # fp16: 13 products of N(0,1)-ish values give outputs of magnitude ~2; output
    # rounding to fp16 (11 bits) and eager's own fp16 rounding stay below 1e-2.
    check_op(torch.nn.Linear(13, 5).half(), (torch.randn(7, 13).half(),), ops=[LINEAR],
             rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("bias_shape", [(7,), (1, 7), (5, 7), (5, 1), ()],
                         ids=["row", "row2d", "full", "column", "scalar"])
def test_addmm_broadcast_bias(bias_shape):
    torch.manual_seed(0)
    check_op(lambda c, a, b: torch.addmm(c, a, b),
             (torch.randn(bias_shape), torch.randn(5, 11), torch.randn(11, 7)), ops=[ADDMM])


def test_addmm_alpha_beta():
    torch.manual_seed(0)
    args = (torch.randn(3, 5), torch.randn(3, 29), torch.randn(29, 5))
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0), args, ops=[ADDMM])
    # beta = 0: the bias is ignored, NaN included (ATen's rule).
    nan_bias = torch.full((3, 5), float("nan"))
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0), (nan_bias,) + args[1:],
             ops=[ADDMM])


def test_addmm_fp16():
    # fp16 output rounding of values ~5: tolerance 1e-2 (see test_linear_resize_and_fp16).
    torch.manual_seed(0)
    check_op(lambda c, a, b: torch.addmm(c, a, b),
             (torch.randn(7).half(), torch.randn(5, 11).half(), torch.randn(11, 7).half()),
             ops=[ADDMM], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shapes", [((3, 5, 7), (3, 7, 11)), ((1, 1, 29), (1, 29, 1)),
                                    ((2, 0, 3), (2, 3, 4)), ((2, 3, 0), (2, 0, 4))],
                         ids=["primes", "vector", "empty_m", "empty_k"])
def test_bmm(shapes):
    torch.manual_seed(0)
    check_op(torch.bmm, tuple(torch.randn(s) for s in shapes), ops=[BMM])


def test_bmm_fp16_and_resize():
    torch.manual_seed(0)
    # fp16 output rounding of values ~3: tolerance 1e-2.
    check_op(torch.bmm, (torch.randn(2, 3, 7).half(), torch.randn(2, 7, 5).half()),
             ops=[BMM], rtol=1e-2, atol=1e-2)
    b, k = torch.export.Dim("b", max=4), torch.export.Dim("k", min=2, max=9)
    check_op(torch.bmm, (torch.randn(3, 5, 7), torch.randn(3, 7, 2)), ops=[BMM],
             dynamic_shapes=({0: b, 2: k}, {0: b, 1: k}),
             resize_inputs=(torch.randn(4, 5, 2), torch.randn(4, 2, 2)))


def test_matmul_with_broadcast_batch_dims():
    # torch.matmul decomposes into expand/view + bmm at export; bmm must be delegated.
    torch.manual_seed(0)
    check_op(torch.matmul, (torch.randn(2, 1, 3, 5), torch.randn(4, 5, 7)), ops=[BMM])


@pytest.mark.parametrize("m", [1, 6], ids=["one_row", "row_tiles"])
def test_linear_with_weight_computed_at_run_time(vk_device, m):
    # Export only makes linear nodes for constant weights (the lowering pass); a blob
    # from elsewhere may carry a graph-input weight, read in place as [N, K].
    rng = np.random.default_rng(0)
    gm = GraphMaker()
    x, w, bias = gm.input((2, m, 11)), gm.input((7, 11)), gm.input((7,))
    gm.output(gm.op(LINEAR, [x, w, bias], (2, m, 7)))
    arrays = [rand(rng, (2, m, 11)), rand(rng, (7, 11)), rand(rng, (7,))]
    with gm.build(vk_device) as graph:
        got = graph.execute(arrays)[0]
    expected = arrays[0].astype(np.float64) @ arrays[1].T.astype(np.float64) + arrays[2]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_addmm_resize_with_full_bias():
    # self of sizes [M, N] follows M when it is dynamic (read through its metadata).
    torch.manual_seed(0)
    m = torch.export.Dim("m", min=2, max=16)
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0.5),
             (torch.randn(5, 7), torch.randn(5, 11), torch.randn(11, 7)), ops=[ADDMM],
             dynamic_shapes=({0: m}, {0: m}, None),
             resize_inputs=(torch.randn(16, 7), torch.randn(16, 11), torch.randn(11, 7)))


def test_rows_read_four_elements_a_load(monkeypatch):
    """linear.glsl reads a 4 elements a load (A_VEC4) for a prepacked weight whose K is
    a multiple of 4 (kernels/gemm.a_vec4), in fp32 and fp16, with a batch, a resize,
    rows past the tile (M = 6 of 4-row tiles) and the LONG_K loop; K = 13 keeps the
    element loads. The sums keep the order of k, so both forms give eager's values."""
    from tests.ops.harness import spy_dispatches
    from vkdelegate.kernels import loop_limit
    seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "A_VEC4" in d,
                                                          "LONG_K" in d))
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(16, 9), torch.nn.Linear(13, 5)])
    n = torch.export.Dim("n", min=1, max=8)
    check_op(lambda x, y, mods=layers: (mods[0](x), mods[1](y)),
             (torch.randn(2, 6, 16), torch.randn(6, 13)), ops=[LINEAR],
             dynamic_shapes=({1: n}, None),
             resize_inputs=(torch.randn(2, 3, 16), torch.randn(6, 13)))
    half = torch.nn.Linear(32, 8).half()
    check_op(half, (torch.randn(5, 32).half(),), ops=[LINEAR], rtol=2e-3, atol=2e-3)
    long_k = 4 * (loop_limit.LOOP_LIMIT // 4 + 8)
    assert loop_limit.over_budget(long_k)
    check_op(torch.nn.Linear(long_k, 4), (torch.randn(2, long_k) / 64,), ops=[LINEAR])
    linear = [s[1:] for s in seen if s[0] == "linear"]
    if not linear:
        pytest.skip("this device runs linears on the GEMM core")
    assert linear == [(True, False), (False, False), (True, False), (True, True)], linear


def test_linear_texel_form(monkeypatch):
    """CPU drivers read a prepacked weight (B_TEXEL) and, when K is a multiple of 4,
    the rows of a (A_TEXEL) as uniform texel buffers (linear.glsl, runtime/texel.py):
    against eager with a resize, K = 13 (the weight only) and fp16 (an rgba16f view of
    a). GPUs never take it (the GEMM core)."""
    from tests.ops.harness import spy_dispatches
    from vkdelegate.runtime import default_device
    seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "A_TEXEL" in d,
                                                          "B_TEXEL" in d))
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(24, 10), torch.nn.Linear(13, 5)])
    n = torch.export.Dim("n", min=1, max=9)
    check_op(lambda x, y, mods=layers: (mods[0](x), mods[1](y)),
             (torch.randn(2, 7, 24), torch.randn(6, 13)), ops=[LINEAR],
             dynamic_shapes=({1: n}, None),
             resize_inputs=(torch.randn(2, 9, 24), torch.randn(6, 13)))
    check_op(torch.nn.Linear(32, 8).half(), (torch.randn(5, 32).half(),), ops=[LINEAR],
             rtol=2e-3, atol=2e-3)
    linear = [s[1:] for s in seen if s[0] == "linear"]
    if default_device().texel_inputs:
        assert linear == [(True, True), (False, True), (True, True)], seen
    else:
        assert not any(a or b for a, b in linear), seen
