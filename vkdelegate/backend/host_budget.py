"""Host memory of a program file's CPU glue, counted from the manifest before any
tensor is made.

A glue constant or a mutable state is stored in the manifest as a tensor reference
``{"segment": i, "dtype": name, "shape": [sizes]}``. ``tensor_ref_bytes`` checks one
reference's fields (so that a 2^64 or ``Infinity`` size is refused by name instead
of overflowing numpy) and returns its size in bytes; ``glue_tensor_bytes`` sums the
constants and states of every method, checking each against
``LoadLimits.max_tensor_bytes``. The caller checks that total (plus the bytes the
glue's creation ops make, counted elsewhere) against ``LoadLimits.max_host_bytes``
with ``check_host_bytes``. Torch-free.
"""
from __future__ import annotations

from vkdelegate import dtypes
from vkdelegate.backend.program_state import state_fqn
from vkdelegate.errors import VkDelegateError, printable
from vkdelegate.limits import LoadLimits, check_limit

#: dtypes a program file may hold -> bytes per element ("bfloat16" only with torch).
FILE_DTYPES = dtypes.ITEMSIZE

# numpy and torch take sizes as int64; a larger one (even next to a 0) cannot exist.
_MAX_DIM = 2**63 - 1


def tensor_ref_bytes(ref, where: str) -> int:
    """Bytes of the tensor a manifest reference describes (size in bytes of
    dtype x shape). Raises VkDelegateError naming ``where`` for a reference that is
    not a dict with an int ``segment``, a known ``dtype`` and a list of int sizes in
    0..2^63-1 as ``shape``."""
    if not isinstance(ref, dict) or not all(k in ref for k in ("segment", "dtype", "shape")):
        raise VkDelegateError(f"{where}: malformed tensor reference "
                              f"{printable(str(ref)[:80])}")
    seg, dtype, shape = ref["segment"], ref["dtype"], ref["shape"]
    if not isinstance(seg, int) or isinstance(seg, bool):
        raise VkDelegateError(f"{where}: tensor reference segment must be an int, got "
                              f"{printable(str(seg)[:40])}")
    if not isinstance(dtype, str) or dtype not in FILE_DTYPES:
        raise VkDelegateError(f"{where}: dtype {printable(str(dtype)[:40])} not allowed")
    if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= _MAX_DIM
            for s in shape):
        raise VkDelegateError(f"{where}: shape {printable(str(shape)[:80])} not allowed (sizes must "
                              f"be ints in 0..2^63-1)")
    count = 1
    for s in shape:
        count *= s
    return count * FILE_DTYPES[dtype]


def glue_tensor_bytes(methods: dict, limits: LoadLimits, where: str) -> int:
    """Host bytes of every glue constant and mutable state of a program manifest's
    ``methods`` (name -> {"constants": {name: ref}, "state": {name: ref}, ...}).

    Raises VkDelegateError for a malformed reference and ResourceLimitError for one
    tensor over ``limits.max_tensor_bytes``, both naming the method and the tensor.
    """
    if not isinstance(methods, dict):
        raise VkDelegateError(f"{where}: malformed manifest: methods must be a dict, got "
                              f"{type(methods).__name__}")
    total = 0
    for name, method in methods.items():
        if not isinstance(method, dict):
            raise VkDelegateError(f"{where}: malformed manifest: method {name!r} must be a "
                                  f"dict")
        for kind, label in (("constants", "constant"), ("state", "state")):
            refs = method.get(kind)
            if not isinstance(refs, dict):
                raise VkDelegateError(f"{where}, method {name!r}: malformed manifest: "
                                      f"{kind} must be a dict, got {type(refs).__name__}")
            for key, ref in refs.items():
                w = f"{where}, method {name!r}, {label} {key!r}"
                nbytes = tensor_ref_bytes(ref, w)
                check_limit(f"bytes of {ref['dtype']}{str(ref['shape'])[:80]}", nbytes,
                            limits.max_tensor_bytes, "max_tensor_bytes", w)
                total += nbytes
    return total


def check_host_bytes(total: int, limits: LoadLimits, where: str) -> None:
    """ResourceLimitError if ``total`` host bytes of CPU glue tensors (constants and
    state from ``glue_tensor_bytes``) exceed ``limits.max_host_bytes``."""
    check_limit("host bytes of the CPU glue's constants and state", total,
                limits.max_host_bytes, "max_host_bytes", where)


def budgeted_methods(manifest: dict):
    """A program manifest's methods as ``glue_tensor_bytes`` should count them: a
    state is one value per FQN over the program (a method repeating another's FQN
    adds nothing), plus the stored initial state. Malformed parts are left for the
    count to name."""
    methods = manifest.get("methods")
    if not isinstance(methods, dict):
        return methods
    counted, seen = {}, set()
    for name, m in methods.items():
        refs = m.get("state") if isinstance(m, dict) else None
        plan = m.get("plan") if isinstance(m, dict) else None
        if isinstance(refs, dict):
            fqns = {k: state_fqn(plan, k) for k in refs}
            m = {**m, "state": {k: r for k, r in refs.items() if fqns[k] not in seen}}
            seen.update(fqns.values())
        counted[name] = m
    if manifest.get("initial_state") is not None:
        counted["(initial state)"] = {"constants": {}, "state": manifest["initial_state"]}
    return counted
