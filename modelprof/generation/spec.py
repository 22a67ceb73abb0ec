"""What a generation run is: prompt length, new tokens, batch sizes, the decode contexts to
profile and the cache to use, checked once at the boundary (``GenerationSpec.parse``)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from modelprof.errors import ModelProfError, check_int, is_int

__all__ = ["CacheMode", "GenerationSpec", "counts_last_token", "default_contexts"]


class CacheMode(str, enum.Enum):
    """How past keys and values are kept between steps."""

    DYNAMIC = "dynamic"  # grows by concatenation (HF ``DynamicCache``), or the step's own cache
    STATIC = "static"  # preallocated to the final length (HF ``StaticCache``)
    NONE = "none"  # no cache: every step recomputes the whole prefix

    @classmethod
    def parse(cls, value: Any) -> CacheMode:
        if isinstance(value, CacheMode):
            return value
        if value is None or value is False:
            return cls.NONE
        if value is True:
            return cls.DYNAMIC
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ModelProfError(
                f"cache={value!r} must be one of {[m.value for m in cls]} (or True/False)"
            ) from None


def _int_list(name: str, value: Any) -> tuple[int, ...]:
    items = [value] if is_int(value) else value
    if isinstance(items, str) or not isinstance(items, Sequence) or not items:
        raise ModelProfError(f"{name}={value!r} must be an int >= 1 or a non-empty list of them")
    bad = [v for v in items if not is_int(v) or v < 1]
    if bad:  # a list named whole, with the bad item in it
        if is_int(value):
            raise ModelProfError(f"{name}={value!r} must be an int >= 1")
        raise ModelProfError(f"{name}={value!r}: {bad[0]!r} is not an int >= 1")
    got = tuple(int(v) for v in items)
    twice = sorted({v for v in got if got.count(v) > 1})
    if twice:  # (a report holds one figure per value: a second would be merged in silence)
        raise ModelProfError(f"{name}={list(got)} names {twice[0]} twice; give each value once")
    return got


def default_contexts(prompt_len: int, new_tokens: int) -> tuple[int, ...]:
    """The cache lengths of the first, middle and last decode step: the step that makes token
    ``i + 1`` (``i >= 1``) runs with ``prompt_len + i - 1`` tokens in the cache."""
    last = prompt_len + max(new_tokens - 2, 0)
    return tuple(sorted({prompt_len, (prompt_len + last) // 2, last}))


def counts_last_token(config: Any) -> bool:
    """The model's own ``generate`` refuses prompt + new tokens past its positions, though the
    last token is never fed (Whisper's checks ``max_target_positions`` so)."""
    return getattr(config, "model_type", None) == "whisper"


@dataclasses.dataclass(frozen=True)
class GenerationSpec:
    """The checked options of one ``profile_generation`` run."""

    prompt_len: int
    new_tokens: int
    batch_sizes: tuple[int, ...]
    contexts: tuple[int, ...]
    cache: CacheMode

    @classmethod
    def parse(
        cls,
        prompt_len: Any,
        new_tokens: Any,
        batch_size: Any = 1,
        contexts: Any = None,
        cache: Any = "dynamic",
        max_positions: int | None = None,
        positions: str = "positions",
        whole: bool = False,
    ) -> GenerationSpec:
        """Check every option; ``max_positions`` (the model's, named ``positions`` in an
        error) bounds prompt + new tokens - 1 (the positions the tokens fed take), or prompt +
        new tokens with ``whole`` (a model whose own ``generate`` says so: Whisper's)."""
        p = check_int("prompt_len", prompt_len)
        n = check_int("new_tokens", new_tokens)
        batches = _int_list("batch_size", batch_size)
        ctx = (
            default_contexts(p, n)
            if contexts is None
            else tuple(sorted(_int_list("contexts", contexts)))
        )
        if max_positions is not None:
            if p > max_positions:
                raise ModelProfError(
                    f"prompt_len={p} does not fit the model's {max_positions} {positions}"
                )
            # the last new token is produced, never fed: the last step runs at p + n - 2 tokens
            # in the cache and needs p + n - 1 positions (as a decode step's context below);
            # Whisper's generate() refuses p + n past its positions all the same (``whole``)
            need = p + n if whole else p + n - 1
            if need > max_positions:
                why = (
                    "its generate() counts the last token too"
                    if whole
                    else ("the last token is produced, never fed")
                )
                raise ModelProfError(
                    f"prompt_len={p} + new_tokens={n} needs {need} positions ({why}), more "
                    f"than the model's {max_positions} {positions}"
                )
            over = [c for c in ctx if c + 1 > max_positions]
            if over and contexts is None:  # new_tokens=1 at a prompt filling every position
                raise ModelProfError(
                    f"new_tokens={n} runs no decode step, and the one profiled by default (at "
                    f"context prompt_len={p}) needs {p + 1} positions, the model has "
                    f"{max_positions} {positions}; pass contexts= below {max_positions}"
                )
            if over:
                raise ModelProfError(
                    f"contexts={list(ctx)}: a decode step at {over[0]} needs "
                    f"{over[0] + 1} positions, the model has {max_positions} {positions}"
                )
        return cls(p, n, batches, ctx, CacheMode.parse(cache))

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.new_tokens

    @property
    def static_cache_len(self) -> int:
        """The tokens of the ``StaticCache`` transformers' ``generate()`` allocates for this run:
        ``max_length - 1``, the prompt and every new token but the last, which is never fed
        (``_prepare_cache_for_generation``, 4.56 to 5.24 alike). A static cache's attention runs
        over all of it, so its size is part of every step's cost, not only its content's."""
        return self.prompt_len + self.new_tokens - 1

    def cache_room(self, context: int) -> int:
        """The static cache a decode step at ``context`` is counted on: the generation's
        (:attr:`static_cache_len`), or for a context past it one just large enough, its
        ``context`` tokens and the step's own: never sized by the other contexts asked."""
        return max(self.static_cache_len, context + 1)

    @property
    def past_static_cache(self) -> tuple[int, ...]:
        """The contexts a static cache's step is counted on a cache of its own for: past the
        generation's (:meth:`cache_room`); none with another cache."""
        if self.cache is not CacheMode.STATIC:
            return ()
        return tuple(c for c in self.contexts if c + 1 > self.static_cache_len)
