"""One interface over a HuggingFace causal LM (its own ``generate`` and caches) and a user's
``step(tokens, cache) -> (logits, cache)``, with or without a cache. The model and its configs
are never changed: ``generate`` gets a copied generation config."""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.generation.cache import text_config
from modelprof.generation.encoder import EncoderModule, is_encoder_decoder
from modelprof.generation.prompt import PromptInputs
from modelprof.generation.spec import CacheMode
from modelprof.runtime import compat
from modelprof.runtime.inputs import ModelInputs, decoder_start
from modelprof.runtime.placement import runs_as_is

__all__ = [
    "LanguageModel",
    "StepModule",
    "decoder_start",
    "encoder_only",
    "greedy_next",
    "inner_hf_model",
    "is_config",
    "is_hf_model",
    "is_hf_causal_lm",
    "language_model",
    "outputs_by_name",
]

Stamp = Callable[[], None]


def is_hf_causal_lm(model: Any) -> bool:
    """A transformers model with a config and ``generate`` (no import of transformers)."""
    return (
        isinstance(model, nn.Module)
        and hasattr(model, "config")
        and callable(getattr(model, "generate", None))
        and hasattr(model, "generation_config")
    )


def encoder_only(model: nn.Module) -> bool:
    """A transformers model (or the one inside ``model``) whose one config says it does not
    decode (BERT's and RoBERTa's ``is_decoder=False``, XLM's ``is_encoder``), and whose
    layers that read that flag say so too: an encoder, which keeps no KV cache. A config of
    parts (an audio encoder beside a text decoder, an encoder-decoder) is judged by its parts:
    not here."""
    hf = model if is_hf_model(model) else inner_hf_model(model)
    config = getattr(hf, "config", None)
    said = getattr(config, "is_decoder", None)
    if said is None and getattr(config, "is_encoder", None) is True:
        # XLM's and Flaubert's word for it (transformers 5 has no is_decoder); causal=True is
        # their causal LM (is_encoder=False cannot be built: "XLM can only be used as an encoder")
        said = bool(getattr(config, "causal", False))
    if hf is None or said is not False:
        return False
    if getattr(config, "is_encoder_decoder", False) or any(map(is_config, vars(config).values())):
        return False
    flags = [getattr(m, "is_decoder", None) for m in hf.modules()]
    flags = [f for f in flags if isinstance(f, bool)]
    return bool(flags) and not any(flags)


def inner_hf_model(model: nn.Module) -> nn.Module | None:
    """The first transformers model inside a user's ``model``."""
    return next((m for m in model.modules() if m is not model and is_hf_model(m)), None)


def is_hf_model(module: nn.Module) -> bool:
    """A transformers model (its class names a ``base_model_prefix``, with a config)."""
    return hasattr(type(module), "base_model_prefix") and is_config(getattr(module, "config", None))


def is_config(obj: Any) -> bool:
    return hasattr(obj, "to_dict") and hasattr(obj, "model_type") and not isinstance(obj, type)


def greedy_next(logits: Any, what: str) -> torch.Tensor:
    """The argmax token of the last position, ``(batch, 1)``; bad logits are named."""
    if not isinstance(logits, torch.Tensor) or logits.dim() not in (2, 3):
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ModelProfError(
            f"{what} returned logits {shape}; expected a tensor of shape "
            "(batch, tokens, vocab) or (batch, vocab)"
        )
    last = logits[:, -1] if logits.dim() == 3 else logits
    return last.argmax(-1, keepdim=True)


class StepModule(nn.Module):
    """The module the passes call for a step function; its child ``model`` carries the hooks."""

    def __init__(self, step: Callable[..., Any], model: nn.Module | None) -> None:
        super().__init__()
        self._step = step
        # boxes set here: the state guard puts back any attribute a forward adds; the counting
        # pass keeps no output, so the last is kept; the calls and phase, for an error
        self._last: list[Any] = [None]
        self._calls: list[Any] = [0, "the run"]
        if model is not None:
            self.model = model

    @property
    def last(self) -> Any:
        return self._last[0]

    def phase(self, label: str) -> None:
        """Name the phase the next calls belong to (``prefill``, ``decode at context 70``)."""
        self._calls[1] = label

    def forward(self, tokens: torch.Tensor, cache: Any = None) -> Any:
        self._calls[0] += 1
        try:
            out = self._step(tokens, cache)
        except ModelProfError:
            raise
        except Exception as e:
            name = getattr(self._step, "__qualname__", type(self._step).__name__)
            raise ModelProfError(
                f"step function {name} raised at its call {self._calls[0]} (in {self._calls[1]}"
                f", tokens {tuple(tokens.shape)}): {type(e).__name__}: {e}"
            ) from e
        self._last[0] = out
        return out


class LanguageModel:
    """A model made ready for generation: one ``step``, its cache, the module and inputs the
    passes call, and ``generate`` (one greedy run, stamped per token)."""

    def __init__(
        self,
        model: nn.Module | None,
        step: Callable[..., Any] | None,
        cache: CacheMode,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.model, self.cache = model, cache
        self.device, self.dtype = device, dtype
        self.hf = step is None and is_hf_causal_lm(model)
        self.runs_as_is = _runs_as_is(model, device, dtype)
        self.config = getattr(model, "config", None)
        self.root: nn.Module = model if self.hf else StepModule(step, model)
        self.cache_arg: str | None = None
        self.prompt_inputs = PromptInputs()
        named = getattr(step, "__name__", type(step).__name__)
        # the model through the user's step (a step named "step" read "step step")
        self.name = type(model).__name__ if step is None else f"{named}()"
        if step is not None and model is not None:
            self.name = f"{type(model).__name__} via {self.name}"
        #: an encoder-decoder's encoder; what it made per batch size (``keep_encoded``)
        self.encoder = EncoderModule(model) if self.hf and is_encoder_decoder(model) else None
        self.encoded: dict[int, dict[str, Any]] = {}
        self.decoder_start: int | None = None
        self.logits_to_keep = False
        if self.hf:
            self._check_hf()
        elif cache is CacheMode.STATIC:
            raise ModelProfError(
                "cache='static' is for HuggingFace models; a step function "
                "keeps its own cache (cache='dynamic') or none (cache=None)"
            )

    def _check_hf(self) -> None:
        """Refuse, before anything runs, a HuggingFace run that cannot be made."""
        model, cache, name = self.model, self.cache, self.name
        if self.encoder is not None:
            self._check_encoder_decoder()
        self.logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache_arg = compat.cache_argument(model.forward)
        if cache is not CacheMode.NONE and self.cache_arg is None:
            names = " or ".join(compat.CACHE_ARGUMENTS)
            raise ModelProfError(
                f"cache={cache.value!r}: {name} takes no KV cache "
                f"({names}); pass cache=None to run it without a cache"
            )
        if cache is CacheMode.STATIC:
            compat.require(
                "cache='static' (a StaticCache put back between measured steps)",
                "transformers",
                compat.STATIC_CACHE_REWINDS,
            )
        supports = getattr(model, "_supports_default_dynamic_cache", None)
        if cache is not CacheMode.NONE and callable(supports) and not supports():
            raise ModelProfError(
                f"cache={cache.value!r}: {name} does not support "
                "transformers Cache objects; pass cache=None, or step="
            )
        if cache is CacheMode.NONE and self.device.type == "meta":
            raise ModelProfError(
                f"cache=None on device='meta': {name} without a cache reads the values "
                "of its position ids (transformers checks them for packed sequences), "
                "which meta tensors do not have; run cache=None on a real device, or count "
                "on meta with cache='dynamic' or 'static'"
            )

    def _check_encoder_decoder(self) -> None:
        if self.cache is CacheMode.STATIC:
            raise ModelProfError(
                f"cache='static': {self.name} is an encoder-decoder model, run with a dynamic "
                "self-attention cache beside its cross-attention cache (cache='dynamic'), or "
                "none (cache=None); a static pair is not built"
            )
        self.decoder_start = decoder_start(self.model)
        fix = (
            "set model.generation_config.decoder_start_token_id (on the command line: add "
            ",decoder_start_token_id=N to the SPEC)"
        )
        if self.decoder_start is None:
            raise ModelProfError(
                f"{self.name} is an encoder-decoder model whose generation config and config "
                "name no decoder_start_token_id, bos_token_id or pad_token_id of 0 or more: its "
                f"decoder has no token to start from; {fix}"
            )
        vocab = decoder_vocab(self.model)
        if vocab is not None and self.decoder_start >= vocab:
            raise ModelProfError(
                f"{self.name}'s decoder would start from token {self.decoder_start}, outside its "
                f"vocabulary of {vocab} (ids 0 to {vocab - 1}); {fix}"
            )

    def kwargs(self, tokens: torch.Tensor, cache: Any, prompt: bool = False) -> dict[str, Any]:
        """The root module's call for one step (``prompt``: with the prompt's other inputs)."""
        if not self.hf:
            return {"tokens": tokens, "cache": cache}
        kw: dict[str, Any] = {"input_ids": tokens, "use_cache": self.cache is not CacheMode.NONE}
        if self.encoder is not None:
            kw = {"decoder_input_ids": kw.pop("input_ids"), **kw}
            kw.update(self.encoded[int(tokens.shape[0])])
        elif prompt:
            kw.update(self.encoder_inputs(int(tokens.shape[0])))
        if self.cache is not CacheMode.NONE:
            kw[self.cache_arg] = cache
        if self.logits_to_keep:
            kw["logits_to_keep"] = 1  # as generate() asks
        return kw

    def phase(self, label: str) -> None:
        """Name the phase of the next calls, for a step function's error."""
        if isinstance(self.root, StepModule):
            self.root.phase(label)

    def inputs(self, tokens: torch.Tensor, cache: Any, prompt: bool = False) -> ModelInputs:
        return ModelInputs(
            (), self.kwargs(tokens, cache, prompt), self.device, self.dtype, int(tokens.shape[0])
        )

    def step(
        self, tokens: torch.Tensor, cache: Any, prompt: bool = False
    ) -> tuple[torch.Tensor, Any]:
        """``(logits, cache)`` of one forward over ``tokens`` after ``cache``. A step function
        runs through its module's ``forward``: no hook is on that module here (the timed
        generations, the cache's growth), and a module call would only add to their time."""
        if not self.hf:
            return self.checked(self.root.forward(tokens, cache))
        out = self.root(**self.kwargs(tokens, cache, prompt))
        return out.logits, compat.output_cache(out)

    def checked(self, out: Any) -> tuple[torch.Tensor, Any]:
        """A step function's output, which must be ``(logits, cache)``."""
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            got = type(out).__name__ + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
            raise ModelProfError(f"{self.name} returned {got}; it must return (logits, cache)")
        return out[0], out[1]

    def new_cache(self, batch_size: int, max_len: int) -> Any:
        """An empty cache of the run's kind (None for a step function)."""
        if not self.hf or self.cache is CacheMode.NONE:
            return None
        if self.encoder is not None:
            return compat.new_encoder_decoder_cache()
        return compat.new_hf_cache(
            self.cache.value, self.config, batch_size, max_len, self.device, self.dtype
        )

    def tokens(self, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """Random token ids (the values change nothing counted or timed)."""
        vocab = int(getattr(self.config, "vocab_size", 0) or 0) or 2
        ids = torch.randint(0, vocab, (batch_size, length), generator=generator)
        return ids.to(self.device)

    def prompt(self, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """The prompt's token ids: those given in ``inputs=``, else random ones."""
        ids = self.prompt_inputs.ids_for(batch_size)
        if ids is not None:
            return ids.to(self.device)
        ids = self.tokens(batch_size, length, generator)
        if self.decoder_start is not None:
            ids[:, 0] = self.decoder_start
        return ids

    def encoder_inputs(self, batch_size: int) -> dict[str, Any]:
        """The prompt's other inputs (an encoder-decoder's: its encoder's) at ``batch_size``, on
        the run's device and dtype."""
        return self.prompt_inputs.extras_for(batch_size, self.device, self.dtype)

    def keep_encoded(self, batch_size: int, output: Any) -> None:
        """What the decoder's steps at ``batch_size`` read, as generate() hands it on: the
        encoder's ModelOutput (``encoder_outputs``) and the source's attention mask, if any."""
        kept = {"encoder_outputs": output}
        mask = self.encoder_inputs(batch_size).get("attention_mask")
        if mask is not None:
            kept["attention_mask"] = mask
        self.encoded[batch_size] = kept

    def generate(self, prompt: torch.Tensor, new_tokens: int, stamp: Stamp) -> None:
        """Generate exactly ``new_tokens`` greedily; ``stamp()`` after each token is ready."""
        if self.hf:
            self._hf_generate(prompt, new_tokens, stamp)
            return
        recompute = self.cache is CacheMode.NONE  # the whole sequence again every step
        seq, cache = prompt, None
        for _ in range(new_tokens):
            logits, out = self.step(seq, cache)
            tok = greedy_next(logits, self.name)
            seq, cache = (torch.cat([seq, tok], dim=1), None) if recompute else (tok, out)
            stamp()

    def generation_config(self, new_tokens: int) -> Any:
        """A copy of the model's generation config for greedy decoding of exactly
        ``new_tokens`` with the run's cache: no EOS (``min_new_tokens`` alone lets an all-EOS
        model stop after one), time or string limit stops it."""
        gc = copy.deepcopy(self.model.generation_config)
        gc.max_new_tokens = new_tokens
        gc.min_new_tokens = gc.max_length = gc.min_length = gc.max_time = gc.stop_strings = None
        gc.do_sample, gc.num_beams, gc.num_return_sequences = False, 1, 1
        gc.temperature = gc.top_p = gc.top_k = None
        gc.use_cache = self.cache is not CacheMode.NONE
        gc.cache_implementation = "static" if self.cache is CacheMode.STATIC else None
        # the static cache sized for this run alone, as its steps are counted
        # (spec.static_cache_len): no floor from the model's config (``max_cache_len``, 5.24);
        # 0, not None, which generate() fills from the model's own config
        if self.cache is CacheMode.STATIC and getattr(gc, "max_cache_len", None) is not None:
            gc.max_cache_len = 0
        if gc.pad_token_id is None:
            eos = gc.eos_token_id
            gc.pad_token_id = (eos[0] if isinstance(eos, (list, tuple)) else eos) or 0
        gc.eos_token_id = []  # not None: generate() fills None from the model's own config
        if self.decoder_start is not None:
            gc.decoder_start_token_id = self.decoder_start
        return gc

    def _hf_generate(self, prompt: torch.Tensor, new_tokens: int, stamp: Stamp) -> None:
        streamer = _Streamer(stamp)
        kw = dict(generation_config=self.generation_config(new_tokens), streamer=streamer)
        kw.update(self.encoder_inputs(int(prompt.shape[0])))
        if self.encoder is not None:  # the extras are the encoder's; the prompt is the decoder's
            with _own_settings_unsaid():
                self.model.generate(decoder_input_ids=prompt, **kw)
            # Whisper's generate (5.24) returns the new tokens without the decoder's prompt
            made = streamer.tokens
        else:
            out = self.model.generate(prompt, attention_mask=torch.ones_like(prompt), **kw)
            made = out.shape[1] - prompt.shape[1]
        if made != new_tokens or streamer.tokens != new_tokens:
            raise ModelProfError(
                f"{self.name}.generate made {made} tokens where new_tokens={new_tokens} were asked"
            )


def decoder_vocab(model: Any) -> int | None:
    """The rows of an encoder-decoder's decoder embedding, else ``vocab_size``, else None."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    embed = getattr(decoder, "get_input_embeddings", None)
    with contextlib.suppress(NotImplementedError, AttributeError):
        rows = getattr(embed(), "num_embeddings", None) if callable(embed) else None
        if isinstance(rows, int):
            return rows
    vocab = getattr(text_config(getattr(model, "config", None)), "vocab_size", None)
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None


@contextlib.contextmanager
def outputs_by_name(model: Any) -> Iterator[None]:
    """Configs saying ``return_dict=False`` set to ``True`` meanwhile: outputs are read by name."""
    configs = {}
    for module in model.modules() if isinstance(model, nn.Module) else ():
        config = getattr(module, "config", None)
        if getattr(config, "return_dict", True) is False:
            configs[id(config)] = config
    for config in configs.values():
        config.return_dict = True
    try:
        yield
    finally:
        for config in configs.values():
            config.return_dict = False


#: transformers' warnings about modelprof's own call of (Whisper's) generate, said every time
_OWN_SETTINGS = ("`max_new_tokens` (=", "Passing `generation_config` together with")


def _not_own_setting(record: logging.LogRecord) -> bool:
    return not any(s in str(record.msg) for s in _OWN_SETTINGS)


@contextlib.contextmanager
def _own_settings_unsaid() -> Iterator[None]:
    """transformers' generation logger, without the warnings :data:`_OWN_SETTINGS` names."""
    logger = logging.getLogger("transformers.generation.utils")
    logger.addFilter(_not_own_setting)
    try:
        yield
    finally:
        logger.removeFilter(_not_own_setting)


def _runs_as_is(model: nn.Module | None, device: torch.device, dtype: torch.dtype) -> bool:
    """The counting pass runs the model without a converted copy: it is on ``device`` in
    ``dtype`` by the counting pass's own rule (:func:`runs_as_is`), or it has no parameter."""
    return (
        model is None
        or next(iter(model.parameters()), None) is None
        or runs_as_is(model, device, dtype)
    )


class _Streamer:
    """``generate``'s streamer: its first ``put`` is the prompt, each later one a new token."""

    def __init__(self, stamp: Stamp) -> None:
        self.stamp, self.tokens, self.prompt_seen = stamp, 0, False

    def put(self, value: Any) -> None:
        if self.prompt_seen:
            self.tokens += 1
            self.stamp()
        self.prompt_seen = True

    def end(self) -> None:
        pass


def language_model(
    model: Any, step: Any, cache: CacheMode, device: Any, dtype: Any
) -> LanguageModel:
    """Check what the user passed and wrap it."""
    if step is not None and not callable(step):
        raise ModelProfError(
            f"step={step!r} is not callable; it must be step(tokens, cache) -> (logits, cache)"
        )
    if model is not None and not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module")
    if step is None and not is_hf_causal_lm(model):
        raise ModelProfError(
            f"model={type(model).__name__} is not a HuggingFace causal LM "
            "(no config/generate); pass step=lambda tokens, cache: "
            "(logits, cache) for any other model"
        )
    if step is None and encoder_only(model):  # (transformers only logs it, and runs it)
        flags = ("is_decoder=False", "is_decoder=True"), ("causal=False", "causal=True")
        said, fix = flags[not hasattr(model.config, "is_decoder")]
        raise ModelProfError(
            f"model={type(model).__name__} is built bidirectional (config.{said}), not as a "
            f"causal LM: it keeps no KV cache and its tokens see later ones; build it with "
            f"config.{fix} (on the command line: add {fix} to the config SPEC)"
        )
    return LanguageModel(model, step, cache, device, dtype)
