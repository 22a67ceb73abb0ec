"""``TimingOptions``: every timing option, parsed and checked once at the boundary; every timing
entry point takes the same keyword options (or a ``TimingOptions``) and hands the parsed object
down, so no pass can disagree with another about them.

| option | meaning |
| --- | --- |
| ``warmup``, ``warmup_s`` | exact warm-up calls, or (``None``) >= 3 calls and >= ``warmup_s`` s |
| ``repeat`` | exactly this many samples (no adaptive stop) |
| ``precision``, ``budget_s`` | stop when the median's 95 % interval is within ±precision, or after budget_s s of sampling |
| ``min_samples``, ``min_blocks``, ``max_samples`` | bounds of the adaptive stop |
| ``amp`` | autocast dtype (float16/bfloat16), in every pass, the static one included |
| ``channels_last`` | 4-D inputs and weights in channels_last, in every pass |
| ``compile`` | ``torch.compile`` the end-to-end run (per-layer passes stay eager, and say so) |
| ``cuda_graph`` | replay a captured CUDA graph end to end (per-layer passes stay eager, and say so) |
| ``transfer``, ``pin_memory`` | end to end including H2D/D2H copies, reported separately (CUDA) |
| ``cold_cache`` | flush L2/LLC between samples (untimed) |
| ``clock`` | ``"auto"`` (CUDA events; on the CPU perf_counter, CPU time read beside it), ``"host"`` (synchronize + host clock) or ``"cpu"`` (CPU time of the work: thread for one intra-op thread, process for several; CPU only) |
| ``correct_overhead`` | subtract the measured cost of the per-layer hooks (and a backward's stamps) from layer times |
| ``warn``, ``progress`` | the timing's warnings: one per noisy/drifting/undersampled measurement, and windows or ratios that disagree (their notes are kept either way); a progress bar |
| ``seed`` | the seed of the interleaving order (``None``: fresh each run) |
| ``per_layer`` | ``"auto"`` (kernel time on CUDA, host stamps on the CPU), ``"stamps"`` (host stamps / event pairs per call, hook cost corrected) or ``"kernels"`` (``torch.profiler`` ranges per call, kernel time charged by correlation id: ``modelprof.timing.kernels``) |
| ``latency_mode`` | ``"latency"`` (each sample starts on an idle device: a synchronize after every call) or ``"pipelined"`` (calls back to back, one event pair per group of calls: the time per call of a full stream, and its throughput) |
| ``floor_extend_s`` | a budget that stopped below ``min_samples`` goes on, one run per block, for at most this many s (``None``: 30; per candidate when interleaved); 0: never |
| ``layer_extend_s`` | per-layer passes a budget stopped below ``min_samples`` go on, one at a time, for at most this many s (30); rows still short are marked rough |
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from modelprof.errors import (
    ModelProfError,
    ModelProfWarning,
    check_flag,
    nearest_keywords,
    warn_user,
)
from modelprof.runtime.env import collect_env
from modelprof.runtime.execution import RunMode
from modelprof.timing.clock import check_clock
from modelprof.timing.modes import parse_compile
from modelprof.timing.sampler import StopRule, WarmupPolicy, check_seconds

__all__ = [
    "CLOCK_MODES",
    "DEFAULT_LAYER_EXTEND_S",
    "OPTION_NAMES",
    "TimingOptions",
    "check_option_names",
    "keyword_names",
    "warn_unused_without_timing",
]

#: The most seconds the per-layer passes are extended by to reach ``min_samples``.
DEFAULT_LAYER_EXTEND_S = 30.0

CLOCK_MODES = ("auto", "host", "cpu")
PER_LAYER_MODES = ("auto", "stamps", "kernels")
LATENCY_MODES = ("latency", "pipelined")
_MODES = {"clock": CLOCK_MODES, "per_layer": PER_LAYER_MODES, "latency_mode": LATENCY_MODES}

#: The keyword names every timing entry point accepts (defaults: ``TimingOptions().as_kwargs()``).
OPTION_NAMES = tuple(
    "warmup warmup_s repeat precision budget_s min_samples min_blocks max_samples transfer "
    "pin_memory cuda_graph amp channels_last cold_cache compile compile_kwargs clock "
    "correct_overhead warn progress seed layer_extend_s per_layer latency_mode "
    "floor_extend_s".split()
)
#: the switches, True or False (``channels_last`` too, which the run mode carries)
_FLAGS = "transfer pin_memory cuda_graph cold_cache correct_overhead warn progress".split()
#: the options a TimingOptions keeps as given, once checked
_AS_GIVEN = (*_FLAGS, "clock", "seed", "per_layer", "latency_mode")
#: the options ``StopRule.parse`` takes, by its fields' names
_STOP_OPTIONS = tuple(f.name for f in dataclasses.fields(StopRule) if f.name in OPTION_NAMES)


#: other tools' names for what profile() takes otherwise (torchinfo, ptflops, thop)
_PEER_NAMES = {"input_data": "inputs", "input_res": "input_size", "input_shape": "input_size"}


def keyword_names(function: Callable[..., Any]) -> list[str]:
    """The keywords ``function`` takes by name (not its ``*args``/``**kwargs``): the ``own``
    names of :func:`check_option_names`."""
    kinds = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    return [p.name for p in inspect.signature(function).parameters.values() if p.kind not in kinds]


def check_option_names(kwargs: Mapping[str, Any], own: Iterable[str] = ()) -> None:
    """Refuse keywords that are no timing option, naming the nearest name (among the options
    and ``own``, the keywords of the function they were passed to) for a misspelt one."""
    unknown = sorted(set(kwargs) - set(OPTION_NAMES))
    if not unknown:
        return
    peers = [f"{k}= is {_PEER_NAMES[k]}= here; " for k in unknown if k in _PEER_NAMES]
    names = sorted({*OPTION_NAMES, *own})
    near = nearest_keywords([k for k in unknown if k not in _PEER_NAMES], names)
    # beside a function's own keywords, a misspelling may be of either: not "timing" alone
    what = "keyword(s)" if own else "timing option(s)"
    raise ModelProfError(
        "".join(peers) + f"unknown {what} {unknown}{near}; the timing "
        f"options are {sorted(OPTION_NAMES)}"
    )


#: the options a run that times nothing still reads: the counted pass's autocast and layout,
#: its progress bar and its warnings
_UNTIMED_OPTIONS = ("amp", "channels_last", "progress", "warn")


def warn_unused_without_timing(kwargs: Mapping[str, Any]) -> None:
    """Warn of the timing options in ``kwargs`` a run without timing does not use (a
    ``budget_s=`` beside ``timing=False`` would otherwise pass in silence)."""
    unused = [k for k in kwargs if k in OPTION_NAMES and k not in _UNTIMED_OPTIONS]
    if unused:
        given = ", ".join(f"{k}={kwargs[k]!r}" for k in unused)
        verb = "is" if len(unused) == 1 else "are"
        warn_user(
            f"modelprof: timing=False, so {given} {verb} ignored (timing options; nothing is "
            "timed)",
            ModelProfWarning,
        )


@dataclasses.dataclass(frozen=True)
class TimingOptions:
    """The parsed timing options (see the module docstring for each one)."""

    warmup: WarmupPolicy = WarmupPolicy()
    stop: StopRule = StopRule()
    transfer: bool = False
    pin_memory: bool = True
    cuda_graph: bool = False
    #: autocast and layout: carried by the run mode (``amp``, ``channels_last`` read from it)
    run: RunMode = RunMode()
    cold_cache: bool = False
    compile: str | None = None
    compile_kwargs: dict[str, Any] | None = dataclasses.field(default=None, compare=False)
    clock: str = "auto"
    correct_overhead: bool = True
    warn: bool = True
    progress: bool = False
    seed: int | None = None
    layer_extend_s: float = DEFAULT_LAYER_EXTEND_S
    per_layer: str = "auto"
    latency_mode: str = "latency"

    @classmethod
    def parse(cls, options: TimingOptions | None = None, **kwargs: Any) -> TimingOptions:
        """``options`` (or the defaults) updated by keyword options; unknown names, bad values
        and contradictions raise ``ModelProfError`` naming them."""
        if options is not None and not isinstance(options, TimingOptions):
            raise ModelProfError(f"options={options!r} must be a modelprof TimingOptions")
        check_option_names(kwargs)
        values = (TimingOptions() if options is None else options).as_kwargs()
        values.update(kwargs)
        for name, allowed in _MODES.items():
            if values[name] not in allowed:
                off = name == "per_layer" and values[name] in (False, None)
                why = off * (
                    "; it picks how to time layers (profile_generation's layer_timing=False "
                    "times none)"
                )
                raise ModelProfError(f"{name}={values[name]!r} must be one of {allowed}{why}")
        if values["latency_mode"] == "pipelined" and values["transfer"]:
            raise ModelProfError(
                "latency_mode='pipelined' with transfer=True: a pipelined stream overlaps the "
                "copies with compute, so the three parts cannot be told apart; use one or the "
                "other"
            )
        compile_kwargs = values["compile_kwargs"]
        if compile_kwargs is not None and not isinstance(compile_kwargs, dict):
            raise ModelProfError(f"compile_kwargs={compile_kwargs!r} must be a dict or None")
        seed = values["seed"]  # (numpy's generators take none below 0)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ModelProfError(f"seed={seed!r} must be an int >= 0 or None")
        for name in (*_FLAGS, "channels_last"):
            check_flag(name, values[name])
        compile_mode = parse_compile(values["compile"])
        if values["cuda_graph"] and compile_mode is not None:
            raise ModelProfError(
                f"cuda_graph=True with compile={values['compile']!r}: use "
                "compile='reduce-overhead' for compiled CUDA graphs instead"
            )
        never = "never extend the per-layer passes"
        return cls(
            warmup=WarmupPolicy.parse(values["warmup"], values["warmup_s"]),
            stop=StopRule.parse(**{name: values[name] for name in _STOP_OPTIONS}),
            run=RunMode.parse(amp=values["amp"], channels_last=values["channels_last"]),
            compile=compile_mode,
            compile_kwargs=dict(compile_kwargs) if compile_kwargs else None,
            layer_extend_s=check_seconds("layer_extend_s", values["layer_extend_s"], True, never),
            **{name: values[name] for name in _AS_GIVEN},
        )

    @property
    def amp(self) -> torch.dtype | None:
        """The autocast dtype of every pass (the run mode's)."""
        return self.run.amp

    @property
    def channels_last(self) -> bool:
        """4-D inputs and weights in channels_last in every pass (the run mode's layout)."""
        return self.run.memory_format is torch.channels_last

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword form (``TimingOptions.parse(**o.as_kwargs()) == o``)."""
        nested = {
            **dataclasses.asdict(self.stop),
            "warmup": self.warmup.count,
            "warmup_s": self.warmup.seconds,
            "compile": self.compile or False,
        }
        return {n: nested[n] if n in nested else getattr(self, n) for n in OPTION_NAMES}

    def replace(self, **kwargs: Any) -> TimingOptions:
        """A copy with some keyword options changed (checked like ``parse``)."""
        return TimingOptions.parse(self, **kwargs)

    def check_device(self, device: torch.device) -> None:
        """Modes that need CUDA refuse other devices, the CPU clock any but the CPU."""
        check_clock(self.clock, device)
        if device.type == "cuda":
            return
        for name in ("transfer", "cuda_graph"):
            if getattr(self, name):
                raise ModelProfError(
                    f"{name}=True needs a CUDA device, but the model runs on {device}; "
                    f"pass device='cuda' (with a GPU) or leave {name} off"
                )

    def layer_instrument(self, device: torch.device) -> str:
        """``"kernels"`` or ``"stamps"``: what times the layers on ``device``."""
        if self.per_layer != "auto":
            return self.per_layer
        return "kernels" if device.type == "cuda" else "stamps"

    @property
    def end_to_end_only(self) -> tuple[str, ...]:
        """The modes the per-layer hooks cannot see into (they time the eager model instead)."""
        modes = {f"compile={self.compile!r}": self.compile is not None}
        modes.update(cuda_graph=self.cuda_graph, transfer=self.transfer)
        return tuple(mode for mode, on in modes.items() if on)

    def env(self, inputs: Any, clock: str, **mode_flags: Any) -> dict[str, Any]:
        """``collect_env`` of a run timed on ``inputs`` (a ``ModelInputs``) by ``clock``."""
        return collect_env(
            inputs.device,
            dtype=self.amp or inputs.dtype,
            batch_size=inputs.batch_size,
            clock=clock,
            **mode_flags,
        )

    def flags(self, *, eval_mode: bool = True, no_grad: bool = True) -> dict[str, Any]:
        """The mode flags of a timed run: part of the warm-up signature and of ``env["mode"]``."""
        return dict(
            transfer=self.transfer,
            pin_memory=self.pin_memory if self.transfer else None,
            cuda_graph=self.cuda_graph,
            amp=self.amp,
            channels_last=self.channels_last,
            cold_cache=self.cold_cache,
            compile=self.compile,
            eval_mode=bool(eval_mode),
            no_grad=bool(no_grad),
        )
