"""A zero ``constant_pad_nd`` before a 2-D convolution folds into
``vkdelegate.padded_conv_with_clamp`` (passes/fold_conv_padding.py): TF "SAME"
asymmetric pads, pads on top of the convolution's own padding, depthwise, dilated,
strided, with the fused ReLU6, fp16, dynamic sizes; eager is the reference, the pad
node is gone from the delegate, and the CPU kernel (reference executor) agrees too.
Pads the fold must leave alone (non-zero value, negative pads, 3-D inputs) stay as
they were."""
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.harness import check_op, delegated_nodes
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops

PADDED = custom_ops.PADDED_CONV_WITH_CLAMP.name
PAD = "aten.constant_pad_nd.default"


class _PadConv(torch.nn.Module):
    def __init__(self, cin, cout, k, pads, relu6=False, value=0.0, **kw):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, k, **kw)
        self.pads, self.relu6, self.value = pads, relu6, value

    def forward(self, x):
        y = self.conv(F.pad(x, self.pads, value=self.value))
        return F.relu6(y) if self.relu6 else y


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


# (input shape, Conv2d args, pads (left, right, top, bottom), kwargs)
CASES = {
    "tf_same_s2": ((2, 3, 15, 16), (3, 8, 3), (0, 1, 0, 1), {"stride": 2}),
    "tf_same_s2_k5": ((1, 4, 17, 14), (4, 8, 5), (1, 2, 1, 2), {"stride": 2}),
    "on_top_of_own_padding": ((1, 3, 9, 11), (3, 4, 3), (1, 2, 0, 3), {"padding": 1}),
    "depthwise_relu6": ((2, 6, 12, 10), (6, 6, 3), (0, 1, 0, 1),
                        {"stride": 2, "groups": 6, "relu6": True}),
    "dilated": ((1, 2, 13, 9), (2, 5, 3), (2, 0, 1, 1), {"dilation": 2}),
    "width_only": ((1, 3, 6, 7), (3, 4, 3), (1, 1), {}),
    "pointwise_padded": ((1, 4, 5, 6), (4, 8, 1), (0, 1, 2, 0), {}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_pad_folds_into_the_convolution(case, dtype):
    shape, (cin, cout, k), pads, kw = case
    torch.manual_seed(0)
    kw = dict(kw)
    relu6 = kw.pop("relu6", False)
    module = _PadConv(cin, cout, k, pads, relu6=relu6, **kw).to(dtype)
    # fp16: the output is rounded once to fp16 after an fp32 accumulation.
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else {}
    program = check_op(module, (torch.randn(shape).to(dtype),), ops=[PADDED], **tol)
    assert PAD not in _ops(program), _ops(program)


def test_dynamic_sizes_resize():
    torch.manual_seed(0)
    module = _PadConv(3, 8, 3, (0, 1, 0, 1), stride=2, relu6=True)
    h, w = Dim("h", min=4, max=40), Dim("w", min=4, max=40)
    check_op(module, (torch.randn(1, 3, 15, 16),), ops=[PADDED],
             dynamic_shapes=({2: h, 3: w},),
             resize_inputs=[(torch.randn(1, 3, 40, 9),), (torch.randn(1, 3, 4, 5),)])


def test_reference_executor_runs_the_fold():
    torch.manual_seed(0)
    module = _PadConv(3, 8, 3, (0, 1, 0, 1), stride=2, relu6=True).eval()
    x = torch.randn(2, 3, 15, 16)
    program = to_backend(torch.export.export(module, (x,)),
                         VulkanPartitioner({"executor": "reference"}))
    assert PADDED in {d.op for d in program.report.decisions}
    torch.testing.assert_close(program(x), module(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pads,value", [((0, 1, 0, 1), 0.5), ((0, -1, 1, 0), 0.0)],
                         ids=["nonzero_value", "negative_pad"])
def test_pads_that_are_not_folded(pads, value):
    torch.manual_seed(0)
    module = _PadConv(3, 4, 3, pads, value=value)
    program = check_op(module, (torch.randn(1, 3, 9, 8),), ops=[PAD, "aten.convolution.default"])
    assert PADDED not in _ops(program)
