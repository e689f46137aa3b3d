"""The default ``OpTable`` of the runtime: every op of the registry, checked by
``load_checks``. Torch-free; imported by ``vkdelegate.runtime`` only when a graph is
built without an injected table (runtime/op_table.py says why it lives here)."""
from __future__ import annotations

from functools import lru_cache

from vkdelegate.ops.load_checks import check_nodes
from vkdelegate.ops.registry import lookup
from vkdelegate.runtime.op_table import OpTable


@lru_cache(maxsize=1)
def default_op_table() -> OpTable:
    """The registry's ops (``registry.lookup``, which loads every family) with the
    load-time node checks of ``load_checks.check_nodes``."""
    return OpTable(lookup=lookup, check_nodes=check_nodes)
