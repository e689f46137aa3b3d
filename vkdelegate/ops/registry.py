"""The operator registry: each supported ATen operator declared once.

Both sides read the same declaration (docs/DESIGN.md section 2):
- the partitioner: accepted dtypes, rank limit, argument rules, resize support;
- the runtime: the output-shape function (dynamic shapes) and the implementation
  that records the op's dispatches.

This module imports neither torch nor Vulkan. Op families register themselves from
``vkdelegate.ops.families``; ``load_all()`` imports them.

A rule is a small function ``rule(node: NodeSpec) -> str | None``: ``None`` means
supported, a string is the reason the node stays on the CPU. All rules of an op run
(none may skip the rest), so a report lists every reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from vkdelegate import dtypes
from vkdelegate.errors import VkDelegateError, printable

#: dtype names used across vkdelegate (numpy's names).
ALL_DTYPES = dtypes.GRAPH_DTYPES
#: floating dtypes shaders store natively (float64 is stored as float32).
FLOAT_DTYPES = dtypes.SHADER_FLOAT_DTYPES


@dataclass(frozen=True)
class TensorSpec:
    """Partition-time description of a tensor value.

    dtype: numpy dtype name ("float32", ...). shape: sizes, with the upper bound for a
    dynamic dim. dynamic: per dim, True when the size is only known at run time.
    """

    dtype: str
    shape: tuple[int, ...]
    dynamic: tuple[bool, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        return any(self.dynamic)


@dataclass(frozen=True)
class NodeSpec:
    """What the rules of an op see of one graph node.

    op: the ATen overload name ("aten.add.Tensor"). args: the schema's arguments in
    order, defaults filled; tensors as TensorSpec, scalars and lists as Python values
    (lists may hold TensorSpec); a SymInt (a size known only at run time) as the int
    it holds at the upper-bound sizes. outputs: one TensorSpec per tensor output (none
    for an op that returns a SymInt). symbolic: positions of the arguments that are,
    or are lists holding, SymInts.
    """

    op: str
    args: tuple
    outputs: tuple[TensorSpec, ...]
    symbolic: frozenset = frozenset()

    def tensors(self) -> list[TensorSpec]:
        """Every tensor argument and output, lists flattened."""
        found = []
        for a in self.args:
            items = a if isinstance(a, (list, tuple)) else [a]
            found.extend(t for t in items if isinstance(t, TensorSpec))
        return found + list(self.outputs)


Rule = Callable[[NodeSpec], Optional[str]]


@dataclass(frozen=True)
class OpSpec:
    """One operator's declaration.

    name: ATen overload name as it appears in OperatorCall.name.
    dtypes: dtypes accepted for every tensor argument and output, unless
        ``arg_dtypes`` overrides a position (index into the schema's arguments).
    impl: runtime implementation, called once at load time to record the node's
        dispatches (signature defined in ``vkdelegate.runtime.graph``).
    shape_fn: output sizes from input sizes and scalar args, for dynamic shapes
        (signature defined in ``vkdelegate.runtime.graph``); also checks a blob's declared
        sizes at load (``vkdelegate.ops.load_checks``), so an op without one is refused.
    rules: extra argument checks, each returning None or a reason string.
    max_rank: largest tensor rank accepted.
    notes: one line for the coverage table (docs/OPS.md).
    symbolic_args: argument positions that may be SymInts (or lists holding SymInts):
        the impl reads them again after every resize (``NodeBuilder.value`` gives the
        current value); a SymInt anywhere else is refused, since the op would keep
        the value it had at load.
    returns: "tensor", or "symint" for an op whose output is a SymInt value
        (``sym_size.int`` and size arithmetic, ops/families/symint.py): its
        ``shape_fn`` gives the output's value instead of sizes.
    may_alias: the output is the input's (``args[0]``) elements in order, in its dtype
        (view, squeeze, unsqueeze, clone): memory planning may give both tensors one
        memory object (serialization/memory_planning.py), and the runtime then records
        no copy for the node (kernels/affine_copy.flat_impl).
    """

    name: str
    dtypes: frozenset
    impl: Callable[..., Any]
    shape_fn: Optional[Callable[..., Any]] = None
    rules: tuple = ()
    max_rank: int = 6
    arg_dtypes: dict = field(default_factory=dict)
    notes: str = ""
    symbolic_args: frozenset = frozenset()
    returns: str = "tensor"
    may_alias: bool = False

    @property
    def resizable(self) -> bool:
        return self.shape_fn is not None

    def check(self, node: NodeSpec) -> list[str]:
        """All reasons this node cannot run on Vulkan (empty list: supported)."""
        reasons = []
        for i, a in enumerate(node.args):
            allowed = self.arg_dtypes.get(i, self.dtypes)
            items = a if isinstance(a, (list, tuple)) else [a]
            for t in items:
                if isinstance(t, TensorSpec) and t.dtype not in allowed:
                    reasons.append(f"argument {i} has dtype {t.dtype}, "
                                   f"supported: {', '.join(sorted(allowed))}")
        for t in node.outputs:
            if t.dtype not in self.dtypes:
                reasons.append(f"output dtype {t.dtype} not supported")
        for t in node.tensors():
            if t.rank > self.max_rank:
                reasons.append(f"rank {t.rank} > {self.max_rank}")
                break
        if any(t.is_dynamic for t in node.tensors()) and not self.resizable:
            reasons.append("dynamic shapes not supported by this op")
        for i in sorted(node.symbolic - self.symbolic_args):
            reasons.append(f"argument {i} is a symbolic size, which this op reads only "
                           f"at load")
        for rule in self.rules:
            reason = rule(node)
            if reason:
                reasons.append(reason)
        return reasons


REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    """Add an op; registering the same name twice is a programming error."""
    if spec.name in REGISTRY:
        raise VkDelegateError(f"operator {spec.name} registered twice")
    REGISTRY[spec.name] = spec
    return spec


def lookup(name: str) -> OpSpec:
    """The declaration of ``name``; VkDelegateError names the op when unknown."""
    load_all()
    try:
        return REGISTRY[name]
    except KeyError:
        raise VkDelegateError(f"operator {printable(name)} is not supported by the "
                              f"vkdelegate runtime") from None


def alias_ops() -> frozenset:
    """Names of the ops whose output may share its input's memory (``may_alias``)."""
    return frozenset(name for name, spec in load_all().items() if spec.may_alias)


def load_all() -> dict[str, OpSpec]:
    """Import every op family so that the registry is complete."""
    import vkdelegate.ops.families  # noqa: F401  (registers on import)

    return REGISTRY
