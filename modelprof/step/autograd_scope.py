"""Backward scope: which module call's forward created each autograd node.

Autograd numbers every node it creates with a thread-local sequence number. The forward's module
hooks note at every call boundary the next number and the call that runs from then on
(``SeqMarks``); a node belongs to the call whose span holds its number: the innermost call running
when autograd created it, as the forward counter charges ops (a module used twice has two sets of
nodes).

``AccumulateGrad`` nodes (where a leaf's gradient lands) carry no creation number: each belongs to
the first call that used its tensor (the call of the first node, in creation order, that feeds
it). The engine sums a tied weight's gradients right after the last delivery, which comes from
the first use (autograd runs the newest ready node first): the sum lands in the owner's backward.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from typing import Any

from modelprof.runtime import compat

__all__ = ["LOSS", "NodeTags", "SeqMarks", "graph_nodes", "is_accumulate", "tag_graph"]

#: The call id of nodes created by the loss (and of the seed gradient's work).
LOSS = -1


class SeqMarks:
    """``(next sequence number, call running from then on)``, noted at each call boundary."""

    __slots__ = ("seqs", "calls", "before")

    def __init__(self, before: int = 0) -> None:
        self.seqs: list[int] = []
        self.calls: list[int] = []
        self.before = before  # the call of nodes created before the first mark

    def mark(self, call: int) -> None:
        seq = compat.next_sequence_nr()
        if self.seqs and self.seqs[-1] == seq:  # no node created since the last mark
            self.calls[-1] = call
        else:
            self.seqs.append(seq)
            self.calls.append(call)

    def call_of(self, seq: int) -> int:
        i = bisect.bisect_right(self.seqs, seq) - 1
        return self.calls[i] if i >= 0 else self.before


def is_accumulate(node: Any) -> bool:
    """An ``AccumulateGrad`` node: where a leaf tensor's gradient is stored."""
    return type(node).__name__ == "AccumulateGrad"


def graph_nodes(roots: Iterable[Any]) -> list[Any]:
    """Every autograd node reachable from ``roots`` (``grad_fn``s), each once."""
    seen: set[Any] = set()
    order: list[Any] = []
    stack = [r for r in roots if r is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        order.append(node)
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                stack.append(nxt)
    return order


@dataclasses.dataclass(eq=False)
class NodeTags:
    """The call of every node of one backward graph."""

    nodes: list[Any]
    by_node: dict[Any, int]
    marks: SeqMarks

    def call_of(self, node: Any) -> int:
        call = self.by_node.get(node)
        if call is not None:
            return call
        # a node made during the backward itself (GraphRoot): the loss's
        return LOSS if is_accumulate(node) else self.marks.call_of(compat.node_sequence_nr(node))


def tag_graph(roots: Iterable[Any], marks: SeqMarks) -> NodeTags:
    """Tag every node reachable from ``roots`` with the call that created (or owns) it."""
    nodes = graph_nodes(roots)
    by_node: dict[Any, int] = {}
    first_use: dict[Any, tuple[int, int]] = {}  # leaf node -> (seq, call) of its first feeder
    for node in nodes:
        if is_accumulate(node):
            continue
        seq = compat.node_sequence_nr(node)
        call = marks.call_of(seq)
        by_node[node] = call
        for nxt, _ in node.next_functions:
            if nxt is not None and is_accumulate(nxt):
                if nxt not in first_use or seq < first_use[nxt][0]:
                    first_use[nxt] = (seq, call)
    for leaf, (_, call) in first_use.items():
        by_node[leaf] = call
    return NodeTags(nodes, by_node, marks)
