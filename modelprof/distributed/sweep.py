"""How a sweep runs (``modelprof.sweep`` gives it ``profile()`` as the measure): configurations
dealt across ``torchrun`` ranks or run in one process, gathered into one DataFrame.

- Configuration ``i`` (in expansion order) belongs to rank ``i % world_size``: every rank knows
  its share without talking, and a rerun deals the same way (meeting: :mod:`.sweep_ranks`).
- Counting only (``timing=False``) runs on ``meta``: no weights, no competition for memory;
  one under ``amp`` on its ``device`` (autocast acts on real devices only).
- Timed configurations run after every rank has counted (a barrier), each under an exclusive
  lock of its device on the host (``cpu``, or one per GPU); ``"cuda"`` is ``cuda:LOCAL_RANK``.
- Failures are rows (``status="error"``); each finished row is saved at once, so a rerun
  resumes (failed ones rerun with ``retry_failed=True``). Rank 0 alone shows progress and
  writes the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import modelprof.columns as registry
from modelprof.distributed.sweep_config import SweepConfig
from modelprof.distributed.sweep_ranks import SweepRanks, open_ranks
from modelprof.distributed.sweep_store import ResultStore
from modelprof.errors import (
    ModelProfError,
    TimingDisagreementWarning,
    check_callback,
    check_flag,
    warn_user,
)
from modelprof.render.csvio import SWEEP_WHOLE
from modelprof.runtime.env import collect_env
from modelprof.runtime.group import own_work
from modelprof.runtime.names import unique_name
from modelprof.runtime.progress import NoProgress, progress_bar
from modelprof.timing.agreement import SeriesPoint, neighbour_disagreements

__all__ = ["COUNTED_COLUMNS", "Measure", "check_options", "run_config", "run_sweep"]

#: The counted columns of a sweep row (``profile()``'s totals); equal however the sweep is dealt.
COUNTED_COLUMNS = (*registry.names("count"), *registry.names("step"))
_CONFIG_COLUMNS = ("model", "batch_size", "dtype", "mode", "timing", "device")
#: a row's last columns: who ran it, when and for how long (the only ones the deal changes)
_DEALT_COLUMNS = ("rank", "host", "start_time", "wall_s")


#: ``measure(config, device) -> columns``: what one configuration measures (raises on failure).
Measure = Callable[[SweepConfig, str], Mapping[str, Any]]


def check_options(
    resume: Any, retry_failed: Any, progress: Any, timeout_s: Any, on_config: Any = None
) -> None:
    """A sweep's switches, refused before anything is created or run."""
    for name, value in (("resume", resume), ("retry_failed", retry_failed), ("progress", progress)):
        check_flag(name, value)
    number = not isinstance(timeout_s, bool) and isinstance(timeout_s, (int, float))
    if not number or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ModelProfError(f"timeout_s={timeout_s!r} must be a positive number of seconds")
    check_callback("on_config", on_config)


def run_sweep(
    configs: list[SweepConfig],
    measure: Measure,
    store: ResultStore | None = None,
    *,
    resume: bool = True,
    retry_failed: bool = False,
    progress: bool = False,
    timeout_s: float = 1800.0,
    on_config: Callable[[SweepConfig, dict[str, Any]], None] | None = None,
) -> pd.DataFrame:
    """Run ``measure`` on every configuration, dealt across the ranks; the gathered frame (on
    every rank), each row saved in ``store``; ``attrs["read_back"]``: the configurations any
    rank found done there, not run. The options are ``modelprof.sweep``'s."""
    check_options(resume, retry_failed, progress, timeout_s, on_config)
    if store is not None:
        store.check(configs)
    timed = any(c.timing for c in configs)
    with open_ranks(float(timeout_s), timed=timed) as meeting:
        rank = meeting.ranks.rank
        bar = progress_bar(
            len(configs), enabled=progress and rank == 0, desc="sweep", unit="config"
        )
        try:
            runner = _Runner(
                meeting, measure, store, bar, len(configs), resume, retry_failed, float(timeout_s)
            )
            runner.on_config = on_config
            rows = runner.run(meeting.ranks.mine(configs), timed_anywhere=timed)
            parts = meeting.all_gather({"rows": rows, "read_back": runner.read_back}, "rows")
        finally:
            bar.close()
    frame = _frame(configs, {k: v for part in parts for k, v in part["rows"].items()})
    # every rank's rows found done in ``out`` (rank 0's footer counts them all)
    read_back = {name for part in parts for name in part["read_back"]}
    frame.attrs["read_back"] = [c.name for c in configs if c.name in read_back]
    timed_on = set(frame["device"][frame["timing"].astype(bool)])
    # where it ran, as every JSON export records it (its timed rows' device where they share one)
    frame.attrs["env"] = collect_env(timed_on.pop() if len(timed_on) == 1 else None)
    if store is not None and rank == 0:
        store.write_table(frame)
    return frame


@dataclasses.dataclass
class _Runner:
    """Runs one rank's share: counting first, then the timed configurations."""

    meeting: Any
    measure: Measure
    store: ResultStore | None
    bar: Any
    total: int
    resume: bool
    retry_failed: bool
    timeout_s: float
    on_config: Callable[[SweepConfig, dict[str, Any]], None] | None = None
    #: the configurations found done in ``store`` (an earlier run's rows), not run
    read_back: list[str] = dataclasses.field(default_factory=list)

    def run(self, mine: list[SweepConfig], *, timed_anywhere: bool) -> dict[str, Any]:
        rows = {config.name: self._one(config) for config in mine if not config.timing}
        if timed_anywhere:
            self.meeting.barrier("counted")  # no rank counts while another times
        rows.update({config.name: self._one(config) for config in mine if config.timing})
        self._follow()
        return rows

    def _one(self, config: SweepConfig) -> dict[str, Any]:
        row = self._done(config)
        kept = row is not None
        if row is None:
            row = run_config(config, self.measure, self.meeting.ranks)
            if self.store is not None:
                self.store.save(config, row)
        if kept:
            self.read_back.append(config.name)
        self.meeting.add_done(1)
        self._tick()
        if self.on_config is not None:  # a row read back from an earlier run says so
            self.on_config(config, {**row, "read_back": True} if kept else row)
        return row

    def _done(self, config: SweepConfig) -> dict[str, Any] | None:
        if self.store is None or not self.resume:
            return None
        row = self.store.load(config)
        if row is not None and row.get("status") != "ok" and self.retry_failed:
            return None
        threads = None if row is None else row.get("threads")
        on_cpu = config.timing and torch.device(config.device).type == "cpu"  # (cpu:0 too)
        if on_cpu and threads is not None and threads != torch.get_num_threads():
            return None  # timed at another thread count (--threads): not the timing asked for
        return row

    def _tick(self) -> None:
        """Rank 0's bar: every rank's finished configurations, where the store counts them."""
        done = self.meeting.done()
        if done is not None and done > self.bar.n:
            self.bar.update(min(done, self.total) - self.bar.n)

    def _follow(self) -> None:
        """Rank 0, done with its share, moves its bar with the others' until all are done."""
        if self.meeting.ranks.rank != 0 or isinstance(self.bar, NoProgress):
            return
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            done = self.meeting.done()
            if done is None or done >= self.total:
                break
            self._tick()
            time.sleep(0.2)
        self._tick()


def run_config(
    config: SweepConfig, measure: Measure, ranks: SweepRanks | None = None
) -> dict[str, Any]:
    """One row: ``measure`` on one configuration, with who ran it, when and how long."""
    ranks = ranks or SweepRanks()
    device = _device(config, ranks)
    row: dict[str, Any] = {**{k: getattr(config, k) for k in _CONFIG_COLUMNS}, "device": device}
    if config.options:
        row["options"] = repr(dict(config.options))
    with _device_lock(device) if config.timing else contextlib.nullcontext():
        row["start_time"], start = time.time(), time.perf_counter()
        # this rank's own configuration: its warnings are its row's, whatever rank runs it
        with warnings.catch_warnings(record=True) as caught, own_work():
            warnings.simplefilter("always")
            try:
                got = dict(measure(config, device))
                # a measure may say its row differs from a real device's, and why
                status, error = got.pop("status", "ok"), got.pop("error", "")
                row.update(got, status=status, error=error)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - recorded; the sweep goes on
                row.update(status="error", error=f"{type(e).__name__}: {e}"[:2000])
        row["warnings"] = _warnings_text(caught)
        row.update(rank=ranks.rank, host=ranks.host, wall_s=time.perf_counter() - start)
    return row


def _warnings_text(caught: list[warnings.WarningMessage]) -> str:
    """What a configuration warned, each message once, in one cell, each without the
    ``modelprof:`` some messages open with (the column is modelprof's), so all read alike."""
    said = (str(w.message).removeprefix("modelprof: ") for w in caught)
    return "; ".join(dict.fromkeys(said))[:2000]


def _device(config: SweepConfig, ranks: SweepRanks) -> str:
    """Where the configuration runs: meta when only counted (but under ``amp``),
    ``cuda:LOCAL_RANK`` for cuda."""
    if config.on_meta:
        return "meta"
    if config.device == "cuda":
        return f"cuda:{ranks.local_rank}"
    return config.device


@contextlib.contextmanager
def _device_lock(device: str) -> Iterator[None]:
    """Hold ``device`` alone on this host (an ``flock`` in the temporary folder)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    key = "cpu" if device == "cpu" else _gpu_key(device)
    path = Path(tempfile.gettempdir()) / f"modelprof-sweep-{key}.lock"
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _gpu_key(device: str) -> str:
    """A GPU's identity on the host (its UUID: the index depends on CUDA_VISIBLE_DEVICES)."""
    dev = torch.device(device)
    try:
        return f"{dev.type}-{torch.cuda.get_device_properties(dev).uuid}"
    except Exception:  # noqa: BLE001 - no CUDA here: the index is all there is
        return f"{dev.type}{dev.index or 0}"


def _frame(configs: list[SweepConfig], rows: Mapping[str, Any]) -> pd.DataFrame:
    """One row per configuration, in expansion order, whichever rank ran it, its model named as
    ``profile`` names it (a row read back from an earlier run too), two specs named alike told
    apart as ``compare`` tells its models apart (``nets_wide (2)``)."""
    missing = [c.name for c in configs if c.name not in rows]
    if missing:
        raise ModelProfError(
            f"sweep: no result for {len(missing)} configuration(s), e.g. "
            f"{missing[0]!r}; a rank did not report"
        )
    names: dict[str, str] = {}
    for c in configs:
        if c.model not in names:
            names[c.model] = unique_name(c.model_name, names.values())
    records = [{**rows[c.name], "model": names[c.model], **_input_columns(c)} for c in configs]
    seen = dict.fromkeys(column for record in records for column in record)
    head = [*_CONFIG_COLUMNS, "input_size", "tokens", "input_shape", "status", "error"]
    head += COUNTED_COLUMNS
    tail = ["options", "warnings", *_DEALT_COLUMNS]
    middle = [c for c in seen if c not in head and c not in tail]  # latency columns
    ordered = [c for c in (*head, *middle, *tail) if c in seen]
    frame = pd.DataFrame.from_records(records, columns=ordered)
    for column in ("options", "input_size"):  # a configuration's text: "" where it gave none
        if column in frame.columns:
            frame[column] = frame[column].fillna("")
    for column in SWEEP_WHOLE:  # whole numbers, <NA> where none (read_csv reads them so)
        if column in frame.columns:
            frame[column] = frame[column].astype("Int64")
    for column in frame.columns:  # flags, None where none (an untimed row's latency_stable)
        declared = registry.column(column)
        if declared is not None and declared.dtype == "bool" and frame[column].isna().any():
            frame[column] = registry.flag_column(frame[column])
    for prefix in ("latency", "backward_latency"):
        if f"{prefix}_median_ms" in frame.columns:
            _mark_neighbours(frame, prefix)
    # the marks came last: they go with the latency columns, before the tail (who ran it last)
    last = [c for c in tail if c in frame.columns]
    return frame[[c for c in frame.columns if c not in last] + last]


def _input_columns(config: SweepConfig) -> dict[str, Any]:
    """What tells two grids of one model apart, from the configuration (a result file written
    before these columns were holds neither): its ``input_size`` and ``tokens``, where given."""
    columns: dict[str, Any] = {}
    if config.input_size is not None:
        columns["input_size"] = repr(config.input_size)
    if config.tokens is not None:
        columns["tokens"] = config.tokens
    return columns


def _mark_neighbours(frame: pd.DataFrame, prefix: str) -> None:
    """``{prefix}_rough``: a timed row whose report said its median is no figure to quote
    (``{prefix}_unquotable``, a reason), or above a bigger batch size's of the same model,
    dtype, mode, device, options and input (size or tokens), beyond both intervals (warned
    once, noted in ``attrs["notes"]``)."""
    median, low, high = (frame[f"{prefix}_{k}_ms"] for k in ("median", "ci_low", "ci_high"))
    # rows saved before latency_n was recorded (a resumed sweep) have no count: 0
    n = frame.get(f"{prefix}_n", pd.Series(0, index=frame.index)).fillna(0)
    timed = median.notna()
    why = frame.get(f"{prefix}_unquotable", pd.Series("", index=frame.index))
    frame[f"{prefix}_rough"] = timed & why.fillna("").astype(str).ne("")
    given = ("model", "dtype", "mode", "device", "options", "input_size", "tokens")
    keys = [c for c in given if c in frame.columns]
    for group, rows in frame[timed].groupby(keys, dropna=False, sort=False):
        points = [
            SeriesPoint(
                f"batch {frame.at[i, 'batch_size']}",
                float(frame.at[i, "batch_size"]),
                _Figure(float(median[i]), (float(low[i]), float(high[i])), int(n[i])),
            )
            for i in rows.index
        ]
        name = f"{prefix.replace('_', ' ')} of {group[0]} across batch sizes"
        for d in neighbour_disagreements(name, points):
            i = rows.index[[p.label for p in points].index(d.point)]
            frame.at[i, f"{prefix}_rough"] = True
            frame.attrs.setdefault("notes", []).append(d.note())
            warn_user(f"modelprof: sweep: {d.note()}", TimingDisagreementWarning)


@dataclasses.dataclass(frozen=True)
class _Figure:
    """A sweep row's timed figure, as ``neighbour_disagreements`` reads a Measurement."""

    median_ms: float
    median_ci_ms: tuple[float, float]
    n: int
