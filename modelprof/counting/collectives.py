"""Collectives, counted: which ops communicate, what each moves, and the traffic it implies.

Every collective a rank runs reaches the dispatcher as an op, whichever API issued it: the c10d
ops (``dist.all_reduce``, FSDP2's, DDP's), the functional collectives (DTensor, tensor
parallelism) and their autograd variants. :func:`collective_of` reads one into a
:class:`Collective`. Conventions (docs/distributed.md):

- ``payload_bytes`` (the ``comm_bytes`` column): the collective's whole buffer, nccl-tests'
  "size" — the gathered *output* of an all-gather, the *input* of a reduce-scatter, else the
  tensor reduced, broadcast, exchanged, sent or received: the larger of the bytes handed in and
  out (kept too: ``in_bytes``, ``out_bytes``).
- ``traffic_bytes``: what the ring algorithm implies each rank sends (and receives) in a group of
  ``n`` (nccl-tests' "bus bandwidth" factors), integer bytes rounded down; see
  :func:`implied_traffic`. *Implied*, not measured: NCCL may choose a tree, gloo its own
  algorithms.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from modelprof.runtime import compat
from modelprof.runtime.tensors import nbytes

__all__ = [
    "Collective",
    "CollectiveKind",
    "CommStats",
    "CommTable",
    "add_collective",
    "collective_kind",
    "collective_of",
    "collectives_frame",
    "comm_summary",
    "ddp_gradient_collectives",
    "implied_traffic",
    "is_comm_bookkeeping",
    "merge_comm",
]


class CollectiveKind(str, enum.Enum):
    """The kinds of collective a row can carry (the ``comm_kind`` column)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    SEND = "send"
    RECV = "recv"
    P2P = "p2p"
    BARRIER = "barrier"

    def __str__(self) -> str:
        return self.value


K = CollectiveKind
# op base names -> kind; c10d, functional and autograd forms
_KINDS: dict[str, CollectiveKind] = {
    name: kind
    for kind, names in {
        K.ALL_REDUCE: """allreduce_ allreduce_coalesced_ all_reduce all_reduce_ all_reduce_coalesced
        all_reduce_coalesced_""",
        K.ALL_GATHER: """allgather_ _allgather_base_ allgather_coalesced_
        allgather_into_tensor_coalesced_ all_gather_into_tensor all_gather_into_tensor_out
        all_gather_into_tensor_coalesced""",
        K.REDUCE_SCATTER: """reduce_scatter_ _reduce_scatter_base_ reduce_scatter_tensor_coalesced_
        reduce_scatter_tensor reduce_scatter_tensor_out reduce_scatter_tensor_coalesced""",
        K.ALL_TO_ALL: "alltoall_ alltoall_base_ all_to_all_single",
        K.BROADCAST: "broadcast_ broadcast",
        K.REDUCE: "reduce_",
        K.GATHER: "gather_ gather_into_tensor_",
        K.SCATTER: "scatter_",
        K.SEND: "send isend",
        K.RECV: "recv_ recv_any_source_ irecv",
        K.P2P: "batch_p2p_ops",
        K.BARRIER: "barrier monitored_barrier_",
    }.items()
    for name in names.split()
}
_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
# ops of the same namespaces that move nothing themselves (a wait, an autograd wrapper, a NaN
# check); FSDP2's copies into and out of its buffers belong to the collective they feed
_BOOKKEEPING = frozenset("wait_tensor _wrap_tensor_autograd check_for_nan".split())
_IN_NAMES = frozenset("input inputs input_tensor input_tensors input_list".split())
_OUT_NAMES = frozenset("output outputs output_tensor output_tensors output_lists out".split())
_BOTH_NAMES = frozenset(("tensor", "tensors"))


def _split(func: Any) -> tuple[str, str]:
    """(namespace, base name) of an op overload or packet."""
    name = func.name() if hasattr(func, "name") else str(func)  # "c10d::allreduce_"
    ns, _, base = name.partition("::")
    return ns, base.split(".")[0]


def collective_kind(func: Any) -> CollectiveKind | None:
    """The kind of collective ``func`` is, or None for any other op."""
    if not isinstance(func, compat.OpOverload):
        return None
    ns, base = _split(func)
    return _KINDS.get(base) if ns in _NAMESPACES else None


def is_comm_bookkeeping(func: Any) -> bool:
    """An op that belongs to communication but moves nothing over the network itself (a
    ``wait_tensor``; FSDP2's copy-in/copy-out of its collective buffers)."""
    if not isinstance(func, compat.OpOverload):
        return False
    ns, base = _split(func)
    return ns == "fsdp" or (ns in _NAMESPACES and base in _BOOKKEEPING)


def _group_size(func: compat.OpOverload, args: tuple, kwargs: dict) -> int:
    """Ranks in the collective's group: its ProcessGroup argument, its ``group_size``, or the
    group its ``group_name`` names; 1 where none can be found (moves nothing)."""
    for i, a in enumerate(compat.op_schema(func).arguments):
        value = args[i] if i < len(args) else kwargs.get(a.name)
        if a.name == "group_size" and isinstance(value, int):
            return value
        if a.name in ("process_group", "group_name") and isinstance(value, dist.ProcessGroup):
            return value.size()
        if a.name == "process_group" and isinstance(value, torch.ScriptObject):
            return dist.ProcessGroup.unbox(value).size()
        if a.name == "group_name" and isinstance(value, str):
            return compat.group_named(value).size()
    return 1


@dataclasses.dataclass(frozen=True, slots=True)
class Collective:
    """One collective call as this rank ran it."""

    kind: CollectiveKind
    group_size: int
    in_bytes: int  # bytes handed in (this rank's contribution)
    out_bytes: int  # bytes handed back (what this rank receives into)

    @property
    def payload_bytes(self) -> int:
        """The collective's whole buffer (nccl-tests' "size"; see the module docstring)."""
        return 0 if self.kind is K.BARRIER else max(self.in_bytes, self.out_bytes)

    @property
    def traffic_bytes(self) -> int:
        """Bytes the ring algorithm implies this rank sends (and receives) for it."""
        return implied_traffic(
            self.kind, self.payload_bytes, self.group_size, root=self.out_bytes > self.in_bytes
        )


def implied_traffic(kind: CollectiveKind, size: int, n: int, *, root: bool = False) -> int:
    """Per-rank bytes each way that ``kind`` on ``size`` bytes implies in a ring of ``n`` ranks:
    all-reduce 2(n-1)/n (a reduce-scatter then an all-gather); all-gather, reduce-scatter,
    all-to-all (n-1)/n; broadcast, reduce (pipelined), send/recv 1; gather and scatter 1 off the
    root, (n-1)/n on it; a barrier or a group of one 0.

    >>> implied_traffic(CollectiveKind.ALL_REDUCE, 1000, 4)   # 2 * 3 / 4 * 1000
    1500
    """
    if n <= 1 or kind is K.BARRIER:
        return 0
    if kind is K.ALL_REDUCE:
        return 2 * (n - 1) * size // n
    if kind in (K.ALL_GATHER, K.REDUCE_SCATTER, K.ALL_TO_ALL):
        return (n - 1) * size // n
    if kind in (K.GATHER, K.SCATTER) and root:
        return (n - 1) * size // n
    return size  # broadcast, reduce (pipelined), send/recv, p2p, gather/scatter off the root


def collective_of(func: Any, args: tuple, kwargs: dict, out: Any) -> Collective | None:
    """The collective ``func(*args, **kwargs) -> out`` ran, or None if ``func`` is none.

    Tensors are read by the schema's argument names: ``input*`` handed in, ``output*``/``out``
    handed back, ``tensor(s)`` both (in-place c10d ops); a functional collective hands back
    what it returns.
    """
    kind = collective_kind(func)
    if kind is None:
        return None
    in_bytes = out_bytes = 0
    for i, a in enumerate(compat.op_schema(func).arguments):
        value = args[i] if i < len(args) else kwargs.get(a.name)
        if a.name in _IN_NAMES or a.name in _BOTH_NAMES:
            in_bytes += nbytes(value)
        if a.name in _OUT_NAMES or a.name in _BOTH_NAMES:
            out_bytes += nbytes(value)
    ns, _ = _split(func)
    if ns != "c10d" and not any(a.name in _OUT_NAMES for a in compat.op_schema(func).arguments):
        out_bytes = nbytes(out)  # functional: the result is the output buffer
    if kind is K.SEND:
        out_bytes = 0
    elif kind is K.RECV:
        in_bytes = 0
    return Collective(kind, _group_size(func, args, kwargs), in_bytes, out_bytes)


class CommStats:
    """Collectives of one kind and group size charged to one row: calls and bytes."""

    __slots__ = ("calls", "in_bytes", "out_bytes", "payload_bytes", "traffic_bytes")

    def __init__(self) -> None:
        self.calls = self.in_bytes = self.out_bytes = self.payload_bytes = self.traffic_bytes = 0

    def add(self, c: Collective | CommStats, calls: int = 1) -> None:
        self.calls += calls if isinstance(c, Collective) else c.calls
        self.in_bytes += c.in_bytes
        self.out_bytes += c.out_bytes
        self.payload_bytes += c.payload_bytes
        self.traffic_bytes += c.traffic_bytes


CommTable = dict[tuple[str, int], CommStats]
"""(kind, group size) -> CommStats: what a call record or a row carries."""


def add_collective(table: CommTable, c: Collective) -> None:
    """Charge ``c`` to ``table``."""
    table.setdefault((c.kind.value, c.group_size), CommStats()).add(c)


def ddp_gradient_collectives(model: Any) -> list[Collective]:
    """One all-reduce per bucket of DDP's reducer (its logged bucket sizes, in bytes), over
    DDP's process group: what a backward with the default all-reduce hook runs."""
    n = model.process_group.size() if getattr(model, "process_group", None) is not None else 1
    return [Collective(CollectiveKind.ALL_REDUCE, n, s, s) for s in compat.ddp_bucket_sizes(model)]


def merge_comm(into: CommTable, more: CommTable) -> None:
    """Add every entry of ``more`` into ``into``."""
    for key, stats in more.items():
        into.setdefault(key, CommStats()).add(stats)


def comm_summary(table: CommTable | None) -> tuple[int, int, int, str, int]:
    """(calls, payload bytes, implied traffic bytes, kinds joined by '+', largest group size)
    of a table; zeros and '' for none."""
    if not table:
        return 0, 0, 0, "", 0
    kinds = list(dict.fromkeys(kind for kind, _ in table))
    return (
        sum(s.calls for s in table.values()),
        sum(s.payload_bytes for s in table.values()),
        sum(s.traffic_bytes for s in table.values()),
        "+".join(kinds),
        max(n for _, n in table),
    )


_KEY_COLUMNS = ("module", "phase", "kind", "group_size")
_STATS_COLUMNS = ("calls", "in_bytes", "out_bytes", "comm_bytes", "traffic_bytes")


def collectives_frame(rows: Any) -> Any:
    """The collectives of the leaf rows (``(communication)`` rows), one line per row, phase
    (forward/backward), kind and group size."""
    lines = []
    for r in rows:
        if not r.leaf:
            continue
        for phase, table in (("forward", r.comm), ("backward", r.backward_comm)):
            for (kind, n), s in (table or {}).items():
                stats = (s.calls, s.in_bytes, s.out_bytes, s.payload_bytes, s.traffic_bytes)
                lines.append((r.module, phase, kind, n, *stats))
    return pd.DataFrame(lines, columns=[*_KEY_COLUMNS, *_STATS_COLUMNS])
