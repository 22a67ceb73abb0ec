"""Memory to fit a generation: weights + KV cache and token ids at (batch, context) + a step's
activations (estimated: the largest inputs + outputs of one leaf call), per phase; and the largest
batch or context that fits. On CUDA the allocator's measured peak sits beside it
(``GenerationTiming``).
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
from torch import nn

from modelprof.counting.formulas.quantized import module_packed_weights
from modelprof.errors import ModelProfError, ModelProfWarning, check_int, warn_user
from modelprof.generation.cache import closed_form_kv_bytes, model_dims
from modelprof.runtime.inputs import bytes_text, memory_bytes_arg, refuse_beyond_memory
from modelprof.runtime.tensors import tensor_bytes

__all__ = [
    "COUNT_CAP",
    "MemoryPlan",
    "activation_bytes",
    "cache_terms",
    "check_run_fits",
    "weights_bytes",
]

#: the longest prefill a plan counts on meta for a model of no known positions (a state-space
#: model's scan on meta takes about 0.4 ms a token); a longer prompt's grows in proportion
COUNT_CAP = 8192


def weights_bytes(model: nn.Module | None, dtype: torch.dtype) -> int:
    """Parameters and buffers once each (floating ones at ``dtype``, quantized ones as stored)."""
    if model is None:
        return 0
    tensors = [*model.parameters(), *model.buffers()]
    return tensor_bytes(tensors, dtype) + module_packed_weights(model)[1]  # quantize_dynamic's


def check_run_fits(
    spec: Any, model: Any, dtype: torch.dtype, device: torch.device, source_len: int | None = None
) -> None:
    """Refuse, before anything is allocated, a run whose int64 token ids, full-length KV cache
    and one layer's hidden states (with an encoder's ``source_len`` tokens) cannot exist or
    exceed the memory of ``device`` (the CPU's for ``meta``); the cause is an OutOfMemoryError."""
    batch = max(spec.batch_sizes)
    source = batch * (source_len or 0)
    tokens = batch * spec.total_len
    parts = {"the token ids": (tokens + source) * torch.int64.itemsize}
    config = getattr(model, "config", None)
    if device.type != "meta":
        hidden = model_dims(config)["hidden"] if config is not None else _widest_embedding(model)
        kv_tokens = spec.total_len + (source_len or 0)
        parts["the KV cache"] = closed_form_kv_bytes(config, dtype, kv_tokens, batch) or 0
        parts["a layer's hidden states"] = (tokens + source) * (hidden or 0) * dtype.itemsize
    need = sum(parts.values())
    of_source = f" after a source of {source_len} tokens" if source_len else ""
    what = (
        f"prompt_len={spec.prompt_len} + new_tokens={spec.new_tokens}{of_source} at "
        f"batch_size {batch} needs {bytes_text(need)} for "
        f"{' and '.join(k for k, v in parts.items() if v)} alone"
    )
    where = torch.device("cpu") if device.type == "meta" else device
    refuse_beyond_memory(what, tokens + source, need, where)


def _widest_embedding(model: Any) -> int | None:
    modules = model.modules() if isinstance(model, nn.Module) else ()
    return max((m.embedding_dim for m in modules if isinstance(m, nn.Embedding)), default=None)


def activation_bytes(records: list[Any]) -> int:
    """The largest inputs + outputs of one leaf call (parameters not included; a leaf of
    views only holds no tensor of its own: ``report.memory``)."""
    leaves = (r for r in records if r.working_leaf)
    return max((r.input_bytes + r.output_bytes for r in leaves), default=0)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes to hold a generation of ``batch_size`` sequences of ``context`` tokens. One sequence's
    cache at ``c`` tokens: ``kv_per_token_bytes x c + window_per_token_bytes x min(c, window_tokens)
    + state_per_seq_bytes``; its token ids: ``ids_per_token_bytes x c`` (as :func:`modelprof.fit`
    counts them, batch x context ids in their own row); its activations: the largest of one leaf
    call's inputs + outputs in the profiled phases (a prefill of ``prompt_len`` tokens, the decode
    steps), and for a longer prompt its prefill's, counted on meta (``count_prefill``: one
    sequence's bytes at a prompt length, None where that count failed; itself None where the model
    cannot be fed token ids alone there: then the profiled prompt's figures stand, which
    ``prefill_note`` says). Counts stop at ``max_positions`` (``COUNT_CAP`` tokens where that is
    unknown), past which the last count grows in proportion."""

    weights_bytes: int
    kv_per_token_bytes: float  # one sequence, the layers that keep every token
    activation_per_seq_bytes: dict[str, float]  # by phase, for one sequence
    batch_size: int
    context: int
    state_per_seq_bytes: float = 0.0  # recurrent states and cross-attention, any context
    window_per_token_bytes: float = 0.0  # sliding-window layers, for window_tokens at most
    window_tokens: int = 0
    max_positions: int | None = None
    prompt_len: int = 0
    ids_per_token_bytes: float = 0.0  # one sequence's token ids: a token's element size
    count_prefill: Callable[[int], float] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )
    _counted: dict[int, float | None] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )
    _warned: list[bool] = dataclasses.field(default_factory=list, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its counter where that pickles (a copy of the model on meta), else
        without: the unpickled plan then sizes longer prompts with the profiled prompt's
        figures, as ``prefill_note`` and a warning say."""
        state = dict(self.__dict__)
        try:
            pickle.dumps(self.count_prefill)
        except Exception:  # noqa: BLE001 - a module that does not pickle, whatever it raises
            state["count_prefill"] = None
        return state

    @property
    def prefill_note(self) -> str | None:
        """Why a prompt longer than the profiled one is sized with the profiled prompt's
        activations (no count of it), or None where it is counted."""
        if self.count_prefill is None:
            return (
                f"activations of the profiled {self.prompt_len}-token prompt: this model's prefill "
                "cannot be counted at another length (a step function, an encoder-decoder, or a "
                "plan unpickled)"
            )
        if any(v is None for v in self._counted.values()):
            return (
                f"activations of the profiled {self.prompt_len}-token prompt: the count of a "
                "longer prefill on meta failed"
            )
        return None

    def kv_per_seq_bytes(self, context: int | None = None) -> float:
        """The cache of one sequence at ``context`` tokens."""
        c = check_int("context", self.context if context is None else context)
        return (
            self.kv_per_token_bytes * c
            + self.window_per_token_bytes * min(c, self.window_tokens)
            + self.state_per_seq_bytes
        )

    def kv_bytes(self, batch: int | None = None, context: int | None = None) -> float:
        """The cache of ``batch`` sequences."""
        return self.kv_per_seq_bytes(context) * self._batch(batch)

    def ids_bytes(self, batch: int | None = None, context: int | None = None) -> float:
        """The token ids of ``batch`` sequences of ``context`` tokens."""
        c = check_int("context", self.context if context is None else context)
        return self.ids_per_token_bytes * c * self._batch(batch)

    def _batch(self, batch: int | None) -> int:
        return check_int("batch", self.batch_size if batch is None else batch)

    def total_bytes(
        self, phase: str, batch: int | None = None, context: int | None = None
    ) -> float:
        b = self._batch(batch)
        return (
            self.weights_bytes
            + self.kv_bytes(b, context)
            + self.ids_bytes(b, context)
            + b * self.activation_per_seq_bytes[phase]
        )

    def table(self) -> Any:
        return pd.DataFrame(
            [
                {
                    "phase": p,
                    "weights_bytes": self.weights_bytes,
                    "kv_cache_bytes": self.kv_bytes(),
                    "inputs_bytes": self.ids_bytes(),
                    "activation_bytes": self.batch_size * a,
                    "total_bytes": self.total_bytes(p),
                }
                for p, a in self.activation_per_seq_bytes.items()
            ]
        )

    def activation_seq_bytes(self, prompt_len: int | None = None) -> float:
        """One sequence's largest activation with prompts of ``prompt_len`` tokens (None: the
        profiled one): the profiled phases', or where the prompt is longer than the profiled
        one, the larger of those and its prefill's counted on meta (as :func:`modelprof.fit`
        counts it: the math attention path, a flash kernel's held less); where it cannot be
        counted, the profiled phases' (``prefill_note``)."""
        acts = self.activation_per_seq_bytes
        measured = max(acts.values(), default=0.0)
        tokens = self.prompt_len if prompt_len is None else check_int("prompt_len", prompt_len)
        if tokens < self.prompt_len and "prefill" in acts:
            # a shorter prefill's call holds at most the profiled one's in proportion (its
            # linear terms scale so, attention's quadratic one falls faster): a bound; the
            # decode steps' as measured (one token's, at contexts no shorter)
            rest = max((v for k, v in acts.items() if k != "prefill"), default=0.0)
            return max(rest, acts["prefill"] * tokens / self.prompt_len)
        if tokens <= self.prompt_len:
            return measured
        cap = self.max_positions if self.max_positions is not None else COUNT_CAP
        at, counted = min(tokens, cap), None
        if self.count_prefill is not None:  # each length counted once, None where that failed
            if at not in self._counted:
                got = self.count_prefill(at)
                self._counted[at] = None if got is None else float(got)
            counted = self._counted[at]
        if counted is None:
            if not self._warned:  # said once a plan: a figure short of the truth
                self._warned.append(True)
                warn_user(f"modelprof: memory plan: {self.prefill_note}", ModelProfWarning)
            return measured
        return max(measured, counted * max(tokens / cap, 1.0))

    def max_batch(
        self, memory_bytes: float, context: int | None = None, prompt_len: int | None = None
    ) -> int:
        """The largest batch whose weights + KV and token ids at ``context`` + activations fit,
        prompts of ``prompt_len`` tokens (None: as long as the context, the longest a request there
        may bring); a context past the model's ``max_positions`` is refused (none fits the model, as
        :meth:`max_context` never answers one)."""
        memory_bytes = memory_bytes_arg(memory_bytes)
        c = check_int("context", self.context if context is None else context)
        if self.max_positions is not None and c > self.max_positions:
            raise ModelProfError(
                f"context={c!r} is past the model's {self.max_positions} positions "
                "(max_positions): no batch runs at it; max_context(memory_bytes) is the longest "
                "that fits"
            )
        prompt = c if prompt_len is None else check_int("prompt_len", prompt_len)
        if prompt > c:  # (a prompt_len of None: see the class)
            raise ModelProfError(
                f"prompt_len={prompt} is longer than context={c}: a prompt is part of its context"
            )
        free = memory_bytes - self.weights_bytes
        per = self.kv_per_seq_bytes(c) + self.ids_per_token_bytes * c
        per += self.activation_seq_bytes(prompt)
        return max(int(free // per), 0) if per > 0 else 0

    def max_context(
        self, memory_bytes: float, batch: int | None = None, prompt_len: int | None = None
    ) -> int:
        """The longest context at which ``batch`` sequences fit, prompts of ``prompt_len``
        tokens (0 where not even those fit; None: as long as the context, the prefill's
        activations then growing with it, a search over contexts), never past the model's
        ``max_positions`` (``sys.maxsize`` when unknown: then memory alone bounds it)."""
        memory_bytes = memory_bytes_arg(memory_bytes)
        b = self._batch(batch)
        if prompt_len is not None:  # (0: not even the prompts fit)
            prompt = check_int("prompt_len", prompt_len)
            longest = self._longest(memory_bytes, b, self.activation_seq_bytes(prompt))
            return longest if longest >= prompt else 0
        longest = self._longest(memory_bytes, b, self.activation_seq_bytes())
        if longest == self.prompt_len:  # the profiled prompt's, as measured
            return longest

        def fits(c: int) -> bool:
            return self._longest(memory_bytes, b, self.activation_seq_bytes(c)) >= c

        if longest < self.prompt_len:  # a shorter prompt holds less: fits(longest) holds
            low, high = longest, self.prompt_len
        else:
            low, high = self.prompt_len, max(2 * self.prompt_len, 1)  # fits(low): as measured
            while high < longest and fits(high):  # (a prefill at a length far past any that
                low, high = high, 2 * high  # fits is never counted)
            if high >= longest:
                if fits(longest):
                    return longest
                high = longest
        while high - low > 1:  # fits(low), not fits(high)
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low

    def _longest(self, memory_bytes: float, b: int, act: float) -> int:
        """The longest context at which ``b`` sequences with ``act`` bytes of activations each
        fit (:meth:`max_context`'s, for one activation)."""
        free = memory_bytes - self.weights_bytes - b * (act + self.state_per_seq_bytes)
        full = (self.kv_per_token_bytes + self.ids_per_token_bytes) * b  # (ids: every token)
        window = self.window_per_token_bytes * b
        w = self.window_tokens
        if window > 0 and w > 0:
            if free < (full + window) * w:  # runs out inside the window
                return max(int(free // (full + window)), 0)
            free -= window * w
        if free < 0:
            return 0
        limit = self.max_positions if self.max_positions is not None else sys.maxsize
        return limit if full <= 0 else min(int(free // full), limit)

    def fit_text(self, memory_bytes: float) -> str:
        """What fits ``memory_bytes`` in words: the largest batch at the plan's context and the
        longest context at its batch (prompts as long as the context), with the prefill's note
        where the longer prompts' activations could not be counted. ``memory_bytes`` as
        :meth:`max_batch` takes it (a number, or its text: ``"24GB"``)."""
        memory_bytes = memory_bytes_arg(memory_bytes)  # (said as the number it stands for)
        longest, batch = self.max_context(memory_bytes), self.max_batch(memory_bytes)
        note = self.prefill_note  # (read after the counts: one may have failed)
        return (
            f"fits {memory_bytes:,.0f} bytes (prompts as long as the context): batch <= "
            f"{batch} at {self.context} tokens; context <= {longest} tokens at batch "
            f"{self.batch_size}"
            + (" (the model's position limit)" if longest == self.max_positions else "")
            + (f"\nnote: {note}" if note else "")
        )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(
            dataclasses.replace(self, count_prefill=None, _counted={}, _warned=[])
        )
        return {k: v for k, v in out.items() if k not in ("count_prefill", "_counted", "_warned")}


def cache_terms(kv: Any, config: Any, dtype: torch.dtype) -> dict[str, Any]:
    """A :class:`MemoryPlan`'s cache terms from the cache a run held (``kv``) and the config:
    bytes per token of one sequence, split between full and sliding layers by the closed form
    ``C(t) = F t + S min(t, W)`` (``F = C(W + 1) - C(W)``, ``S = C(1) - F``) scaled to the
    bytes held."""
    per_token = 0.0
    if kv is not None:
        per_token = kv.per_token_bytes if not kv.allocated else float(kv.closed_form_per_token or 0)
    dims = model_dims(config)
    terms: dict[str, Any] = {
        "kv_per_token_bytes": float(per_token),
        "max_positions": dims.get("max_positions"),
    }
    window = dims.get("sliding_window")
    closed = (lambda t: closed_form_kv_bytes(config, dtype, t, 1)) if window else None
    if kv is None or not window or window < 2 or closed(1) is None:
        return terms
    w = int(window) - 1
    full = closed(w + 1) - closed(w)
    sliding = closed(1) - full
    if sliding <= 0:  # no layer slides (layer_types all full)
        return terms
    scale = 1.0
    if not kv.allocated and kv.closed_form_bytes:
        scale = (kv.total_bytes - kv.constant_bytes) / kv.closed_form_bytes
    return {
        **terms,
        "kv_per_token_bytes": full * scale,
        "window_per_token_bytes": sliding * scale,
        "window_tokens": w,
    }
