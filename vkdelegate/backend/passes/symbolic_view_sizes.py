"""Turn one symbolic size of a view into -1.

With a dynamic batch, ``x.flatten(1)`` exports as ``view(x, [sym_size(x, 0), 15])``.
The SymInt would enter a Vulkan partition as an input, which delegates do not take, so
such a view would stay on the CPU. When exactly one entry of the size list is symbolic
(an fx node) and the others are ints, ``-1`` says the same thing: view infers it from
the element count, at export time and after every resize. Views with two or more
symbolic sizes are left as they are.
"""
from __future__ import annotations

import torch

_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def symbolic_view_sizes(pg) -> bool:
    """Replace the single symbolic size of each view by -1; True if any changed."""
    changed = False
    for node in pg.gm.graph.nodes:
        if node.op != "call_function" or node.target not in _VIEWS or len(node.args) < 2:
            continue
        sizes = node.args[1]
        if not isinstance(sizes, (list, tuple)):
            continue
        symbolic = [i for i, s in enumerate(sizes) if isinstance(s, torch.fx.Node)]
        if len(symbolic) != 1 or not all(isinstance(s, int) and s >= 0
                                         for i, s in enumerate(sizes) if i != symbolic[0]):
            continue
        new_sizes = list(sizes)
        new_sizes[symbolic[0]] = -1
        node.args = (node.args[0], new_sizes) + tuple(node.args[2:])
        changed = True
    return changed
