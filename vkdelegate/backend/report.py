"""The partition report: which nodes run on Vulkan, and why the others do not.

Torch-free, so that a loaded program (which keeps the report it was lowered with)
can show it without torch. ``to_json``/``from_json`` store it in the program file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vkdelegate.errors import VkDelegateError


@dataclass
class NodeDecision:
    """Whether one node runs on Vulkan; ``reasons`` is empty when it does. ``notes``
    say how a Vulkan node runs where that differs from the options (a node kept in
    float32 under force_fp16, and why)."""

    name: str
    op: str
    reasons: list[str] = field(default_factory=list)
    partition: Optional[int] = None
    notes: list[str] = field(default_factory=list)

    @property
    def on_vulkan(self) -> bool:
        return self.partition is not None


@dataclass
class PartitionReport:
    """Every call_function node's decision, in graph order.

    ``fallbacks``: partition (= delegate index) -> why it runs on the CPU reference
    executor in this loaded program (a DeviceLimitError's message: over a limit of
    this device), filled in when the program builds that delegate and emptied when
    it closes it; a fact about the device, not the lowering, so not saved
    (``to_json``)."""

    decisions: list[NodeDecision]
    num_partitions: int
    fallbacks: dict = field(default_factory=dict)

    @property
    def cpu_nodes(self) -> list[NodeDecision]:
        """Nodes left on the CPU, each with at least one reason."""
        return [d for d in self.decisions if not d.on_vulkan]

    @property
    def noted_nodes(self) -> list[NodeDecision]:
        """Vulkan nodes with notes (e.g. kept in float32 under force_fp16)."""
        return [d for d in self.decisions if d.on_vulkan and d.notes]

    def summary(self) -> str:
        """One line: how many nodes and partitions go to Vulkan (and which partitions
        fell back to the CPU, see ``fallbacks``)."""
        on = sum(d.on_vulkan for d in self.decisions)
        if not self.fallbacks:
            return (f"vkdelegate: {on} of {len(self.decisions)} nodes delegated to Vulkan "
                    f"in {self.num_partitions} partition(s); {len(self.cpu_nodes)} on CPU")
        fell = sorted(self.fallbacks)
        moved = sum(d.partition in self.fallbacks for d in self.decisions)
        return (f"vkdelegate: {on - moved} of {len(self.decisions)} nodes on Vulkan in "
                f"{self.num_partitions - len(fell)} partition(s); "
                f"{len(self.cpu_nodes) + moved} on CPU, {moved} of them in partition(s) "
                f"{', '.join(map(str, fell))}, delegated but over a limit of this device, "
                f"so run on the CPU reference executor")

    def __str__(self) -> str:
        from tabulate import tabulate

        rows = [(d.name, d.op, "; ".join(d.reasons)) for d in self.cpu_nodes]
        table = tabulate(rows, headers=("node", "op", "reason")) if rows else ""
        fell = [(p, self.fallbacks[p]) for p in sorted(self.fallbacks)]
        if fell:
            table += ("\n\n" if table else "") + tabulate(
                fell, headers=("partition on the CPU", "why"))
        noted = [(d.name, d.op, "; ".join(d.notes)) for d in self.noted_nodes]
        if noted:
            table += ("\n\n" if table else "") + tabulate(
                noted, headers=("node on Vulkan", "op", "note"))
        return self.summary() + ("\n" + table if table else "")

    def to_json(self) -> dict:
        """The report as a JSON-ready dict."""
        # notes only where there are some: a report without them reads as before.
        return {"num_partitions": self.num_partitions,
                "decisions": [[d.name, d.op, d.reasons, d.partition]
                              + ([d.notes] if d.notes else [])
                              for d in self.decisions]}

    @classmethod
    def from_json(cls, data) -> "PartitionReport":
        """Rebuild a report stored by ``to_json``; VkDelegateError if malformed."""
        try:
            decisions = []
            for entry in data["decisions"]:
                n, op, reasons, p, *rest = entry
                if len(rest) > 1:
                    raise ValueError(f"decision {n!r} has {len(entry)} fields")
                notes = [str(x) for x in rest[0]] if rest else []
                decisions.append(NodeDecision(str(n), str(op), [str(r) for r in reasons],
                                              None if p is None else int(p), notes))
            return cls(decisions, int(data["num_partitions"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise VkDelegateError(f"malformed partition report ({exc})") from None
