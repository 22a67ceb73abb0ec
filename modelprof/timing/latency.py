"""``measure_latency``: end-to-end latency of any callable under one ``TimingOptions``.

``TimedCall`` is one callable made ready for timing (converted, modes entered, compiled or
captured, transfer buffers); ``modelprof.timing.interleave`` runs several in interleaved rounds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime.agree import agreed_timing
from modelprof.runtime.compiled import compiled_words, eager_module, eager_view
from modelprof.runtime.device import device_synchronize, is_oom
from modelprof.runtime.execution import (
    RunMode,
    completing,
    legacy_eval_mode,
    random_kept,
    running,
    to_channels_last,
)
from modelprof.runtime.exported import check_recorded, is_flat_export, runnable
from modelprof.runtime.failure import forward_failure
from modelprof.runtime.group import communicates
from modelprof.runtime.guard import StateGuard, preserved_state, set_training
from modelprof.runtime.inputs import (
    ModelInputs,
    make_inputs,
    parse_device,
    parse_dtype,
    refuses_call,
    shape_as_inputs_hint,
)
from modelprof.runtime.placement import copy_model, model_placement, moved_model, to_placement
from modelprof.runtime.snapshot import Snapshot, snapshot_of
from modelprof.runtime.tensors import iter_tensors, map_tensors
from modelprof.timing.measurement import Measurement
from modelprof.timing.modes import CacheFlusher, compile_callable, graph_replay
from modelprof.timing.options import TimingOptions, check_option_names, keyword_names
from modelprof.timing.peaks import refuse_idle_amp
from modelprof.timing.runner import Runner
from modelprof.timing.sampler import Sampled, input_signature

__all__ = [
    "FIRST_CALL",
    "HELD_BYTES",
    "TimedCall",
    "given_back",
    "held_bytes",
    "measure_latency",
    "resolve_call",
    "timing_runner",
]


def _has_tensors(model: nn.Module) -> bool:
    return next(iter((*model.parameters(), *model.buffers())), None) is not None


def resolve_call(
    fn_or_model: Any,
    inputs: Any = None,
    *,
    input_size: Any = None,
    batch_size: int | None = None,
    device: Any = None,
    dtype: Any = None,
    channels_last: bool = False,
) -> tuple[Callable[..., Any], ModelInputs]:
    """The object to call (the user's, or a converted copy of a module) and its inputs, on
    ``device``, else the module's, else the given tensors', else the CPU."""
    if not callable(fn_or_model):
        raise ModelProfError(f"fn_or_model={type(fn_or_model).__name__} is not callable")
    dev = parse_device(device)
    given = inputs if isinstance(inputs, ModelInputs) else None
    if given is not None:  # already normalised (by profile): used as they are
        if input_size is not None:
            raise ModelProfError("pass either ModelInputs or input_size, not both")
        if batch_size is not None and batch_size != given.batch_size:
            raise ModelProfError(
                f"batch_size={batch_size!r} contradicts the given inputs, whose "
                f"batch is {given.batch_size}; leave batch_size out"
            )
        dev = dev or given.device
    dt = parse_dtype(dtype)
    is_module = isinstance(fn_or_model, nn.Module)
    if dev is None:
        if is_module and _has_tensors(fn_or_model):
            dev = model_placement(fn_or_model)[0]
        else:
            first = next(iter_tensors(inputs), None) if inputs is not None else None
            dev = first.device if first is not None else torch.device("cpu")
    target: Callable[..., Any] = fn_or_model
    if is_module:
        fmt = torch.channels_last if channels_last else None
        target = moved_model(fn_or_model, dev, dt, memory_format=fmt)
    if given is not None:
        args, kwargs = map_tensors((given.args, given.kwargs), lambda t: to_placement(t, dev, dt))
        mi = dataclasses.replace(
            given, args=args, kwargs=kwargs, device=dev, dtype=dt or given.dtype
        )
    elif inputs is None and input_size is None:  # a closure over its own data: call with nothing
        mi = ModelInputs((), {}, dev, dt or torch.get_default_dtype(), batch_size or 1)
    else:
        mi = make_inputs(  # target is fn_or_model unless a module was converted
            target, input_size, inputs=inputs, batch_size=batch_size, device=dev, dtype=dtype
        )
    if channels_last:
        mi = dataclasses.replace(
            mi, args=to_channels_last(mi.args), kwargs=to_channels_last(mi.kwargs)
        )
    return target, mi


#: a callee's refusal for want of an argument (Python's words for a missing one)
_MISSING_ARGUMENT = re.compile(r"missing \d+ required (positional|keyword-only) argument")


@contextlib.contextmanager
def no_inputs_hint(fns: Any, inputs: Any, input_size: Any) -> Iterator[None]:
    """A call of ``fns`` made with no inputs, refused for want of an argument by one whose
    signature takes some (a module's ``forward(x)``): its error says that none were given.
    Only once it failed: a module whose pre-hook supplies its argument, or a closure over its
    data, runs as given; a function of none whose own code misses an argument is not hinted.
    Inputs that read as a shape (``measure_latency(model, (32,))``) that a module refused
    with a TypeError: the hint names ``input_size=`` (a function may take ints)."""
    try:
        yield
    except ModelProfError as e:
        cause = e.__cause__
        hint = shape_as_inputs_hint(cause, inputs) if input_size is None else ""
        if hint and any(isinstance(f, nn.Module) for f in fns):
            raise ModelProfError(f"{e}{hint}") from cause
        if inputs is None and input_size is None and isinstance(cause, TypeError):
            if _MISSING_ARGUMENT.search(str(cause)) and any(map(refuses_call, fns)):
                raise ModelProfError(
                    f"{e}\nhint: no inputs were given: pass inputs= (a tensor, a tuple or a "
                    "dict) or input_size= (batch excluded)"
                ) from cause
        raise


def _label(fn: Any) -> str:
    if isinstance(fn, nn.Module):
        return type(eager_module(fn)).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


class _Transfer:
    """H2D copy of the inputs, compute, D2H copy of the outputs, through host buffers (pinned
    when ``pin``) allocated once."""

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
            self.out_host = [
                torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin) for t in outs
            ]
        for h, d in zip(self.out_host, outs):
            h.copy_(d, non_blocking=self.pin)

    def step(self) -> None:
        self.h2d()
        self.compute()
        self.d2h()


#: a pipelined sample is about this long (enough calls back to back that the stream stays full)
PIPELINE_SAMPLE_MS = 20.0


def pipeline_group(est_ms: float | None) -> int:
    """Calls per pipelined sample: ``PIPELINE_SAMPLE_MS`` of work, 2 to 64 (8 when none was
    timed: a CUDA graph's)."""
    if est_ms is None or not est_ms > 0:
        return 8
    return int(min(64, max(2, round(PIPELINE_SAMPLE_MS / est_ms))))


class TimedCall(Runner):
    """One callable ready to be timed under ``opts``: ``with TimedCall(...) as tc: tc.warm();
    tc.sample_block(k)``. Entering sets the modes, compiles and allocates transfer buffers;
    leaving restores every flag."""

    def __init__(
        self,
        fn_or_model: Any,
        target: Callable[..., Any],
        mi: ModelInputs,
        opts: TimingOptions,
        *,
        mode: RunMode = RunMode(),
        label: str | None = None,
        given: tuple[StateGuard | None, Snapshot] | None = None,
    ) -> None:
        opts.check_device(mi.device)
        refuse_idle_amp(mi.dtype, opts.amp)  # (measure_latency's, a throughput point's)
        name = label if label is not None else _label(fn_or_model)
        super().__init__(opts, mi.device, name, mi.batch_size)
        self.target, self.mi = target, mi
        self.mode = dataclasses.replace(mode.on(mi.device), amp=opts.amp)
        self.flags = opts.flags(eval_mode=not mode.training, no_grad=mode.no_grad)
        signature = input_signature(mi.args, mi.kwargs, device=str(self.dev), **self.flags)
        self.warm_key = (fn_or_model, signature)
        # a converted copy or a compiled wrapper has never been warmed
        self.fresh = target is not fn_or_model or opts.compile is not None
        self.named = label is not None  # a candidate among others: its errors say which
        self.compile_ms: float | None = None
        self._phases: list[Callable[[], Any]] = []
        #: ``measure_latency``'s own: the guard of the module called and the inputs as they went
        #: in, which the first untimed call (``_first_pass``) decides what runs between calls by
        self.given = given
        self._first: Callable[[], Any] | None = None  # that call, until it has run
        self._watched = False  # whether it runs under the guard's first-write watch

    def contexts(self) -> list[Any]:
        return [running(self.target, self.mode, cache_enabled=not self.opts.cuda_graph)]

    def setup(self) -> None:
        dev, opts, fn = self.dev, self.opts, self.target
        if opts.compile is not None:
            fn = compile_callable(self.target, opts.compile, opts.compile_kwargs)
        fn = completing(fn)  # a call ends when the collectives it started have
        args, kwargs = self.mi.args, self.mi.kwargs
        self.call: Callable[[], Any] = lambda: fn(*args, **kwargs)
        self._flush = CacheFlusher(dev) if opts.cold_cache else None
        self._reset_by(self.mi.reset)
        if self.given is not None:  # the first untimed call (compiling, or the first warm-up)
            self._first = self.call
            guard = self.given[0]
            self._watched = guard is not None and guard.write_hook() is not None
            compiled = isinstance(self.target, nn.Module) and compiled_words(self.target)
            if self._watched and (opts.compile is not None or compiled):
                # compiled code is not watched: an eager call first
                self._first = lambda: self._eager_call(args, kwargs)
                self.guarded(self._first_pass)
                self.clock.sync()
                self.warmup_calls += 1  # untimed, before the samples: a warm-up call
        if opts.compile is not None:
            device_synchronize(dev)
            t0 = time.perf_counter()
            self.guarded(lambda: self._warm_step(transfer=False))  # the first call compiles
            device_synchronize(dev)
            self.compile_ms = (time.perf_counter() - t0) * 1e3
            self.warmup_calls += 1  # (its time is compile_ms)
        self.xfer = _Transfer(self.mi, self.call, opts.pin_memory) if opts.transfer else None

    def _eager_call(self, args: tuple, kwargs: dict) -> Any:
        """One call of the target's eager code (a compiled model's eager modules)."""
        if not isinstance(self.target, nn.Module):
            return completing(self.target)(*args, **kwargs)
        with eager_view(self.target) as eager:
            return completing(eager)(*args, **kwargs)

    def _reset_by(self, reset: Callable[[], Any] | None) -> None:
        """``reset`` puts back the inputs a call writes (None: none does) before every call but
        the first: untimed calls (warm-up, compile) start from the same inputs as the timed
        ones, and the timed ones run it outside their span (``between``)."""
        self.mi.reset = reset
        call = self.call
        self.fresh_call = call if reset is None else (lambda: (reset(), call())[1])
        flush = self._flush  # (cold_cache's)
        if reset is None or flush is None:
            self.between = flush if reset is None else reset
        else:  # the inputs put back, then the cache flushed
            self.between = lambda: (reset(), flush())

    def _first_pass(self) -> Any:
        """The first call (untimed), the module's tensors copied just before their first write
        (the state guard's watch, as profile's counted forward), then what it changed in the
        inputs put back, and before every later call again (``Snapshot.between_passes``:
        nothing where it changed nothing). It too starts from the inputs as given."""
        first, self._first = self._first, None
        guard, passed = self.given
        passed.reset()  # what another candidate's calls wrote (``measure_latencies``)
        with contextlib.nullcontext() if guard is None else guard.watch_writes():
            out = first()
        self._reset_by(passed.between_passes())
        if guard is not None:  # a write it could not see is named with the calls after it
            guard.begin("the later calls")
        return out

    def _no_warm_up(self) -> None:
        """``warmup=0``: no untimed call ran. A module whose writes are watched, or any callable
        in a pipelined run (nothing runs between its calls: one that writes its inputs is
        refused, as with a warm-up), is called once more, untimed, as that first pass (a
        warm-up call: ``warmup`` says 1); else the inputs are put back before every call (a
        quick check of what changed)."""
        if self._watched or self.opts.latency_mode == "pipelined":
            self.guarded(self._first_pass)
            self.clock.sync()
            self.warmup_calls += 1
            return
        self._first = None
        self._reset_by(self.given[1].reset)

    def _warm_step(self, transfer: bool = True) -> Any:
        """One warm-up call: the first pass where it has not run, else as the timed calls run
        (``transfer``: through the host buffers, where the run has them)."""
        if self._first is not None:
            return self._first_pass()
        if not transfer or self.xfer is None:
            return self.fresh_call()
        if self.mi.reset is not None:
            self.mi.reset()
        return self.xfer.step()

    def failure(self, e: Exception) -> BaseException:
        """A failure of the user's code naming the callable (out of memory: as it is), marked
        with the candidate (``error.candidate``), which a comparison drops."""
        if is_oom(e):
            return e
        try:  # from inside a module's forward: name the module and the inputs
            with forward_failure(
                self.target, "the end-to-end timing", self.mi.kwargs or self.mi.args
            ):
                raise e
        except ModelProfError as failed:
            text = f"candidate {self.label!r}: {failed}" if self.named else str(failed)
        except Exception:  # noqa: BLE001 - not from inside the model: say what failed
            text = (
                f"{self.label} failed while timing it end to end on {self.dev}: "
                f"{type(e).__name__}: {e}"
            )
        error = ModelProfError(text)
        error.candidate = self.label  # type: ignore[attr-defined]
        return error

    def warm(self) -> float | None:
        """Warm up per the options; returns the wall ms of one call (sizes the blocks)."""
        xfer, sync = self.xfer, self.clock.sync
        if self.opts.cuda_graph:
            step, est = self._capture_graph(), None
        else:
            est = self.warm_with(self._warm_step, self.already_warm and not self.fresh)
            step = self.call
        if self._first is not None:
            self._no_warm_up()
        if xfer is not None:
            xfer.call = step
            if xfer.out is None:  # no warm-up call ran: make the output buffers
                self.guarded(xfer.step)
                sync()
            self._phases = [xfer.h2d, xfer.compute, xfer.d2h]
        else:
            self._phases = [step]
        if self.opts.latency_mode == "pipelined" and self.between is not None:
            raise ModelProfError(
                f"latency_mode='pipelined' runs {self.label} back to back, with nothing between "
                "its calls; the inputs it writes (put back before every call) or cold_cache "
                "need something between them: time it in the latency mode"
            )
        if self.opts.latency_mode == "pipelined" and hasattr(self.clock, "group"):
            self.clock.group = pipeline_group(est)
            return None if est is None else est * self.clock.group
        return est

    def _capture_graph(self) -> Callable[[], Any]:
        """Warm up on a side stream (at least one call: capture needs lazy initialisation done),
        capture once, replay three times."""
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):
            before = self.warmup_calls
            warm = lambda: self._warm_step(transfer=False)  # noqa: E731
            self.warm_with(warm, self.already_warm and not self.fresh)
            if self.warmup_calls == before:
                self.guarded(warm)
                self.warmup_calls += 1
        torch.cuda.current_stream(self.dev).wait_stream(side)
        try:
            replay = graph_replay(self.call, side_warmup=0)
            for _ in range(3):
                replay()
        except Exception as e:
            if is_oom(e):
                raise
            raise ModelProfError(
                f"cuda_graph=True: capturing {self.label} into a CUDA graph "
                f"failed ({type(e).__name__}: {e}); graphs need static shapes, "
                "no host synchronisation and no CPU tensors in the forward; "
                "time it without cuda_graph"
            ) from e
        return replay

    def sample_block(self, k: int) -> np.ndarray:
        """``k`` back-to-back timed calls' ms (parts kept for transfer runs). A callable that
        writes no input has nothing run between its calls; its inputs are put back before the
        block (untimed) all the same, where another candidate's block (``measure_latencies``)
        may have written them."""
        if self.between is None and self.given is not None:
            self.given[1].reset()
        return self.time_phases(self._phases, k, self.between).sum(axis=1)

    def measurement(self, sampled: Sampled, t_begin: float) -> Measurement:
        """The Measurement of what was sampled, with the environment read after timing."""
        opts, mi = self.opts, self.mi
        env = opts.env(mi, self.clock.kind, **self.flags)
        env["latency_mode"] = opts.latency_mode
        if getattr(self.clock, "group", 0):
            env["calls_per_sample"] = self.clock.group
        common = self.fields(sampled)
        parts = self.phase_measurements(("h2d", "compute", "d2h"), **common) if self.xfer else {}
        cpu_ms = cpu_kind = share = None
        read = self.cpu_table(whole=True)  # a CpuClock: the blocks' CPU time, the call's last
        if read is not None:
            cpu_ms, share, cpu_kind = read[0][:, -1], read[1][-1], self.clock.cpu_kind
            env["cpu_clock"] = cpu_kind
        return Measurement(
            sampled.samples_ms,
            compile_ms=self.compile_ms,
            wall_s=time.perf_counter() - t_begin,
            label=self.label,
            env=env,
            cpu_ms=cpu_ms,
            cpu_clock=cpu_kind,
            cpu_thread_share=share,
            **common,
            **parts,
        )


def measure_latency(
    fn_or_model: Callable[..., Any],
    inputs: Any = None,
    *,
    input_size: Any = None,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    training: bool = False,
    no_grad: bool = True,
    label: str | None = None,
    options: TimingOptions | None = None,
    **timing_options: Any,
) -> Measurement:
    """Time ``fn_or_model(*args, **kwargs)`` end to end and return every sample.

    ``inputs``: a tensor (the one argument), a tuple (positional) or a dict (keyword arguments);
    or ``input_size`` (batch excluded) + ``batch_size`` for random inputs; or neither for a
    callable without arguments. A module runs under ``eval()`` and ``no_grad`` unless
    ``training``/``no_grad`` say otherwise, and comes back as it went in (``given_back``), as
    do the inputs (every call sees them as they went in) and the global RNG. Timing options
    (``options=TimingOptions(...)`` or keywords: ``modelprof.timing.options``): ``warmup``,
    ``warmup_s``, ``repeat`` or ``precision``/``budget_s``/``min_samples``/``min_blocks``/
    ``max_samples``; ``transfer``, ``pin_memory``, ``cuda_graph``, ``amp``, ``channels_last``,
    ``cold_cache``, ``compile``/``compile_kwargs``, ``clock``; ``warn``. An ``ExportedProgram``
    (which cannot be called) is timed as its ``module()``: what running it means.
    """
    t_begin = time.perf_counter()
    program, fn_or_model = fn_or_model, runnable(fn_or_model)  # a program: its module()
    training = legacy_eval_mode(training, timing_options, "measure_latency")
    check_option_names(timing_options, own=_KEYWORDS)  # devce=
    opts = TimingOptions.parse(options, **timing_options)
    target, mi = resolve_call(
        fn_or_model,
        inputs,
        input_size=input_size,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        channels_last=opts.channels_last,
    )
    check_recorded(program, mi.args, mi.kwargs)  # before it runs: its guards name no input
    with (
        no_inputs_hint([fn_or_model], inputs, input_size),
        agreed_timing([fn_or_model]),
        given_back(fn_or_model, target, inputs, mi) as given,
        TimedCall(
            fn_or_model,
            target,
            mi,
            opts,
            mode=RunMode.parse(training=training, no_grad=no_grad),
            label=label,
            given=given,
        ) as tc,
    ):
        sampled = tc.sample(tc.sample_block, tc.warm(), f"latency {tc.label}")
        held = held_bytes(given, mi.device) if mi.device.type == "cuda" else 0
    m = tc.measurement(sampled, t_begin)
    if held:  # (a throughput point's peak leaves them out)
        m.env[HELD_BYTES] = held
    if opts.warn:
        m.warn_if_noisy()
    return m


_KEYWORDS = keyword_names(measure_latency)  # (read once, as profile's)

#: how a write the first call's watch could not see names that call (``StateGuard``)
FIRST_CALL = "the first call"
#: an ``env`` key: CUDA bytes a run's copies held that a user's own loop would not (of the
#: inputs and the model's written tensors, :func:`held_bytes`; a training step's copy of the
#: model and its parameter snapshot), left out of a throughput point's peak
HELD_BYTES = "held_bytes"


@contextlib.contextmanager
def given_back(
    fn_or_model: Any, target: Any, inputs: Any, mi: ModelInputs
) -> Iterator[tuple[StateGuard | None, Snapshot] | None]:
    """What ``measure_latency`` gives back at the end of the block, as ``profile`` does (also
    on an error or an interrupt): the module it calls (its state guard; a converted copy runs
    in its place: nothing of it to give back), the inputs (a snapshot, with the copies made of
    them: each call sees them as made) and the random state (torch's, Python's, numpy's).
    Yields the guard and the snapshot for the first call to watch (``TimedCall``); None for
    ``ModelInputs`` as given (by ``profile``, which gives back all of this itself)."""
    if isinstance(inputs, ModelInputs):
        yield None
        return
    own = fn_or_model if target is fn_or_model else None
    with (
        preserved_state(own, watched=FIRST_CALL) as guard,
        snapshot_of(inputs, mi.args, mi.kwargs) as passed,
        random_kept(mi.device),
    ):
        yield guard, passed


def held_bytes(given: tuple[StateGuard | None, Snapshot] | None, device: torch.device) -> int:
    """Bytes of the copies ``given_back`` holds (the inputs', the module's tensors written) on
    devices of ``device``'s kind; 0 without copies."""
    if given is None:
        return 0
    guard, passed = given
    kept = passed.copies + (guard.copies if guard is not None else [])
    return sum(
        c.untyped_storage().nbytes() for c in kept if c is not None and c.device.type == device.type
    )


def timing_runner(
    model: nn.Module, mi: ModelInputs, mode: RunMode, opts: TimingOptions
) -> nn.Module:
    """What the timed passes call: the model, or a converted copy, or in train mode a copy
    (train-mode passes update buffers)."""
    layout = torch.channels_last if opts.channels_last else None
    runner = moved_model(model, mi.device, mode.dtype, memory_format=layout)
    if mode.training:
        # a sharded/replicated model runs as it is (never copied): the state guard restores it;
        # so does an exported flat graph (its mode changes nothing it runs; a copy would drop
        # the input checks its pre-hooks run)
        if runner is model and not communicates(model) and not is_flat_export(model):
            runner = copy_model(model, "time it in train mode")
        set_training(runner, True)  # (a torch.export module refuses train())
    return runner
