"""vkdelegate.choose_qparams_per_token: torchao's per-token asymmetric int8 activation
qparams (8da4w) in one dispatch. A module calling torchao's own
``choose_qparams_affine`` exports as the decomposed chain; lowered, the chain becomes
the op (backend/passes/quantized_linear.fuse_choose_qparams) and its scale and zero
point equal torchao's eager ones bit for bit: the same float operations (a division by
a uniform 255, round half to even), whatever the row holds."""
import math

import numpy as np

import pytest
import torch

from tests.ops.harness import check_op, delegated_nodes
from tests.vulkan_skip import vulkan_unavailable

CHOOSE = "vkdelegate.choose_qparams_per_token.default"


class _Qparams(torch.nn.Module):
    """torchao 0.18's 8da4w activation qparams (intx_unpacked_to_int8_tensor's
    _apply_int8_act_asym_per_token_quant_dequant), returned."""

    def forward(self, x):
        from torchao.quantization.quant_primitives import (_DTYPE_TO_QVALUE_BOUNDS,
                                                           MappingType,
                                                           choose_qparams_affine)
        from torchao.quantization.utils import _get_per_token_block_size

        qmin, qmax = _DTYPE_TO_QVALUE_BOUNDS[torch.int8]
        return choose_qparams_affine(x, MappingType.ASYMMETRIC,
                                     _get_per_token_block_size(x), target_dtype=torch.int8,
                                     quant_min=qmin, quant_max=qmax,
                                     zero_point_dtype=torch.int8)


def _rows(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-30, 30, shape[-1])[
        torch.randperm(shape[-1], generator=g)]
    flat = x.reshape(-1, shape[-1])
    # Rows that reach every branch: all positive (lo = 0), all negative (hi = 0),
    # zeros (scale clamped to FLT_MIN), denormals, ties of lo / scale at .5, an inf, a
    # NaN, -0.0, a -inf, both infs.
    special = [torch.rand(shape[-1], generator=g) + 1, -torch.rand(shape[-1], generator=g),
               torch.zeros(shape[-1]), torch.full((shape[-1],), 1e-40),
               torch.full((shape[-1],), -2.5) * torch.arange(shape[-1]) / shape[-1],
               torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g),
               torch.full((shape[-1],), -0.0), torch.randn(shape[-1], generator=g),
               torch.randn(shape[-1], generator=g)]
    special[5][0] = math.inf
    special[6][-1] = math.nan
    special[8][-1] = -math.inf  # scale inf, -inf / inf = NaN: zero point 0 (a trial's find)
    special[9][0], special[9][-1] = math.inf, -math.inf
    for i, row in enumerate(special[:flat.shape[0]]):
        flat[i] = row
    return x


@pytest.mark.parametrize("shape", [(10, 64), (1, 1, 7), (3, 5, 200), (9, 4097)])
def test_equals_torchao(shape):
    pytest.importorskip("torchao")
    x = _rows(shape, sum(shape))
    program = check_op(_Qparams().eval(), (x,), ops=[CHOOSE], atol=0, rtol=0)
    ops = [name for name, _ in delegated_nodes(program)]
    assert ops.count(CHOOSE) == 1, ops
    assert not {"aten.amin.default", "aten.amax.default", "aten.full_like.default",
                "aten.minimum.default", "vkdelegate.fused_elementwise.default"} & set(ops), ops


class _Decomposed(torch.nn.Module):
    """The op's definition (custom_ops._choose_qparams_per_token) as plain ATen calls:
    the chain torchao's function exports as, which also exports with a dynamic dim
    (torchao 0.18's own function does not)."""

    def forward(self, x):
        from vkdelegate.backend.custom_ops import _choose_qparams_per_token

        return _choose_qparams_per_token(x)


def test_rows_that_change_at_run_time():
    """Prefill's T is dynamic: the grid is sized for the most rows, the current count
    is a parameter (workgroups past it write nothing)."""
    t = torch.export.Dim("t", min=1, max=40)
    check_op(_Decomposed().eval(), (_rows((1, 17, 96), 1),), ops=[CHOOSE], atol=0, rtol=0,
             dynamic_shapes={"x": {1: t}},
             resize_inputs=[(_rows((1, 40, 96), 2),), (_rows((1, 1, 96), 3),)])


def test_the_custom_op_kernel_is_torchao():
    """The op's CPU kernel (its definition: what the reference executor and the
    tests compare with) is torchao's computation."""
    pytest.importorskip("torchao")
    from vkdelegate.backend.custom_ops import CHOOSE_QPARAMS_PER_TOKEN

    from vkdelegate.backend.custom_ops import QPARAMS_EPS
    from vkdelegate.ops.families.choose_qparams import EPS

    assert EPS == QPARAMS_EPS == torch.finfo(torch.float32).tiny
    x = _rows((10, 33), 3)
    scale, zp = CHOOSE_QPARAMS_PER_TOKEN.overload()(x)
    want_scale, want_zp = _Qparams()(x)
    assert torch.equal(scale.nan_to_num(7.0), want_scale.reshape(-1).nan_to_num(7.0))
    assert torch.equal(zp, want_zp.reshape(-1))


@pytest.mark.parametrize("rows", [1, 6])
def test_8da4w_linears_share_one_per_input(rows):
    """Two 8da4w linears reading one x (q and k): one qparams node for both, and one
    merged product (passes/merge_linears: their qparams are a function of x alone);
    the outputs as eager's (tolerance: test_quantized_linear's for 8da4w)."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("torchao")
    from vkdelegate.backend.quantize import quantize_for_vulkan

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = torch.nn.Linear(64, 32), torch.nn.Linear(64, 64)
            self.o = torch.nn.Linear(96, 16)

        def forward(self, x):
            return self.o(torch.cat([self.q(x), self.k(x)], -1).relu())

    torch.manual_seed(0)
    model = quantize_for_vulkan(Two().eval(), "8da4w", group_size=32)
    x = torch.randn(rows, 64)
    program = check_op(model, (x,), ops=["et_vk.linear_dq8ca_q4gsw.default"],
                       rtol=2e-5, atol=2e-4)
    ops = [name for name, _ in delegated_nodes(program)]
    assert ops.count(CHOOSE) == 2, sorted(ops)  # x, and o's input
    assert ops.count("et_vk.linear_dq8ca_q4gsw.default") == 2, sorted(ops)  # q/k, o
    assert ops.count("vkdelegate.narrow_last.default") == 2, sorted(ops)
    assert "aten.amin.default" not in ops, ops


def _blob(x=(6, 40), x_dtype="float32", outs=None):
    """A blob of one choose_qparams_per_token node on x of these sizes with outputs
    declared ``outs`` ((shape, dtype) pairs; default: what the op gives)."""
    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    m = GraphMaker()
    xid = m.input(x, x_dtype)
    outs = outs or [(x[:-1], "float32"), (x[:-1], "int8")]
    ids = [m.tensor(shape, dtype) for shape, dtype in outs]
    out = m._add(g.ValueList(ids))
    m.graph.chain.append(g.OperatorCall(0, CHOOSE, [xid, out]))
    for i in ids:
        m.output(i)
    return m


def test_matching_blob_runs(vk_device):
    from vkdelegate.backend.custom_ops import CHOOSE_QPARAMS_PER_TOKEN
    from vkdelegate.runtime import load_delegate

    x = _rows((6, 40), 9)
    with load_delegate(_blob().blob()) as graph:
        scale, zp = graph.execute([x.numpy()])
    want_scale, want_zp = CHOOSE_QPARAMS_PER_TOKEN.overload()(x)
    assert np.array_equal(scale, want_scale.numpy(), equal_nan=True)
    assert np.array_equal(zp, want_zp.numpy())


@pytest.mark.parametrize("kwargs,match", [
    (dict(outs=[((2,), "float32"), ((6,), "int8")]), r"output"),
    (dict(outs=[((6,), "float32"), ((60,), "int8")]), r"output"),
    (dict(outs=[((6,), "float32"), ((6,), "int32")]), r"dtype"),
    (dict(x_dtype="float16"), r"dtype float16"),
])
def test_crafted_blob_is_refused_at_load(vk_device, kwargs, match):
    """A blob whose node the kernel could not run as the op defines it (a scale or
    zero point smaller than the rows would be written past) is refused before anything
    is built, by the Vulkan loader and the reference executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.runtime import load_delegate

    blob = _blob(**kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=r"node 0 \(vkdelegate.choose_qparams_per"
                                                  r"_token.default\): .*" + match):
            load(blob)
