"""The KV cache: its bytes per layer read from the real cache objects, the closed form they are
checked against, and the check that a cache was put back after a step.

Closed form per token: ``2 (K and V) x layers x kv_heads x head_dim x bytes per element``
(``kv_heads``: GQA's ``num_key_value_heads``, else the attention heads); MLA configs
(``kv_lora_rank`` set) cache one ``kv_lora_rank + qk_rope_head_dim`` latent per token and layer.
A sliding-window layer holds at most ``sliding_window - 1`` past tokens. Recurrent layers
(Mamba) hold a state of the same bytes at every context, kept apart (``per_layer_state_bytes``)
so that only keys and values grow per token. The measured bytes are the truth (a quantized
cache holds less); the closed form is a comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.inputs import text_config
from modelprof.runtime.tensors import tensor_nbytes

__all__ = [
    "KVCacheInfo",
    "cache_layers",
    "cache_length",
    "check_rewound",
    "closed_form_kv_bytes",
    "closed_form_kv_per_token",
    "kv_info",
    "model_dims",
    "state_layers",
    "text_config",
]


#: each dimension's names in a config: a decoder's, and an encoder-decoder's own (T5's,
#: Whisper's, BART's; its decoder view is missing in transformers 4.46 and has T5's encoder
#: layer count in 5.24)
_DIM_NAMES = {
    "layers": (
        ("num_hidden_layers", "n_layer", "num_layers"),
        ("num_decoder_layers", "decoder_layers", "num_layers"),
    ),
    "heads": (
        ("num_attention_heads", "n_head"),
        ("decoder_attention_heads", "num_heads", "num_attention_heads"),
    ),
    "kv_heads": (("num_key_value_heads", "n_kv_heads", "multi_query_group_num"), ()),
    "head_dim": (("head_dim",), ("d_kv", "head_dim")),
    "hidden": (("hidden_size", "n_embd", "d_model"), ("d_model", "hidden_size")),
    "sliding_window": (("sliding_window",), ()),
    "max_positions": (
        ("max_position_embeddings", "n_positions", "n_ctx"),
        ("max_target_positions", "max_position_embeddings"),
    ),
}


def _first(config: Any, names: tuple[str, ...]) -> Any:
    """The first of ``names`` the config sets (not None), else None."""
    return next((v for v in (getattr(config, n, None) for n in names) if v is not None), None)


def model_dims(config: Any) -> dict[str, int | None]:
    """Layers, heads, KV heads, head dim, hidden size, sliding window and positions of a
    transformers config, under any of its namings (an encoder-decoder's: its decoder's); all
    None without a config."""
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if encoder_decoder and hasattr(getattr(config, "decoder", None), "to_dict"):
        return model_dims(config.decoder)  # a composite (EncoderDecoderConfig): its decoder's own
    if not encoder_decoder:
        config = text_config(config)
    side = 1 if encoder_decoder else 0  # which of each dimension's two name lists
    d = {k: _first(config, names[side]) for k, names in _DIM_NAMES.items()}
    heads, hidden = d["heads"], d["hidden"]
    d["kv_heads"] = d["kv_heads"] or heads
    d["head_dim"] = d["head_dim"] or (hidden // heads if hidden and heads else None)
    if not encoder_decoder and getattr(config, "multi_query", False):
        d["kv_heads"] = 1
    # Falcon's new architecture caches its K and V broadcast to every head
    if not encoder_decoder and getattr(config, "new_decoder_architecture", False) and heads:
        d["kv_heads"] = heads
    return d


def _layer_token_elements(config: Any) -> int | None:
    """Elements one layer caches per token: the MLA latent (whose ``head_dim`` is the rope part
    only), else K and V ``2 x kv_heads x head_dim``; None when unknown."""
    text = text_config(config)
    rank, rope = getattr(text, "kv_lora_rank", None), getattr(text, "qk_rope_head_dim", None)
    if rank is not None and rope is not None:
        return int(rank) + int(rope)
    d = model_dims(config)
    if None in (d["kv_heads"], d["head_dim"]):
        return None
    return 2 * d["kv_heads"] * d["head_dim"]


def closed_form_kv_per_token(config: Any, dtype: torch.dtype) -> int | None:
    """The closed form of one token (:func:`closed_form_kv_bytes`), or None."""
    return closed_form_kv_bytes(config, dtype, 1, 1)


def closed_form_kv_bytes(
    config: Any, dtype: torch.dtype, tokens: int, batch_size: int
) -> int | None:
    """What a cache of ``tokens`` tokens should hold, per layer kind of the config's
    ``layer_types`` (others hold none), else every layer sliding when ``sliding_window`` is set."""
    d, elements = model_dims(config), _layer_token_elements(config)
    if d["layers"] is None or elements is None:
        return None
    text = text_config(config)
    window = d["sliding_window"]
    kinds = (
        getattr(text, "layer_types", None)
        or [("sliding_attention" if window else "full_attention")] * d["layers"]
    )
    per_token = elements * dtype.itemsize * batch_size
    total = 0
    for kind in list(kinds)[: d["layers"]]:
        if kind == "sliding_attention" and window:
            total += per_token * min(tokens, window - 1)
        elif kind in ("full_attention", "chunked_attention"):
            total += per_token * tokens
    return total


def held_cache(cache: Any) -> Any:
    """The cache in a step's cache value: itself, or the one cache in a tuple or list."""
    if isinstance(cache, (tuple, list)) and not hasattr(cache, "layers"):
        found = [c for c in cache if _is_cache(c)]
        if len(found) == 1:
            return found[0]
    return cache


def cross_layers(cache: Any) -> list[list[torch.Tensor]]:
    """The cross-attention tensors of each layer (an ``EncoderDecoderCache``'s second cache)."""
    subs = _sub_caches(held_cache(cache))
    return cache_layers(subs[1]) if len(subs) == 2 else []


def cache_layers(cache: Any) -> list[list[torch.Tensor]]:
    """The tensors each layer of ``cache`` holds (an HF ``Cache``, or a list of layers)."""
    if cache is None:
        return []
    cache = held_cache(cache)
    subs = _sub_caches(cache)
    if subs:  # a cache of caches (self- and cross-attention): their layers side by side
        return [sum(ts, []) for ts in zip(*map(cache_layers, subs))]
    listed = compat.cache_layer_tensors(cache)  # transformers before 4.56
    if listed is not None:
        return listed
    layers = getattr(cache, "layers", None)
    if layers is None and isinstance(cache, (list, tuple)):
        layers = cache
    if layers is None:  # an older MambaCache: its states per layer; else whatever it holds
        return state_layers(cache) or [list(_tensors(cache))]
    return [list(_tensors(layer)) for layer in layers]


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        if obj.numel() > 1:  # position counters are not cached states
            yield obj
        return
    if depth > 3:
        return
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o, depth + 1)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o, depth + 1)
    elif (
        hasattr(obj, "keys")
        and hasattr(obj, "values")
        and not callable(obj.keys)
        or any(hasattr(obj, n) for n in _STATES)
    ):
        for o in (getattr(obj, n, None) for n in ("keys", "values", *_STATES)):
            yield from _tensors(o, depth + 1)


#: where a recurrent layer (``LinearAttentionLayer``, an older ``MambaCache``) keeps its state
_STATES = ("conv_states", "recurrent_states", "ssm_states")


def state_layers(cache: Any) -> list[list[torch.Tensor]]:
    """The recurrent-state tensors of each layer of ``cache`` (empty for an attention layer)."""
    cache = held_cache(cache)
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [list(_tensors([getattr(layer, n, None) for n in _STATES])) for layer in layers]
    per_state = [getattr(cache, n, None) for n in _STATES]
    per_state = [s for s in per_state if isinstance(s, (list, tuple, torch.Tensor))]
    if not per_state:
        return []
    return [list(_tensors([s[i] for s in per_state])) for i in range(len(per_state[0]))]


@dataclasses.dataclass(frozen=True)
class KVCacheInfo:
    """Bytes a cache holds after ``tokens`` tokens of ``batch_size`` sequences, per layer:
    keys and values (growing with the context), recurrent states and cross-attention."""

    per_layer_bytes: tuple[int, ...]
    tokens: int
    batch_size: int
    closed_form_per_token: int | None
    allocated: bool = False  # a preallocated (static) cache: bytes are its capacity
    closed_form_bytes: int | None = None  # the whole cache, sliding windows included
    per_layer_state_bytes: tuple[int, ...] = ()  # of ``per_layer_bytes``, recurrent states
    per_layer_cross_bytes: tuple[int, ...] = ()  # of ``per_layer_bytes``, cross-attention
    cross_tokens: int = 0  # the encoder's tokens the cross-attention holds (its length)

    @property
    def total_bytes(self) -> int:
        return sum(self.per_layer_bytes)

    @property
    def state_bytes(self) -> int:
        """Recurrent states: constant in the context."""
        return sum(self.per_layer_state_bytes)

    @property
    def cross_bytes(self) -> int:
        """Cross-attention keys and values: constant in the context."""
        return sum(self.per_layer_cross_bytes)

    @property
    def constant_bytes(self) -> int:
        """States and cross-attention."""
        return self.state_bytes + self.cross_bytes

    @property
    def per_token_bytes(self) -> float:
        """Measured key and value bytes per token of one sequence."""
        return (self.total_bytes - self.constant_bytes) / (self.batch_size * self.tokens)

    @property
    def matches_closed_form(self) -> bool | None:
        """Keys and values equal the closed form (None: a static cache, or no closed form)."""
        if self.closed_form_bytes is None or self.allocated:
            return None
        return self.total_bytes - self.constant_bytes == self.closed_form_bytes

    def to_dict(self) -> dict[str, Any]:
        """Every field and figure, tuples as lists (in a fixed order: the exports' columns)."""
        values = {k: getattr(self, k) for k in _KV_FIELDS}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


_KV_FIELDS = (
    "tokens batch_size total_bytes per_token_bytes state_bytes cross_bytes cross_tokens "
    "per_layer_state_bytes per_layer_cross_bytes closed_form_per_token closed_form_bytes "
    "matches_closed_form allocated per_layer_bytes"
).split()


def kv_info(
    cache: Any, tokens: int, batch_size: int, config: Any, dtype: torch.dtype
) -> KVCacheInfo:
    """What ``cache`` holds beside the closed form of ``config``."""
    crossed = cross_layers(cache)
    cross = tuple(sum(map(tensor_nbytes, ts)) for ts in crossed)
    if cross:  # the decoder's own tokens
        tokens = cache_length(_sub_caches(held_cache(cache))[0]) or tokens
    # keys (batch, heads, source tokens, head_dim): the encoder's length
    source = next((int(ts[0].shape[-2]) for ts in crossed if ts and ts[0].dim() >= 2), 0)
    per_layer = tuple(sum(map(tensor_nbytes, ts)) for ts in cache_layers(cache))
    states = tuple(sum(map(tensor_nbytes, ts)) for ts in state_layers(cache))
    static = any(
        type(layer).__name__.startswith("Static") for layer in getattr(cache, "layers", ()) or ()
    )
    return KVCacheInfo(
        per_layer,
        tokens,
        batch_size,
        closed_form_kv_per_token(config, dtype),
        allocated=static,
        closed_form_bytes=closed_form_kv_bytes(config, dtype, tokens, batch_size),
        per_layer_state_bytes=states,
        per_layer_cross_bytes=cross,
        cross_tokens=source,
    )


def _is_cache(obj: Any) -> bool:
    """An HF ``Cache``, or one that looks like it."""
    return not isinstance(obj, (type, torch.Tensor)) and (
        hasattr(obj, "layers") or callable(getattr(obj, "get_seq_length", None))
    )


def _sub_caches(cache: Any) -> list[Any]:
    """The caches an ``EncoderDecoderCache`` holds (self-, then cross-attention), else []."""
    return [v for v in compat.cache_attributes(cache).values() if _is_cache(v)]


def cache_length(cache: Any) -> int | None:
    """Tokens in an HF cache (``get_seq_length``), or None when it cannot say."""
    get = getattr(cache, "get_seq_length", None)
    if get is None:
        return None
    try:
        return int(get())
    except Exception:  # noqa: BLE001 - a custom cache that cannot answer
        return None


def check_rewound(cache: Any, expected: int | None, what: str) -> None:
    """After a ``Snapshot``'s restore the cache must hold ``expected`` tokens again."""
    got = cache_length(cache)
    if expected is not None and got is not None and got != expected:
        raise ModelProfError(
            f"{what}: the cache holds {got} tokens after being put back to "
            f"{expected}; the step changes it in a way modelprof cannot undo "
            "(return a new cache instead of mutating the one passed in)"
        )
