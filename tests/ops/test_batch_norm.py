"""aten._native_batch_norm_legit_no_training.default against eager.

The batch norms here follow no convolution, so the lowering's folding pass leaves
them alone and they run as the op. (An empty input exports without the op: eager
batch norm special-cases numel() == 0, so there is no empty case here.)
"""
import pytest
import torch

from tests.ops.harness import check_op

BN = "aten._native_batch_norm_legit_no_training.default"


def _bn(channels: int, dims: int, affine: bool = True, eps: float = 1e-5):
    cls = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}[dims]
    bn = cls(channels, affine=affine, eps=eps)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(channels))
        bn.running_var.copy_(torch.rand(channels) + 0.1)
        if affine:
            bn.weight.copy_(torch.randn(channels))
            bn.bias.copy_(torch.randn(channels))
    return bn.eval()


@pytest.mark.parametrize("shape,dims", [((3, 5), 1), ((2, 7, 11), 1), ((2, 3, 5, 7), 2),
                                        ((1, 5, 1, 1), 2), ((2, 3, 3, 5, 2), 3)],
                         ids=["rank2", "rank3", "rank4", "size1", "rank5"])
def test_batch_norm(shape, dims):
    torch.manual_seed(0)
    check_op(_bn(shape[1], dims), (torch.randn(shape),), ops=[BN])


def test_batch_norm_without_affine_and_large_eps():
    torch.manual_seed(0)
    check_op(_bn(5, 2, affine=False, eps=0.5), (torch.randn(2, 5, 3, 3),), ops=[BN])


def test_batch_norm_statistics_computed_at_run_time():
    # Statistics passed as inputs are read as stored (no folding at load).
    torch.manual_seed(0)

    def fn(x, mean, var, w, b):
        return torch.nn.functional.batch_norm(x, mean, var, w, b, training=False, eps=1e-3)
    check_op(fn, (torch.randn(2, 3, 5, 7), torch.randn(3), torch.rand(3) + 0.5,
                  torch.randn(3), torch.randn(3)), ops=[BN])


def test_batch_norm_fp16():
    # fp16 output rounding: values of magnitude ~5 carry ~2.5e-3 of absolute error.
    torch.manual_seed(0)
    bn = _bn(3, 2).half()
    check_op(bn, (torch.randn(2, 3, 5, 7).half(),), ops=[BN], rtol=1e-2, atol=1e-2)


def test_batch_norm_resize():
    torch.manual_seed(0)
    n, h = torch.export.Dim("n", max=4), torch.export.Dim("h", min=2, max=16)
    check_op(_bn(3, 2), (torch.randn(2, 3, 11, 5),), ops=[BN],
             dynamic_shapes={"input": {0: n, 2: h}},
             resize_inputs=(torch.randn(4, 3, 2, 5),))


def test_all_three_outputs():
    # ATen returns empty saved statistics at inference; they must come back as such.
    torch.manual_seed(0)
    w, b, mean, var = torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.1

    def fn(x):
        return torch.ops.aten._native_batch_norm_legit_no_training.default(
            x, w, b, mean, var, 0.1, 1e-5)
    check_op(fn, (torch.randn(2, 3, 4, 5),), ops=[BN])


def test_batch_norm_plane_beyond_one_grid_row():
    # 2050 x 2050 = 4.2M elements per channel: more than 65535 workgroups of 64 (the
    # usual maxComputeWorkGroupCount[0], lavapipe's too), so the shader strides.
    torch.manual_seed(0)
    check_op(_bn(2, 2), (torch.randn(1, 2, 2050, 2050),), ops=[BN])
