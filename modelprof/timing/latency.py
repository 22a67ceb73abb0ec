"""``measure_latency``: end-to-end latency of any callable, by the recipe of ``sampler`` and the
clock of ``clock``."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from ..env import collect_env
from ..errors import ModelProfError
from ..inputs import (ModelInputs, map_tensors, iter_tensors, make_inputs, model_placement,
                      moved_model, parse_device, parse_dtype)
from .clock import clock_for, device_synchronize
from .measurement import Measurement
from .modes import (CacheFlusher, amp_context, capture_cuda_graph, compile_callable,
                    grad_context, model_state, parse_amp, parse_compile, to_channels_last)
from .sampler import (DEFAULT_BUDGET_S, DEFAULT_MAX_SAMPLES, DEFAULT_MIN_SAMPLES,
                      DEFAULT_PRECISION, WARMED, WARMUP_S, StopRule, WarmupPolicy, collect,
                      input_signature, warm_up)

__all__ = ["measure_latency", "resolve_call", "timing_flags"]

CLOCK_MODES = ("auto", "host")


def _needs_cuda(option: str, value: Any, device: torch.device) -> None:
    if device.type != "cuda":
        raise ModelProfError(
            f"{option}={value!r} needs a CUDA device, but the model runs on {device}; "
            f"pass device='cuda' (with a GPU) or leave {option} off")


def _has_tensors(model: nn.Module) -> bool:
    return next(iter((*model.parameters(), *model.buffers())), None) is not None


def _input_device(inputs: Any) -> torch.device | None:
    first = next(iter_tensors(inputs), None) if inputs is not None else None
    return first.device if first is not None else None


def resolve_call(fn_or_model: Any, inputs: Any = None, *, input_size: Any = None,
                 batch_size: int | None = None, device: Any = None, dtype: Any = None,
                 channels_last: bool = False) -> tuple[Callable[..., Any], ModelInputs]:
    """The object to call (the user's, or a converted copy of a module) and its inputs.

    The device is ``device``, else the module's, else the device of the given tensors, else CPU.
    """
    if not callable(fn_or_model):
        raise ModelProfError(f"fn_or_model={type(fn_or_model).__name__} is not callable")
    dev = parse_device(device)
    given = inputs if isinstance(inputs, ModelInputs) else None
    if given is not None:  # already normalised (by profile): used as they are
        if input_size is not None:
            raise ModelProfError("pass either ModelInputs or input_size, not both")
        dev = dev or given.device
    is_module = isinstance(fn_or_model, nn.Module)
    if dev is None:
        if is_module and _has_tensors(fn_or_model):
            dev = model_placement(fn_or_model)[0]
        else:
            dev = _input_device(inputs) or torch.device("cpu")
    target: Callable[..., Any] = fn_or_model
    if is_module:
        fmt = torch.channels_last if channels_last else None
        target = moved_model(fn_or_model, dev, parse_dtype(dtype), memory_format=fmt)
    if given is not None:
        dt = parse_dtype(dtype)

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=dev, dtype=dt if dt is not None and t.is_floating_point() else None)
        mi = ModelInputs(map_tensors(given.args, move), map_tensors(given.kwargs, move), dev,
                         dt or given.dtype, batch_size or given.batch_size)
    elif inputs is None and input_size is None:  # a closure over its own data: call with nothing
        mi = ModelInputs((), {}, dev, parse_dtype(dtype) or torch.get_default_dtype(),
                         batch_size or 1)
    else:
        mi = make_inputs(target if is_module else fn_or_model, input_size, inputs=inputs,
                         batch_size=batch_size, device=dev, dtype=dtype)
    if channels_last:
        mi = ModelInputs(to_channels_last(mi.args), to_channels_last(mi.kwargs), mi.device,
                         mi.dtype, mi.batch_size)
    return target, mi


def timing_flags(*, transfer: bool = False, pin_memory: bool = True, cuda_graph: bool = False,
                 amp: torch.dtype | None = None, channels_last: bool = False,
                 cold_cache: bool = False, compile: str | None = None, eval_mode: bool = True,
                 no_grad: bool = True) -> dict[str, Any]:
    """The mode flags of a timed run: part of the warm-up signature and of ``env["mode"]``."""
    return dict(transfer=bool(transfer), pin_memory=bool(pin_memory) if transfer else None,
                cuda_graph=bool(cuda_graph), amp=amp, channels_last=bool(channels_last),
                cold_cache=bool(cold_cache), compile=compile, eval_mode=bool(eval_mode),
                no_grad=bool(no_grad))


def _label(fn: Any) -> str:
    if isinstance(fn, nn.Module):
        return type(getattr(fn, "_orig_mod", fn)).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


class _Transfer:
    """H2D copy of the inputs from host buffers, compute, D2H copy of the outputs to host
    buffers (pinned when ``pin``); all buffers allocated once, before timing."""

    def __init__(self, mi: ModelInputs, call: Callable[[], Any], pin: bool) -> None:
        def host(t: torch.Tensor) -> torch.Tensor:
            h = t.detach().to("cpu", copy=True)
            return h.pin_memory() if pin else h
        self.pin = pin
        host_inputs = map_tensors((mi.args, mi.kwargs), host)
        self.pairs = list(zip(iter_tensors(host_inputs), iter_tensors((mi.args, mi.kwargs))))
        self.call = call
        self.out: Any = None
        self.out_host: list[torch.Tensor] | None = None

    def h2d(self) -> None:
        for h, d in self.pairs:
            d.copy_(h, non_blocking=self.pin)

    def compute(self) -> None:
        self.out = self.call()

    def d2h(self) -> None:
        outs = [t for t in iter_tensors(self.out) if t.device.type != "cpu"]
        if self.out_host is None:
            self.out_host = [torch.empty(t.shape, dtype=t.dtype, device="cpu",
                                         pin_memory=self.pin) for t in outs]
        for h, d in zip(self.out_host, outs):
            h.copy_(d, non_blocking=self.pin)

    def step(self) -> None:
        self.h2d()
        self.compute()
        self.d2h()


def measure_latency(
    fn_or_model: Callable[..., Any],
    inputs: Any = None,
    *,
    input_size: Any = None,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    warmup: int | None = None,
    warmup_s: float = WARMUP_S,
    repeat: int | None = None,
    precision: float = DEFAULT_PRECISION,
    budget_s: float = DEFAULT_BUDGET_S,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    transfer: bool = False,
    pin_memory: bool = True,
    cuda_graph: bool = False,
    amp: torch.dtype | str | None = None,
    channels_last: bool = False,
    cold_cache: bool = False,
    compile: bool | str = False,
    compile_kwargs: dict[str, Any] | None = None,
    eval_mode: bool = True,
    no_grad: bool = True,
    clock: str = "auto",
    label: str | None = None,
    warn: bool = True,
) -> Measurement:
    """Time ``fn_or_model(*args, **kwargs)`` end to end and return every sample.

    ``inputs``: a tensor (the one argument), a tuple (positional arguments) or a dict (keyword
    arguments); or ``input_size`` (batch excluded) + ``batch_size`` for random inputs; or neither
    for a callable that takes no arguments. A module runs under ``eval()`` and ``no_grad`` unless
    ``eval_mode``/``no_grad`` say otherwise; its flags are restored afterwards.

    Warm-up: ``warmup=None`` runs >= 3 calls and >= ``warmup_s`` seconds (a short refresher for a
    callable/shape already warmed); ``warmup=N`` exactly N calls. Sampling: ``repeat=N`` exactly N
    samples; else until the 95 % CI of the median is within ``±precision`` (after ``min_samples``),
    within ``budget_s`` seconds of sampling and ``max_samples`` samples.

    Modes: ``transfer`` (CUDA: time H2D + compute + D2H, parts reported; host inputs pinned when
    ``pin_memory``), ``cuda_graph`` (capture once, time replays), ``amp`` (autocast dtype),
    ``channels_last`` (on a converted copy), ``cold_cache`` (flush L2/LLC between samples, untimed),
    ``compile`` (``True`` or a torch.compile mode; compile time = first call, in ``compile_ms``).
    ``clock="host"`` on CUDA uses synchronize + host clock for work on streams torch cannot see.
    """
    t_begin = time.perf_counter()
    warmup_policy = WarmupPolicy.parse(warmup, warmup_s)
    rule = StopRule.parse(repeat, precision, budget_s, min_samples, max_samples)
    amp_dtype = parse_amp(amp)
    compile_mode = parse_compile(compile)
    if clock not in CLOCK_MODES:
        raise ModelProfError(f"clock={clock!r} must be one of {CLOCK_MODES}")
    target, mi = resolve_call(fn_or_model, inputs, input_size=input_size, batch_size=batch_size,
                              device=device, dtype=dtype, channels_last=channels_last)
    dev = mi.device
    if transfer:
        _needs_cuda("transfer", transfer, dev)
    if cuda_graph:
        _needs_cuda("cuda_graph", cuda_graph, dev)
        if compile_mode is not None:
            raise ModelProfError(f"cuda_graph=True with compile={compile!r}: use "
                                 "compile='reduce-overhead' for compiled CUDA graphs instead")
    flags = timing_flags(transfer=transfer, pin_memory=pin_memory, cuda_graph=cuda_graph,
                         amp=amp_dtype, channels_last=channels_last, cold_cache=cold_cache,
                         compile=compile_mode, eval_mode=eval_mode, no_grad=no_grad)
    signature = input_signature(mi.args, mi.kwargs, device=str(dev), **flags)
    # A fresh converted copy or a freshly compiled wrapper has never been warmed.
    already_warm = (target is fn_or_model and compile_mode is None
                    and WARMED.seen(fn_or_model, signature))
    tclock = clock_for(dev, clock)
    args, kwargs = mi.args, mi.kwargs
    compile_ms: float | None = None

    with contextlib.ExitStack() as stack:
        if dev.type == "cuda":
            stack.enter_context(torch.cuda.device(dev))
        stack.enter_context(model_state(target, eval_mode))
        stack.enter_context(grad_context(no_grad))
        stack.enter_context(amp_context(dev, amp_dtype, cache_enabled=not cuda_graph))

        fn = target
        if compile_mode is not None:
            fn = compile_callable(target, compile_mode, compile_kwargs)
            device_synchronize(dev)
            t0 = time.perf_counter()
            fn(*args, **kwargs)                 # the first call compiles
            device_synchronize(dev)
            compile_ms = (time.perf_counter() - t0) * 1e3

        def call() -> Any:
            return fn(*args, **kwargs)

        between = CacheFlusher(dev) if cold_cache else None
        xfer = _Transfer(mi, call, bool(pin_memory)) if transfer else None

        if cuda_graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                n_warm, est = warm_up(call, warmup_policy, already_warm, tclock.sync)
            torch.cuda.current_stream().wait_stream(side)
            graph, static_out = capture_cuda_graph(call, side_warmup=0)
            for _ in range(3):
                graph.replay()

            def replay() -> Any:
                graph.replay()
                return static_out
            if xfer is not None:
                xfer.call = replay
            step_call: Callable[[], Any] = replay
        else:
            n_warm, est = warm_up(xfer.step if xfer else call, warmup_policy, already_warm,
                                  tclock.sync)
            step_call = call

        if xfer is not None:
            if xfer.out is None:                # no warm-up call ran: make the output buffers
                xfer.step()
                tclock.sync()
            phases = [xfer.h2d, xfer.compute, xfer.d2h]
        else:
            phases = [step_call]
        parts_ms: list[Any] = []

        def sample_chunk(k: int) -> Any:
            got = tclock.time(phases, k, between)
            parts_ms.append(got)
            return got.sum(axis=1)

        total, reason, _ = collect(sample_chunk, rule, est)
    WARMED.add(fn_or_model, signature)

    env = collect_env(dev, dtype=amp_dtype or mi.dtype, batch_size=mi.batch_size,
                      clock=tclock.kind, **flags)
    common = dict(device=str(dev), batch_size=mi.batch_size, warmup=n_warm, stop_reason=reason,
                  precision=None if rule.repeat is not None else rule.precision)
    name = label if label is not None else _label(fn_or_model)
    parts: dict[str, Measurement] = {}
    if xfer is not None:
        stacked = np.concatenate(parts_ms, axis=0)
        for i, part in enumerate(("h2d", "compute", "d2h")):
            parts[part] = Measurement(stacked[:, i], label=f"{name} {part}", **common)
    m = Measurement(total, compile_ms=compile_ms, wall_s=time.perf_counter() - t_begin,
                    label=name, env=env, **common, **parts)
    if warn:
        m.warn_if_noisy()
    return m
