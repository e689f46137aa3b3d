"""SymInt ops: ``sym_size.int`` and the size arithmetic torch.export emits (add, sub,
mul, floordiv on SymInts).

Names and wire conventions are ExecuTorch's Vulkan backend's (SymIntOps.cpp,
``VK_REGISTER_OP(sym_size.int, ...)``, ``add``, ``sub``, ``floordiv``, ``mul``):
``sym_size.int`` args ``[tensor, Int dim, SymInt out]``, the arithmetic ops ``[a, b,
SymInt out]`` with each operand an Int or a SymInt. The output is a SymInt value whose
number changes per call. Nothing runs on the device: at load (``impl``) and after every
resize (``DelegateGraph.resize``) the runtime evaluates the op's ``shape_fn`` on the
current sizes and values, on the host, in chain order, so that the view, expand,
slice, arange and full nodes after it read the new number. ExecuTorch's SymInt is
int32; a value outside int32 is refused, naming the node.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.dims import wrap_dim
from vkdelegate.ops.registry import ALL_DTYPES, NodeSpec, OpSpec, register

_INT32 = (-(1 << 31), (1 << 31) - 1)


def _checked(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise VkDelegateError(f"{name} gives {value!r}, not an int")
    if not _INT32[0] <= value <= _INT32[1]:
        raise VkDelegateError(f"{name} gives {value}, outside the int32 range of a SymInt")
    return value


def sym_size(args) -> int:
    """``sym_size.int(self, dim)``: the current size of ``self`` at ``dim`` (wrapped)."""
    x, dim = args[:2]
    shape = tuple(x.shape)
    if not shape:
        raise VkDelegateError("sym_size of a 0-d tensor")
    return _checked("sym_size", shape[wrap_dim(dim, len(shape), "sym_size dim")])


def _floordiv(a: int, b: int) -> int:
    if b == 0:
        raise VkDelegateError("floordiv by zero")
    return a // b  # Python's floor division, as ExecuTorch's sym_floordiv rounds


_ARITHMETIC = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
               "mul": lambda a, b: a * b, "floordiv": _floordiv}


def _arithmetic_fn(name: str):
    fn = _ARITHMETIC[name]

    def value(args) -> int:
        a, b = args[:2]
        for x in (a, b):
            if isinstance(x, bool) or not isinstance(x, int):
                raise VkDelegateError(f"{name} takes ints or SymInts, got "
                                      f"{type(x).__name__}")
        return _checked(name, fn(a, b))
    return value


def _ints_rule(node: NodeSpec):
    if len(node.args) != 2:
        return f"takes 2 operands, got {len(node.args)}"
    if any(isinstance(a, bool) or not isinstance(a, int) for a in node.args):
        return "operands must be ints or SymInts"
    return None


def _sym_size_rule(node: NodeSpec):
    if len(node.args) != 2 or not hasattr(node.args[0], "shape"):
        return "takes a tensor and a dim"
    dim = node.args[1]
    if isinstance(dim, bool) or not isinstance(dim, int):
        return "dim must be an int"
    if not -node.args[0].rank <= dim < node.args[0].rank:
        return f"dim {dim} out of range for rank {node.args[0].rank}"
    return None


def _impl_for(value_fn):
    def impl(b, node):
        *arg_ids, out_id = node.args
        try:
            b.set_symint(out_id, value_fn([b.value(a) for a in arg_ids]))
        except VkDelegateError as exc:
            raise b.error(str(exc)) from None
    return impl


register(OpSpec(name="sym_size.int", dtypes=ALL_DTYPES, impl=_impl_for(sym_size),
                shape_fn=sym_size, rules=(_sym_size_rule,), returns="symint",
                notes="host side: a size of a tensor as a SymInt (ExecuTorch name)"))
for _name in _ARITHMETIC:
    _fn = _arithmetic_fn(_name)
    register(OpSpec(name=_name, dtypes=frozenset(), impl=_impl_for(_fn), shape_fn=_fn,
                    rules=(_ints_rule,), returns="symint", symbolic_args=frozenset({0, 1}),
                    notes=f"host side: operator.{_name} on SymInts (ExecuTorch name)"))
