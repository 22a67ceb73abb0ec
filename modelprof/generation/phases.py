"""Prefill and decode, each a per-layer table with the columns of ``profile``: counted (the KV
cache's bytes are those of the ops that touch it) and timed per layer, the cache put back after
every pass so that each runs at the same context. Decode at context ``L`` is one token after
``L`` cached ones; without a cache, the forward over all ``L + 1`` tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from modelprof.counting.forward import analyze
from modelprof.generation.cache import KVCacheInfo, cache_length, check_rewound, held_cache, kv_info
from modelprof.generation.lm import LanguageModel, greedy_next
from modelprof.generation.spec import CacheMode, GenerationSpec
from modelprof.report.report import Counts, Report, RunInfo, TimingResult
from modelprof.report.rows import build_rows, join_rows, row_keys
from modelprof.runtime.env import MachineShare
from modelprof.runtime.execution import RunMode
from modelprof.runtime.hooks import module_names
from modelprof.runtime.inputs import ModelInputs
from modelprof.runtime.snapshot import Snapshot
from modelprof.timing.columns import layer_columns
from modelprof.timing.kernels import KernelTiming, time_kernels
from modelprof.timing.layers import time_layers
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions

__all__ = ["Phase", "count_phases", "time_phase"]


@dataclasses.dataclass
class Phase:
    """One step of generation: ``prefill`` over the prompt, or ``decode`` of one token with
    ``context`` tokens before it (``tokens``: those its forward runs over: 1 with a cache, all
    ``context + 1`` without one); its per-layer ``report`` (the columns of ``profile``)."""

    name: str
    context: int
    tokens: int
    batch_size: int
    report: Report
    kv: KVCacheInfo | None = None  # the cache after this step
    records: list[Any] = dataclasses.field(default_factory=list, repr=False)
    counts: Counts | None = dataclasses.field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"decode@{self.context}" if self.name == "decode" else self.name

    def __repr__(self) -> str:
        """The phase in a line, its report's table below it, the cache on a line of its own
        (the dataclass's repr put ``, kv=...`` on the table's last line)."""
        head = (
            f"Phase({self.label}: {self.tokens} token(s) at context {self.context}, "
            f"batch {self.batch_size})"
        )
        kv = [] if self.kv is None else [f"kv={self.kv!r}"]
        return "\n".join([head, repr(self.report), *kv])

    @property
    def totals(self) -> dict[str, Any]:
        return self.report.totals


class _Timed(nn.Module):
    """``root`` as a module of its own per phase, so each phase warms up afresh (the warm-up
    registry knows a module by its call's tensors, which leave out a cache's)."""

    def __init__(self, root: nn.Module) -> None:
        super().__init__()
        self.root = root
        self.modelprof_label = type(root).__name__  # errors name the model, not this wrapper

    def forward(self, **kwargs: Any) -> Any:
        return self.root(**kwargs)


@dataclasses.dataclass
class _Counter:
    """Counts (and with ``opts`` times) the steps of one batch size, carrying the cache."""

    lm: LanguageModel
    spec: GenerationSpec
    batch: int
    gen: torch.Generator
    opts: TimingOptions | None
    cache: Any = None
    length: int = 0  # tokens in the cache
    room: int = 0  # a static cache's size in tokens (``_room``)

    def _counted(
        self,
        phase: str,
        context: int,
        tokens: int,
        mi: ModelInputs,
        root: nn.Module | None = None,
        watch: Snapshot | None = None,
    ) -> Phase:
        """One counted call of ``root`` (default the model's) on ``mi``; ``watch`` keeps what
        it writes of the cache."""
        what = f"decode@{context}" if phase == "decode" else phase  # its Phase.label
        result = analyze(root or self.lm.root, mi, RunMode(dtype=self.lm.dtype), watch=watch)
        run = RunInfo(
            model_name=f"{self.lm.name} {what}",
            input_shape=mi.shapes(),
            batch_size=self.batch,
            device=str(self.lm.device),
            dtype=str(self.lm.dtype).removeprefix("torch."),
        )
        counts = Counts(result.unsupported, result.by_op, result.model_params)
        report = Report(build_rows(result.records), run, counts)
        return Phase(
            phase, context, tokens, self.batch, report, records=result.records, counts=counts
        )

    def encode(self) -> Phase:
        """The encoder's forward, counted (and timed); its output kept for the decoder."""
        lm, b = self.lm, self.batch
        lm.phase(f"the encoder at batch {b}")
        mi = ModelInputs((), lm.encoder_inputs(b), lm.device, lm.dtype, b)
        encoder = lm.encoder
        phase = self._counted("encoder", 0, 0, mi, encoder)
        lm.keep_encoded(b, encoder.last)
        phase.tokens = int(encoder.last[0].shape[1])  # the encoder's output length
        if self.opts is not None:
            time_phase(lm, phase, mi, None, self.opts, encoder)
        return phase

    def _next(
        self, length: int, given: tuple[torch.Tensor, bool] | None = None
    ) -> tuple[Any, torch.Tensor, bool]:
        """The cache to extend, ``length`` new tokens and whether they are the prompt
        (``given``: these tokens, and whether they start the cache)."""
        first = self.length == 0
        cache = self.cache
        if cache is None:
            cache = self.lm.new_cache(self.batch, self.room)
        if given is not None:
            return cache, *given
        new = self.lm.prompt if first else self.lm.tokens
        return cache, new(self.batch, length, self.gen), first

    def _extend(
        self, length: int, given: tuple[torch.Tensor, bool] | None = None
    ) -> tuple[Phase, ModelInputs, Snapshot]:
        """A counted forward of ``length`` new tokens after the cache (which it extends);
        ``given``: these tokens, and whether they start the cache."""
        cache, tokens, first = self._next(length, given)
        cache_as_was = Snapshot(cache, copy_on_write=True)
        mi = self.lm.inputs(tokens, cache, first)
        phase = self._counted("prefill", self.length, int(tokens.shape[1]), mi, watch=cache_as_was)
        self.cache = _cache_of(self.lm, mi)
        self.length += length
        phase.kv = self._kv(self.cache, self.length)
        return phase, mi, cache_as_was

    def _grow(self, length: int) -> None:
        """Extend the cache by ``length`` tokens, not reported. A static cache on meta is built
        again from empty in one chunk (the prompt, then the tokens up to the context):
        transformers' mask asks a chunk after the first whether its offset is 0, a value meta
        cannot give; at offset 0 it asks nothing (and meta holds no values to keep)."""
        prompt = self.spec.prompt_len
        if self.lm.device.type == "meta" and self.lm.cache is CacheMode.STATIC:
            tokens, _ = self._prefix(self.length + length)
            self.cache, self.length = None, 0
            self._chunk(int(tokens.shape[1]), (tokens, True))
            return
        if self.length == 0 and length > prompt:  # the prompt first
            self._grow(prompt)
            length -= prompt
        self._chunk(length)

    def _chunk(self, length: int, given: tuple[torch.Tensor, bool] | None = None) -> None:
        """``length`` tokens into the cache (``given``: these tokens, and whether they start
        it), uncounted (counting costs) where the model runs as it is; counted otherwise (it
        runs only inside the counting pass)."""
        if not self.lm.runs_as_is:
            self._extend(length, given)
            return
        cache, tokens, first = self._next(length, given)
        _, self.cache = self.lm.step(tokens, cache, prompt=first)
        self.length += length

    def prefill(self) -> Phase:
        self.lm.phase(f"the prefill at batch {self.batch}")
        self.cache, self.length, self.room = None, 0, self._room()
        phase, mi, cache_as_was = self._extend(self.spec.prompt_len)
        if self.opts is not None:  # each timed pass from the empty cache
            cache_as_was.restore()
            time_phase(self.lm, phase, mi, cache_as_was, self.opts)
            self.cache, self.length = None, 0  # rebuilt on the way to the first context
        return phase

    def decode(self, context: int) -> Phase:
        lm = self.lm
        lm.phase(f"the decode step at context {context}, batch {self.batch}")
        if lm.cache is CacheMode.NONE:  # the whole prefix again (the prompt's), no cache
            tokens, given = self._prefix(context + 1)
            mi = lm.inputs(tokens, None, given)
            phase = self._counted("decode", context, context + 1, mi)  # all L + 1 of them
            _cache_of(lm, mi)  # checks a step function's output
            if self.opts is not None:
                time_phase(lm, phase, mi, None, self.opts)
            return phase
        room = self._room(context)
        if context < self.length or room != self.room:  # start again, on a cache of its size
            self.cache, self.length, self.room = None, 0, room
        if context > self.length:  # build the cache up to L, not reported
            lm.phase(f"building the cache to context {context}, batch {self.batch}")
            self._grow(context - self.length)
            lm.phase(f"the decode step at context {context}, batch {self.batch}")
        # what the step writes in place (a static cache, a recurrent state) copied just before
        cache_as_was = Snapshot(self.cache, copy_on_write=True)
        before = cache_length(held_cache(self.cache))
        mi = lm.inputs(lm.tokens(self.batch, 1, self.gen), self.cache)
        phase = self._counted("decode", context, 1, mi, watch=cache_as_was)
        phase.kv = self._kv(_cache_of(lm, mi), context + 1)
        cache_as_was.restore()
        check_rewound(held_cache(self.cache), before, lm.name)
        if self.opts is not None:
            time_phase(lm, phase, mi, cache_as_was, self.opts)
        return phase

    def _room(self, context: int | None = None) -> int:
        """A static cache's size for the prefill (``context`` None) or a decode step at
        ``context``: the generation's, as ``generate()`` allocates it, or one just large enough
        for a context past it (``spec.cache_room``); 0 for another cache (it holds what it
        holds)."""
        if self.lm.cache is not CacheMode.STATIC:
            return 0
        spec = self.spec
        return spec.static_cache_len if context is None else spec.cache_room(context)

    def _prefix(self, length: int) -> tuple[torch.Tensor, bool]:
        """``length`` tokens from the start (the given prompt first) and whether one was given."""
        given = self.lm.prompt_inputs.ids is not None or bool(self.lm.prompt_inputs.extras)
        if not given:
            return self.lm.tokens(self.batch, length, self.gen), False
        prompt = self.lm.prompt(self.batch, self.spec.prompt_len, self.gen)
        more = self.lm.tokens(self.batch, length - prompt.shape[1], self.gen)
        return torch.cat([prompt, more], dim=1), True

    def _kv(self, cache: Any, tokens: int) -> KVCacheInfo | None:
        if cache is None:
            return None
        return kv_info(cache, tokens, self.batch, self.lm.config, self.lm.dtype)


def _cache_of(lm: LanguageModel, mi: ModelInputs) -> Any:
    """The cache after a counted step (a step function's: what it returned)."""
    if lm.hf:
        return mi.kwargs.get(lm.cache_arg)
    logits, cache = lm.checked(getattr(lm.root, "last", None))
    greedy_next(logits, lm.name)
    return cache


def count_phases(
    lm: LanguageModel,
    spec: GenerationSpec,
    batch: int,
    seed: int = 0,
    opts: TimingOptions | None = None,
) -> list[Phase]:
    """The encoder (if any), prefill and decode phases of ``spec``; with ``opts`` timed too."""
    counter = _Counter(lm, spec, batch, torch.Generator().manual_seed(seed), opts)
    encoder = [counter.encode()] if lm.encoder is not None else []
    phases = [*encoder, counter.prefill(), *(counter.decode(c) for c in spec.contexts)]
    lm.encoded.pop(batch, None)  # not held past its batch size
    return phases


def time_phase(
    lm: LanguageModel,
    phase: Phase,
    mi: ModelInputs,
    cache_as_was: Snapshot | None,
    opts: TimingOptions,
    root: nn.Module | None = None,
) -> None:
    """Per-layer latency of ``phase``'s step on ``mi`` (the cache put back to ``cache_as_was``
    before each pass and after the last), joined into its rows; ``latency`` is the plain passes
    interleaved with the instrumented ones."""
    root = root or lm.root
    mi.reset = None if cache_as_was is None else cache_as_was.reset
    # what other work took of the cores while the passes ran: a loaded phase is rough
    share = MachineShare(on=torch.device(mi.device).type == "cpu")
    try:
        instrument = time_kernels if opts.layer_instrument(mi.device) == "kernels" else time_layers
        with share:
            layers = instrument(_Timed(root), mi, modules=module_names(root), options=opts)
    finally:
        if cache_as_was is not None:  # the last pass's token taken out again
            cache_as_was.reset()
    if isinstance(layers, KernelTiming):  # its plain passes ran under the profiler
        plain = layers.clean_ms
    elif layers.plain_ms is not None and layers.plain_ms.size:
        plain = layers.plain_ms
    else:
        plain = layers.passes_ms
    latency = Measurement(
        plain,
        device=str(mi.device),
        batch_size=mi.batch_size,
        label=f"{lm.name} {phase.label} (plain passes)",
        env=dict(layers.env),
        competing_cores=share.competing_cores,
        competing_cores_margin=share.margin,
    )
    old = phase.report
    columns, overhead, leaf_sum = layer_columns(row_keys(old.rows), phase.records, latency, layers)
    # the leaf rows' share of the reported latency, as profile() states it
    coverage = leaf_sum / latency.median_ms if latency.median_ms > 0 else float("nan")
    run = RunInfo(old.model_name, old.input_shape, old.batch_size, old.device, old.dtype)
    phase.report = Report(
        join_rows(old.rows, [columns]),
        run,
        phase.counts,
        TimingResult(latency, layers, overhead, coverage),
    )
