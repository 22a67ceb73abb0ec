"""``sweep``: ``profile()`` over many configurations (models × batch sizes × dtypes × modes),
in one process or across ``torchrun`` ranks, into one resumable DataFrame; this module is what
one configuration measures (the format: ``distributed.sweep_config``, the run: ``.sweep``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd
import torch

from modelprof.distributed.sweep import COUNTED_COLUMNS, check_options, run_sweep
from modelprof.distributed.sweep_config import MODES, STEP_OPTIONS, SweepConfig, load_sweep
from modelprof.distributed.sweep_store import ResultStore
from modelprof.errors import ModelProfError, keywords_named
from modelprof.models import load_model
from modelprof.profile import profile
from modelprof.render.csvio import to_csv
from modelprof.render.jsonio import to_json
from modelprof.runtime.execution import RunMode
from modelprof.runtime.inputs import parse_device, token_inputs
from modelprof.step.spec import StepSpec, functional_loss, refuse_eager_only
from modelprof.timing.interleave import interval_columns
from modelprof.timing.options import OPTION_NAMES, TimingOptions

__all__ = ["check_config", "measure_config", "profile_keywords", "profile_options", "sweep"]


@keywords_named
def sweep(
    config: Any,
    out: str | os.PathLike[str] | None = None,
    *,
    resume: bool = True,
    retry_failed: bool = False,
    progress: bool = False,
    timeout_s: float = 1800.0,
    on_config: Callable[[SweepConfig, dict[str, Any]], None] | None = None,
) -> pd.DataFrame:
    """Profile every configuration of ``config``; return one row per configuration.

    ``config``: a ``.json``/``.toml`` file, a dict (one grid) or a list of dicts
    (:mod:`modelprof.distributed.sweep_config`). Counting-only configurations run on ``meta``
    (under ``amp``, on their ``device``); timed ones after all counting, one at a time per
    device. ``out``: the folder of the
    per-configuration files (what makes a sweep resumable) and ``sweep.csv``/``sweep.json``;
    ``resume=False`` runs everything again, ``retry_failed=True`` the failed configurations.
    Under ``torchrun`` configuration ``i`` runs on rank ``i % WORLD_SIZE`` and ``timeout_s``
    bounds every wait for another rank; every rank returns the whole frame, rank 0 alone shows
    the progress bar. ``on_config`` gets each configuration this rank finished (or found done)
    and its row (one found done in ``out``, an earlier run's, with ``read_back=True``).

    Columns: the configuration (with ``input_size`` and ``tokens`` where a grid gives them),
    ``input_shape``, ``status`` (``ok``/``error``), ``error``, the
    counted totals (``params, macs, flops, madd, output_bytes, read_bytes, write_bytes``; in
    backward mode ``backward_macs, backward_flops, saved_bytes``; whole numbers, ``<NA>`` where
    a row has none), the latency columns (and ``threads``) of timed configurations
    (``latency_rough``: no figure to quote, where its report marks its end-to-end median ``~``
    (``latency_unquotable`` says why: a loaded machine, too few runs, the clean runs slowed,
    then quote ``root_latency_ms``, the ``(root)`` row's per-layer median) or
    above a bigger batch size's of the same model, dtype, mode, device, options and input,
    beyond both intervals; ``latency_stable``: the clean runs did not drift, whether rough or
    not; ``latency_loaded``: other work on the machine
    stretched it, and then ``cpu_work_median_ms``, the CPU work its warning says to quote
    where it does, NaN otherwise), ``options``, ``warnings`` (what ``profile()`` warned), and
    ``rank``, ``host``, ``start_time`` (Unix seconds), ``wall_s``; ``attrs["env"]``: the
    environment it ran in (``sweep.json`` holds it); ``attrs["read_back"]``: the names of the
    configurations found done in ``out`` (by any rank), in order.
    """
    configs = load_sweep(config, options=profile_keywords(), check=check_config)
    check_options(resume, retry_failed, progress, timeout_s, on_config)
    store = ResultStore(out, to_csv, to_json) if out is not None else None
    return run_sweep(
        configs,
        measure_config,
        store,
        resume=resume,
        retry_failed=retry_failed,
        progress=progress,
        timeout_s=timeout_s,
        on_config=on_config,
    )


def profile_keywords() -> set[str]:
    """The keywords ``profile()`` takes, timing options included (a grid's ``options``)."""
    return set(inspect.signature(profile).parameters) | set(OPTION_NAMES)


def check_config(config: SweepConfig) -> None:
    """Refuse, before anything runs, what ``profile()`` would refuse of one configuration, with
    its parsers and messages: the timing options, the train switches, the training step's
    options (backward mode), the device it runs on (timed, or counted under ``amp``) and what
    its timing needs there."""
    options = dict(config.options)
    opts = TimingOptions.parse(**{k: v for k, v in options.items() if k in OPTION_NAMES})
    backward = bool(MODES[config.mode].get("backward"))
    switches = {k: options[k] for k in ("training", "no_grad") if k in options}
    RunMode.parse(backward=backward, amp=opts.amp, **switches)
    if backward:
        refuse_eager_only(opts)
        step = profile_options(config, "meta")
        StepSpec.parse(**{k: step[k] for k in STEP_OPTIONS if k in step})
    if not config.on_meta:
        device = parse_device(config.device)  # (its local rank's index is torchrun's)
        if config.timing and device is not None:
            opts.check_device(device)


def measure_config(config: SweepConfig, device: str) -> dict[str, Any]:
    """The totals (and latency) of ``profile()`` on one configuration, on ``device``."""
    model, _, size = _build(config.model, on_meta=device == "meta")
    size = config.input_size if config.input_size is not None else size
    fed: dict[str, Any] = {"input_size": size, "batch_size": config.batch_size}
    if config.tokens is not None:  # a language model: token ids of that length
        fed = {"inputs": token_inputs(model, config.tokens, config.batch_size, device=device)}
    report = profile(
        model,
        **fed,
        device=device,
        dtype=config.dtype,
        timing=config.timing,
        progress=False,
        **MODES[config.mode],
        **profile_options(config, device),
    )
    totals = report.totals
    row: dict[str, Any] = {"input_shape": report.input_shape}
    if report.caught_on_meta:  # maybe not the branch a real device takes
        row["status"] = "differs"
        row["error"] = (
            "on meta the forward caught an op that raised there and took another branch: "
            + "; ".join(report.caught_on_meta)
        )[:2000]
    row.update({c: totals[c] for c in COUNTED_COLUMNS if c in totals})
    if report.latency is not None:
        row["threads"] = report.env.get("torch_num_threads")
        row.update(_latency("latency", report.latency))
        # why the report marks its end-to-end median ~ (no figure to quote), "" where it is one
        row["latency_unquotable"] = report.latency_unquotable or ""
        if report.layer_timing is not None:  # what that reason may say to quote, as a number
            root = (r.latency_ms for r in report.rows if r.module == "" and r.depth == 0)
            row["root_latency_ms"] = next(root, float("nan"))
    if report.backward_latency is not None:
        row.update(_latency("backward_latency", report.backward_latency))
        row["backward_latency_unquotable"] = report.backward_latency_unquotable or ""
        phases = report.training_step.timing.phases()  # the whole step, and its optimizer's
        for name in ("optimizer", "step"):
            if name in phases:
                row.update(interval_columns(f"{name}_latency", phases[name]))
    return row


def profile_options(config: SweepConfig, device: str) -> dict[str, Any]:
    """``config``'s options as ``profile()`` takes them: ``loss_fn``, a name, as the
    ``torch.nn.functional`` loss it names; ``target``, one sample's (a class index, a number,
    a list), repeated over the batch on ``device`` (floats in the configuration's dtype)."""
    options = dict(config.options)
    if "loss_fn" in options:
        options["loss_fn"] = functional_loss(options["loss_fn"])
    if "target" in options:
        options["target"] = _target(options["target"], config, device)
    return options


def _target(value: Any, config: SweepConfig, device: str) -> torch.Tensor:
    try:
        one = torch.tensor(value)  # (a list is stored as a tuple: the same tensor)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ModelProfError(
            f"target={value!r} is not one sample's target (a class index, a number or a list "
            f"of numbers, repeated over the batch): {e}"
        ) from e
    if one.is_floating_point():
        one = one.to(getattr(torch, config.dtype))
    return one.to(device).expand(config.batch_size, *one.shape).contiguous()


def _latency(prefix: str, m: Any) -> Mapping[str, Any]:
    cpu = getattr(m, "cpu", None)  # what a loaded row's warning says to quote
    return {
        **interval_columns(prefix, m),
        f"{prefix}_p90_ms": m.p90_ms,
        f"{prefix}_std_ms": m.std_ms,
        f"{prefix}_stable": m.stable,
        f"{prefix}_loaded": m.loaded,  # other work on the machine stretched it: time again
        f"{prefix}_n": m.n,
        prefix.replace("latency", "cpu_work") + "_median_ms": (
            cpu.median_ms if cpu is not None and m.loaded and m.cpu_holds else float("nan")
        ),
    }


def _build(spec: str, *, on_meta: bool) -> tuple[torch.nn.Module, str, Any]:
    """``load_model(spec)``, built on meta when ``on_meta`` (else, or when that fails, on the
    CPU: profile takes a meta copy, and a bad spec fails there)."""
    if on_meta:
        with contextlib.suppress(Exception), torch.device("meta"):
            return load_model(spec)
    return load_model(spec)
