"""The training step in the table: backward columns on every row, and two rows of its own.

Columns (``profile(..., backward=True)``), per row as the forward's (a parent aggregates its
subtree, a ``(self)`` row holds what the parent's own autograd nodes did):

    backward_macs, backward_flops   the ops autograd ran for the nodes the call's forward created
                                    (``formulas/backward.py`` for the conventions)
    saved_bytes                     bytes of the tensors autograd kept from the call's forward
                                    (each storage once; parameters and buffers not counted)
    backward_latency_ms, _std_ms    median / std over the instrumented backward passes; a
                                    ``(communication)`` row's are its call's collectives' own
                                    stamps, taken out of the call's leaf or ``(self)`` row
    backward_latency_pct            share of the median instrumented backward pass (each
                                    pass's stretches summed, the loss's included, less the
                                    stamps): the leaf rows' shares need not add up to 100 %

Two leaf rows after the model's: ``(loss)`` (the loss function; its backward and the seed
gradient) and ``(optimizer)`` (the step, per ``formulas/optim.py``; backward MACs and FLOPs
0, no backward latency: NaN, as its latency share), so
``totals["flops"] + totals["backward_flops"]`` is the whole training step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelprof.counting.scope import CallRecord
from modelprof.counting.tree import subtree_sums
from modelprof.step.count import StepCost
from modelprof.timing.layers import latency_stats
from modelprof.timing.measurement import unquotable

__all__ = ["LOSS_ROW", "OPTIMIZER_ROW", "TrainingStep", "step_columns"]

LOSS_ROW = "(loss)"
OPTIMIZER_ROW = "(optimizer)"


@dataclasses.dataclass(eq=False)
class TrainingStep:
    """The counted step (``cost``) and, when timed, its measurements (``timing``)."""

    cost: StepCost
    timing: Any = None  # modelprof.step.timing.StepTiming
    #: the instrumented backward passes against the clean backward (a TimingAgreement)
    agreement: Any = None

    @property
    def backward_latency(self) -> Any:
        return None if self.timing is None else self.timing.backward

    def __repr__(self) -> str:  # the summary, not every pass's cost (thousands of characters)
        return f"TrainingStep({self.summary()})"

    def summary(self) -> str:
        c = self.cost
        opt = c.optimizer
        line = (
            f"training step (loss {c.loss_name}"
            f"{', optimizer ' + opt.name if opt is not None else ''}): backward MACs "
            f"{c.backward_macs:,}  FLOPs {c.backward_flops:,}  saved for backward "
            f"{sum(c.saved_bytes) + c.loss_saved_bytes:,} B"
        )
        if opt is not None:
            line += f"  optimizer FLOPs {opt.flops:,}"
        t = self.timing
        if t is None:
            return line
        phases = t.phases()
        rough = {k: "; ".join(why) for k, m in phases.items() if (why := unquotable(m))}
        # a median its own runs say is no figure to quote: marked, as in the end-to-end row
        parts = ", ".join(
            f"{k} {'~' if k in rough else ''}{m.median_ms:.3f}" for k, m in phases.items()
        )
        line += f"\nstep medians (ms): {parts}"
        if rough:
            by_why: dict[str, list[str]] = {}  # each reason once, with the phases it holds for
            for k, why in rough.items():
                by_why.setdefault(why, []).append(k)
            said = "; ".join(f"{', '.join(ks)}: {why}" for why, ks in by_why.items())
            line += f" (~ no figure to quote: {said})"
        if t.peak_memory_bytes is not None:
            line += f"; step peak memory {t.peak_memory_bytes:,} B"
        if note := phases.note:  # the step's median beyond its phases' summed
            line += f"\nnote: {note}"
        b = t.backward
        if b.loaded and b.cpu is not None:  # what its loaded-machine warning says to quote
            held = "one thread's" if b.cpu_holds else "several threads', stretched by load too"
            line += (
                f"\nthe machine was loaded ({b.load_reason}): backward CPU work "
                f"{b.cpu.median_ms:.3f} ms ({b.cpu_clock}, {held})"
            )
        line += (
            f"\nbackward rows: the calls' medians sum to "
            f"{t.rows_ms:.3f} ms, {100 * t.coverage:.1f}% of the clean "
            f"backward median (under load the medians of parts need not add up); the "
            f"instrumented backward, stamps included, read x{t.overhead:.3f} the clean one"
        )
        return line

    def to_dict(self) -> dict[str, Any]:
        c = self.cost
        out: dict[str, Any] = {
            "loss": c.loss_name,
            "backward_macs": c.backward_macs,
            "backward_flops": c.backward_flops,
            "autograd_nodes": c.nodes,
            "optimizer": dataclasses.asdict(c.optimizer) if c.optimizer is not None else None,
        }
        if self.timing is not None:
            t = self.timing
            out.update({k: m.to_dict(samples=True) for k, m in t.phases().items()})
            out.update(
                backward_instrumentation_overhead=t.overhead,
                backward_coverage=t.coverage,
                backward_stamp_cost=t.stamp_cost.to_dict() if t.stamp_cost is not None else None,
                step_peak_memory_bytes=t.peak_memory_bytes,
                backward_agreement=dataclasses.asdict(self.agreement)
                if self.agreement is not None
                else None,
            )
        return out


RowKey = tuple[int, bool]  # (record index, is a (self) row)


def step_columns(
    keys: Sequence[RowKey], records: Sequence[CallRecord], cost: StepCost, timing: Any = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], TrainingStep]:
    """The backward columns of each row (``keys``: the rows' record and (self) flag, in table
    order), the fields of the (loss) and (optimizer) rows, and the step."""
    n = len(records)
    own = np.array([[c.macs, c.flops] for c in cost.backward], dtype=np.float64).reshape(n, 2).T
    own_saved = np.asarray(cost.saved_bytes, dtype=np.float64)
    inc, inc_saved = subtree_sums(records, own), subtree_sums(records, own_saved)
    total, comm = float("nan"), None
    if timing is not None:
        calls = timing.calls_ms
        inc_time = subtree_sums(records, calls[:, :n])
        total = float(np.median(calls.sum(axis=1)))
        comm = _comm_split(keys, timing)
    columns = []
    for i, is_self in keys:
        if i < 0:  # a (communication) row (report.rows.row_keys): collectives, no compute
            col = {"backward_macs": 0, "backward_flops": 0, "saved_bytes": 0}
            if comm is not None:
                col.update(latency_stats(comm[:, -1 - i], total, "backward_"))
            columns.append(col)
            continue
        src, saved = (own, own_saved) if is_self else (inc, inc_saved)
        col = {
            "backward_macs": int(src[0, i]),
            "backward_flops": int(src[1, i]),
            "saved_bytes": int(saved[i]),
        }
        if timing is not None:
            own_time = is_self or not records[i].children  # a (self) row or a leaf
            s = calls[:, i] if own_time else inc_time[:, i]
            if comm is not None and own_time:
                # a collective on a stream of its own (FSDP2 on CUDA) may outlast the call
                s = np.maximum(s - comm[:, i], 0.0)
            col.update(latency_stats(s, total, "backward_"))
        columns.append(col)
    extra = [_loss_row(cost, timing, total)]
    if cost.optimizer is not None:
        extra.append(_optimizer_row(cost, timing))
    return columns, extra, TrainingStep(cost, timing)


def _comm_split(keys: Sequence[RowKey], timing: Any) -> np.ndarray | None:
    """Per pass, the collectives' ms of each call that has a ``(communication)`` row, zero for
    the others (their collectives' time stays in the call's rows)."""
    stamped = getattr(timing, "comm_ms", None)
    if stamped is None:
        return None
    out = np.zeros_like(stamped)
    for i, _ in keys:
        if i < 0:
            out[:, -1 - i] = stamped[:, -1 - i]
    return out


def _loss_row(cost: StepCost, timing: Any, total: float) -> dict[str, Any]:
    """The (loss) row's fields: Row's defaults make it a leaf at depth 0 with no record."""
    f = cost.loss_forward
    row = dict(
        module=LOSS_ROW,
        type=cost.loss_name,
        kind="loss",
        input_shapes=list(cost.loss_input_shapes),
        output_shapes=[()],
        macs=f.macs,
        flops=f.flops,
        madd=f.madd,
        output_bytes=cost.loss_output_bytes,
        read_bytes=f.op_read_bytes,
        write_bytes=f.op_write_bytes,
        torchstat_flops=f.flops - f.macs,
        torchstat_madd=f.madd,
        backward_macs=cost.loss_backward.macs,
        backward_flops=cost.loss_backward.flops,
        saved_bytes=cost.loss_saved_bytes,
    )
    if timing is not None:
        row.update(
            latency_ms=timing.loss.median_ms,
            latency_std_ms=timing.loss.std_ms,
            **latency_stats(timing.calls_ms[:, -1], total, "backward_"),
        )
    return row


def _optimizer_row(cost: StepCost, timing: Any) -> dict[str, Any]:
    o = cost.optimizer
    row = dict(
        module=OPTIMIZER_ROW,
        type=o.name,
        kind="optimizer",
        flops=o.flops,
        madd=o.flops,
        read_bytes=o.read_bytes,
        write_bytes=o.write_bytes,
        torchstat_flops=o.flops,
        torchstat_madd=o.flops,
        backward_macs=0,
        backward_flops=0,
        saved_bytes=0,
    )
    if timing is not None and timing.optimizer is not None:  # no backward: its columns NaN
        row.update(latency_ms=timing.optimizer.median_ms, latency_std_ms=timing.optimizer.std_ms)
    return row
