"""Custom ops are declared once (vkdelegate.backend.custom_ops) and every consumer reads
that declaration: the torch library, the glue allow-list, the reference executor, the
registry's Vulkan kernels and the fusion pass."""
import pytest
import torch

from vkdelegate.backend import allowed_ops, custom_ops, glue_ops, reference
from vkdelegate.backend.passes.fuse_conv_clamp import FUSED
from vkdelegate.errors import VkDelegateError
from vkdelegate.ops.registry import load_all


def test_every_non_aten_registry_op_is_declared():
    # A Vulkan family registering a custom op must have its declaration (schema, CPU
    # kernel) so that the glue and the reference executor can run it too.
    # Host-side SymInt ops (sym_size.int, mul, ...) are ExecuTorch's blob names of ATen
    # and Python size operators, not custom ops.
    custom = [n for n, spec in load_all().items()
              if not n.startswith("aten.") and spec.returns != "symint"]
    assert "et_vk.conv_with_clamp.default" in custom
    assert [n for n in custom if n not in custom_ops.CUSTOM_OPS] == []


def test_allow_lists_are_the_declarations():
    declared = set(custom_ops.CUSTOM_OPS)
    assert set(allowed_ops.CUSTOM) | set(allowed_ops.REFERENCE_ONLY) == declared
    assert not set(allowed_ops.CUSTOM) & set(allowed_ops.REFERENCE_ONLY)
    for name in allowed_ops.CUSTOM:
        assert allowed_ops.is_allowed(name)
    for name in allowed_ops.REFERENCE_ONLY:
        assert not allowed_ops.is_allowed(name)
        assert allowed_ops.is_allowed(name, reference=True)


def test_torch_library_op_runs_the_cpu_kernel():
    op = custom_ops.CONV_WITH_CLAMP.overload()
    assert glue_ops.resolve(custom_ops.CONV_WITH_CLAMP.name) is op
    assert FUSED == custom_ops.CONV_WITH_CLAMP.name
    x, w = torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3)
    want = torch.clamp(torch.nn.functional.conv2d(x, w, padding=1), -0.5, 0.25)
    got = op(x, w, None, [1], [1], [1], False, [0], 1, -0.5, 0.25)
    torch.testing.assert_close(got, want)
    # Meta (fake tensors, export) gives the output shape.
    meta = op(x.to("meta"), w.to("meta"), None, [1], [1], [1], False, [0], 1, None, 0.0)
    assert meta.shape == (1, 4, 6, 6)


def test_reference_runs_delegate_only_ops_by_their_cpu_kernel():
    x = torch.arange(6.0).reshape(2, 3)
    got = reference.resolve(custom_ops.PREPACK.name)(x)
    assert torch.equal(got, x) and got.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("name, schema, message", [
    ("et_vk.conv_with_clamp.default", None, "declared twice"),
    ("et_vk.no_overload", None, "namespace.op.overload"),
    ("et_vk.group_norm.default", "layer_norm(Tensor x) -> Tensor", "names another op"),
])
def test_bad_declarations_are_refused(name, schema, message):
    with pytest.raises(VkDelegateError, match=message):
        custom_ops.declare_custom_op(name, schema, None)
    assert "et_vk.group_norm.default" not in custom_ops.CUSTOM_OPS
