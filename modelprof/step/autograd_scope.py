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
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from modelprof.runtime import compat
from modelprof.runtime.hooks import module_hooks
from modelprof.runtime.tensors import iter_tensors

__all__ = [
    "LOSS",
    "NodeTags",
    "Recomputed",
    "SeqMarks",
    "graph_nodes",
    "is_accumulate",
    "tag_graph",
]

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
    #: the call whose reentrant checkpoint last ran its function again in the backward: the
    #: owner of the nodes that recomputation made outside any module call (``Recomputed``)
    recomputing: int | None = None

    def call_of(self, node: Any) -> int:
        call = self.by_node.get(node)
        if call is not None:
            if compat.is_checkpoint_node(node):  # its rerun starts: the nodes it makes are its
                self.recomputing = call  # (also where the function it reruns calls no module)
            return call
        if self.recomputing is not None and not is_accumulate(node):
            return self.recomputing
        # a node made during the backward itself (GraphRoot): the loss's
        return LOSS if is_accumulate(node) else self.marks.call_of(compat.node_sequence_nr(node))


class Recomputed:
    """Module hooks for the backward that tag the nodes a reentrant checkpoint makes when it
    runs its function again (``torch.utils.checkpoint(..., use_reentrant=True)``) and then
    differentiates: each belongs to the forward call it reran, as the forward's nodes do.

    The forward ran that function with grad off, right after autograd numbered the checkpoint's
    node ``s``: its calls are those noted in ``quiet[(id(module), s + 1)]`` (grad off, the next
    number ``s + 1`` at their start), the k-th rerun of a module the k-th of them. The rerun's
    call boundaries are marked as the forward's are (``SeqMarks``, in the numbers of the thread
    that reruns); when its outermost call returns, the nodes its output reaches through nodes
    numbered from that call's start on are tagged by the marks, once each."""

    def __init__(
        self,
        tags: NodeTags,
        quiet: dict[tuple[int, int], list[int]],
        on_tag: Callable[[Any, int], None] | None = None,
    ) -> None:
        self.tags = tags
        self.quiet = quiet
        self.on_tag = on_tag  # called with each node it tags and its call (the timed step's)
        self.stack: list[tuple[int, int]] = []  # (id(module), call) of the open rerun calls
        self.seen: dict[tuple[int, int], int] = {}  # a key of quiet -> its reruns so far
        self.marks = SeqMarks()
        self.first = 0  # the number the outermost open call started at

    @staticmethod
    def note(quiet: dict[tuple[int, int], list[int]], module: nn.Module, call: int) -> None:
        """In the forward: note ``call`` of ``module`` in ``quiet`` where it runs with grad off
        (a reentrant checkpoint's function), keyed by the number autograd gives next."""
        if not torch.is_grad_enabled():
            quiet.setdefault((id(module), compat.next_sequence_nr()), []).append(call)

    def hooked(self, model: nn.Module, names: dict[nn.Module, str]) -> Any:
        """``pre`` and ``post`` on every module call of ``model`` in the block, on any thread
        (autograd runs a CUDA backward, and so the rerun, on the device's own thread)."""
        return module_hooks(model, self.pre, self.post, names, any_thread=True)

    def pre(self, module: Any, *_: Any) -> None:
        node = compat.current_autograd_node()
        if node is None or not self.quiet:
            return
        key = (id(module), compat.node_sequence_nr(node) + 1)
        k = self.seen[key] = self.seen.get(key, -1) + 1
        calls = self.quiet.get(key, ())
        if k < len(calls):
            call = calls[k]
        elif self.stack:  # not seen in the forward: its enclosing call's
            call = self.stack[-1][1]
        else:
            return
        if not self.stack:
            self.tags.recomputing = self.tags.call_of(node)
            self.marks, self.first = SeqMarks(), compat.next_sequence_nr()
        self.stack.append((id(module), call))
        self.marks.mark(call)

    def post(self, module: Any, output: Any) -> None:
        stack = self.stack
        if not stack or stack[-1][0] != id(module):
            return
        stack.pop()
        if stack:
            self.marks.mark(stack[-1][1])
            return
        self._tag([t.grad_fn for t in iter_tensors(output) if t.grad_fn is not None])

    def _tag(self, todo: list[Any]) -> None:
        """Tag the nodes ``todo`` reaches through nodes numbered from ``first`` on; each
        weight's gradient node the call of its first user's."""
        by_node, marks, first = self.tags.by_node, self.marks, self.first
        first_use: dict[Any, tuple[int, int]] = {}
        tagged = []
        while todo:
            node = todo.pop()
            if node in by_node:
                continue
            seq = compat.node_sequence_nr(node)
            if seq < first:
                continue
            call = by_node[node] = marks.call_of(seq)
            tagged.append((node, call))
            for nxt, _ in node.next_functions:
                if nxt is None:
                    continue
                if not is_accumulate(nxt):
                    todo.append(nxt)
                elif nxt not in by_node and (nxt not in first_use or seq < first_use[nxt][0]):
                    first_use[nxt] = (seq, call)
        for leaf, (_, call) in first_use.items():
            by_node[leaf] = call
            tagged.append((leaf, call))
        if self.on_tag is not None:
            for node, call in tagged:
                self.on_tag(node, call)


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
