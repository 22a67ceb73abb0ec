"""Sweeps: many configurations (models × batch sizes × dtypes × modes) profiled in one call,
dealt across ``torchrun`` ranks or run in one process, gathered into one DataFrame.

- **Dealing.** Configuration ``i`` (in expansion order) belongs to rank ``i % world_size``.
  The deal depends on nothing but the configuration list, so every rank knows its share
  without talking, and a rerun deals the same way.
- **Counting only** (``timing=False``): the model is built on ``meta`` and counted there: no
  weights are allocated or initialised, and ranks never compete for memory.
- **Timed configurations** run after every rank has finished counting (a barrier), each under
  an exclusive lock of its device (a lock file in the host's temporary folder: ``cpu`` for the
  host's cores, one per GPU), so two timings never share a device and no counting runs beside
  them. ``device="cuda"`` means ``cuda:LOCAL_RANK``.
- **Failures** are rows: ``status="error"`` and the message; the sweep goes on.
- **Resume.** With ``out``, every finished configuration is written at once to
  ``out/configs/<name>.json`` (atomically); a rerun skips those, so a killed sweep picks up
  where it stopped. Failed configurations are rerun only with ``retry_failed=True``.
- **One voice.** Every rank returns the gathered frame; only rank 0 shows the progress bar and
  writes ``out/sweep.csv`` and ``out/sweep.json``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from modelprof.distributed.sweep_config import MODES, SweepConfig, load_sweep
from modelprof.distributed.sweep_store import ResultStore
from modelprof.errors import ModelProfError
from modelprof.runtime.progress import progress_bar

__all__ = ["SweepRanks", "sweep"]

#: The counted columns of a sweep row (``profile()``'s totals); equal however the sweep is dealt.
COUNTED_COLUMNS = ("params", "macs", "flops", "madd", "output_bytes", "read_bytes",
                   "write_bytes", "backward_macs", "backward_flops", "saved_bytes")
_CONFIG_COLUMNS = ("model", "batch_size", "dtype", "mode", "timing", "device")


@dataclasses.dataclass(frozen=True)
class SweepRanks:
    """Where this process stands: its rank among ``world_size``, its local rank, its host."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    host: str = dataclasses.field(default_factory=socket.gethostname)

    def mine(self, configs: list[SweepConfig]) -> list[SweepConfig]:
        """This rank's share: configuration ``i`` goes to rank ``i % world_size``."""
        return [c for i, c in enumerate(configs) if i % self.world_size == self.rank]


def sweep(config: Any, out: str | os.PathLike[str] | None = None, *, resume: bool = True,
          retry_failed: bool = False, progress: bool = False,
          timeout_s: float = 1800.0) -> pd.DataFrame:
    """Profile every configuration of ``config``; return one row per configuration.

    ``config`` is a ``.json``/``.toml`` file, a dict (one grid) or a list of dicts: see
    :mod:`modelprof.distributed.sweep_config`. ``out`` is the folder for the per-configuration
    files (what makes a sweep resumable) and the combined ``sweep.csv``/``sweep.json``;
    ``resume=False`` runs everything again. Under ``torchrun`` (``WORLD_SIZE`` > 1) the
    configurations are dealt across the ranks over a gloo group (created here and destroyed
    afterwards unless one is already initialised; ``timeout_s`` bounds its collectives).

    Columns: the configuration (``model, batch_size, dtype, mode, timing, device``),
    ``input_shape``, ``status`` (``ok``/``error``), ``error``, ``warnings``, the counted totals
    (:data:`COUNTED_COLUMNS`), the latency columns (and ``threads``) of timed configurations,
    and ``rank``, ``host``, ``start_time`` (Unix seconds), ``wall_s``: who ran it, when, and for
    how long.
    """
    for name, value in (("resume", resume), ("retry_failed", retry_failed),
                        ("progress", progress)):
        if not isinstance(value, bool):
            raise ModelProfError(f"{name}={value!r} must be True or False")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ModelProfError(f"timeout_s={timeout_s!r} must be a positive number of seconds")
    configs = load_sweep(config)
    store = ResultStore(out) if out is not None else None
    with _process_group(timeout_s) as group:
        ranks = _ranks(group)
        bar = progress_bar(len(configs), enabled=progress and ranks.rank == 0, desc="sweep",
                           unit="config")
        try:
            runner = _Runner(ranks, store, resume=resume, retry_failed=retry_failed, bar=bar,
                             all_configs=configs)
            rows = runner.run(ranks.mine(configs), group,
                              timed_anywhere=any(c.timing for c in configs))
            rows = _gather(rows, group)
            bar.update(len(configs) - bar.n)
        finally:
            bar.close()
    frame = _frame(configs, rows)
    if store is not None and ranks.rank == 0:
        store.write_table(frame)
    return frame


class _Runner:
    """Runs one rank's share: counting first, then the timed configurations, each under its
    device's lock; every finished configuration is saved before the next one starts."""

    def __init__(self, ranks: SweepRanks, store: ResultStore | None, *, resume: bool,
                 retry_failed: bool, bar: Any, all_configs: list[SweepConfig]) -> None:
        self.ranks, self.store, self.bar = ranks, store, bar
        self.resume, self.retry_failed = resume, retry_failed
        self.all_configs = all_configs

    def run(self, mine: list[SweepConfig], group: Any, *, timed_anywhere: bool) -> dict[str, Any]:
        rows: dict[str, Any] = {}
        self._tick(finished=False)
        for config in [c for c in mine if not c.timing]:
            rows[config.name] = self._one(config)
        if timed_anywhere and group is not None:
            _barrier(group)  # no rank counts while another times
        for config in [c for c in mine if c.timing]:
            rows[config.name] = self._one(config)
        return rows

    def _one(self, config: SweepConfig) -> dict[str, Any]:
        row = self._done(config)
        if row is None:
            row = run_config(config, self.ranks)
            if self.store is not None:
                self.store.save(config, row)
        self._tick(finished=True)
        return row

    def _done(self, config: SweepConfig) -> dict[str, Any] | None:
        if self.store is None or not self.resume:
            return None
        row = self.store.load(config)
        if row is not None and row.get("status") != "ok" and self.retry_failed:
            return None
        return row

    def _tick(self, *, finished: bool) -> None:
        """Rank 0's bar: every rank's result files when there is a folder, else its own."""
        if self.ranks.rank != 0:
            return
        if self.store is not None:
            done = self.store.count_done(self.all_configs)
        else:
            done = self.bar.n + int(finished)
        done = min(done, len(self.all_configs))
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)


def run_config(config: SweepConfig, ranks: SweepRanks | None = None) -> dict[str, Any]:
    """Profile one configuration (a timed one holding its device's lock); a failure becomes a
    row with ``status="error"``."""
    ranks = ranks or SweepRanks()
    device = _device(config, ranks)
    with _device_lock(device) if config.timing else contextlib.nullcontext():
        return _run(config, device, ranks)


def _run(config: SweepConfig, device: str, ranks: SweepRanks) -> dict[str, Any]:
    row: dict[str, Any] = {**{k: getattr(config, k) for k in _CONFIG_COLUMNS}, "device": device}
    if config.options:
        row["options"] = repr(dict(config.options))
    row["start_time"], start = time.time(), time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            row.update(_profile_row(config, device))
            row.update(status="ok", error="")
        except (Exception, SystemExit) as e:  # noqa: BLE001 - recorded; the sweep goes on
            row.update(status="error", error=f"{type(e).__name__}: {e}"[:2000])
    row["warnings"] = "; ".join(dict.fromkeys(str(w.message) for w in caught))[:2000]
    row.update(rank=ranks.rank, host=ranks.host, wall_s=time.perf_counter() - start)
    return row


def _profile_row(config: SweepConfig, device: str) -> dict[str, Any]:
    """The totals (and latency) of ``profile()`` on one configuration."""
    from modelprof.profile import profile

    model, size = _build(config.model, on_meta=device == "meta")
    size = config.input_size if config.input_size is not None else size
    report = profile(model, size, batch_size=config.batch_size, device=device,
                     dtype=config.dtype, timing=config.timing, progress=False,
                     **MODES[config.mode], **dict(config.options))
    totals = report.totals
    row: dict[str, Any] = {"input_shape": report.input_shape}
    row.update({c: totals[c] for c in COUNTED_COLUMNS if c in totals})
    if report.latency is not None:
        row["threads"] = report.env.get("torch_num_threads")
        row.update(_latency("latency", report.latency))
    backward = getattr(report, "backward_latency", None)
    if backward is not None:
        row.update(_latency("backward_latency", backward))
    return row


def _latency(prefix: str, m: Any) -> dict[str, Any]:
    low, high = m.median_ci_ms
    return {f"{prefix}_median_ms": m.median_ms, f"{prefix}_ci_low_ms": low,
            f"{prefix}_ci_high_ms": high, f"{prefix}_p90_ms": m.p90_ms,
            f"{prefix}_std_ms": m.std_ms, f"{prefix}_stable": m.stable}


def _build(spec: str, *, on_meta: bool) -> tuple[torch.nn.Module, Any]:
    """The model of ``spec`` with its default input size, built on meta when only counted
    (a model whose construction needs real values falls back to the CPU; profile() then
    counts a meta copy)."""
    from modelprof.models import load_model

    if on_meta:
        try:
            with torch.device("meta"):
                model, _, size = load_model(spec)
            return model, size
        except Exception:  # noqa: BLE001 - e.g. an init that reads a value: build it on the CPU
            pass  # (a spec that is wrong fails again below, with its own message)
    model, _, size = load_model(spec)
    return model, size


def _device(config: SweepConfig, ranks: SweepRanks) -> str:
    """Where the configuration runs: meta when only counted, ``cuda:LOCAL_RANK`` for
    ``cuda``."""
    if not config.timing:
        return "meta"
    if config.device == "cuda":
        return f"cuda:{ranks.local_rank}"
    return config.device


@contextlib.contextmanager
def _device_lock(device: str) -> Iterator[None]:
    """Hold ``device`` alone on this host while timing (an ``flock`` on a lock file in the
    temporary folder, shared by every modelprof sweep of the host; none where ``fcntl`` is
    missing)."""
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


# --- ranks and collectives -------------------------------------------------------------------

def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ModelProfError(f"environment variable {name}={value!r} is not an integer") from None


@contextlib.contextmanager
def _process_group(timeout_s: float) -> Iterator[Any]:
    """The group to deal over: the initialised one (a gloo subgroup when its backend is not
    gloo), one created from torchrun's environment (destroyed on exit), or None alone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "gloo":
            yield dist.group.WORLD
        else:
            yield dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        return
    if _env_int("WORLD_SIZE", 1) <= 1:
        yield None
        return
    if not dist.is_available():
        raise ModelProfError("WORLD_SIZE > 1, but this torch has no torch.distributed")
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _ranks(group: Any) -> SweepRanks:
    if group is None:
        return SweepRanks(local_rank=_env_int("LOCAL_RANK", 0))
    import torch.distributed as dist

    return SweepRanks(rank=dist.get_rank(group), world_size=dist.get_world_size(group),
                      local_rank=_env_int("LOCAL_RANK", 0))


def _barrier(group: Any) -> None:
    import torch.distributed as dist

    dist.barrier(group=group)


def _gather(rows: dict[str, Any], group: Any) -> dict[str, Any]:
    """Every rank's rows, on every rank (one small all-gather of plain dicts)."""
    if group is None:
        return rows
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, rows, group=group)
    merged: dict[str, Any] = {}
    for part in gathered:
        merged.update(part)
    return merged


def _frame(configs: list[SweepConfig], rows: Mapping[str, Any]) -> pd.DataFrame:
    """One row per configuration, in expansion order, whichever rank ran it."""
    missing = [c.name for c in configs if c.name not in rows]
    if missing:
        raise ModelProfError(f"sweep: no result for {len(missing)} configuration(s), e.g. "
                             f"{missing[0]!r}; a rank did not report")
    records = [rows[c.name] for c in configs]
    seen: dict[str, None] = {}
    for record in records:
        seen.update(dict.fromkeys(record))
    head = [*_CONFIG_COLUMNS, "input_shape", "status", "error", *COUNTED_COLUMNS]
    tail = ["options", "warnings", "rank", "host", "start_time", "wall_s"]
    middle = [c for c in seen if c not in head and c not in tail]  # latency columns
    ordered = [c for c in (*head, *middle, *tail) if c in seen]
    frame = pd.DataFrame.from_records(records, columns=ordered)
    for column in COUNTED_COLUMNS:  # whole numbers, missing where a row has none (<NA>)
        if column in frame.columns:
            frame[column] = frame[column].astype("Int64")
    return frame
