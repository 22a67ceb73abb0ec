"""The prompt's inputs beside random token ids (``profile_generation(..., inputs={...})``): a
vision-language model's ``pixel_values``... and the prompt's own ``input_ids`` with its image
tokens. They go to the prompt's forward only; tensors of batch 1 are repeated to each batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from modelprof.errors import ModelProfError
from modelprof.generation.encoder import is_encoder_decoder
from modelprof.runtime.inputs import check_forward_keys
from modelprof.runtime.tensors import map_tensors

__all__ = ["PromptInputs", "prompt_inputs"]

_IMAGE_TOKEN = ("image_token_id", "image_token_index")


@dataclasses.dataclass(frozen=True)
class PromptInputs:
    """The prompt's own token ids (None: random ones) and its other keyword inputs."""

    ids: torch.Tensor | None = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)

    def ids_for(self, batch: int) -> torch.Tensor | None:
        return None if self.ids is None else _batched("input_ids", self.ids, batch)

    def extras_for(self, batch: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        """The other inputs at ``batch``, on ``device``, floating ones in ``dtype``."""

        def place(name: str, t: torch.Tensor) -> torch.Tensor:
            t = _batched(name, t, batch)
            return t.to(device, dtype if t.is_floating_point() else None)

        return {k: map_tensors(v, lambda t, k=k: place(k, t)) for k, v in self.extras.items()}


def prompt_inputs(
    inputs: Any, model: Any, step: Any, prompt_len: int | None
) -> tuple[PromptInputs, int]:
    """``inputs=`` checked, and the prompt length: the given ids', else ``prompt_len`` (128)."""
    if inputs is None:
        return PromptInputs(), 128 if prompt_len is None else prompt_len
    if step is not None:
        raise ModelProfError(
            "inputs= gives a HuggingFace model's prompt its other inputs; a "
            "step function passes its own (close over them in the step)"
        )
    if not isinstance(inputs, Mapping) or not all(isinstance(k, str) for k in inputs):
        raise ModelProfError(
            f"inputs of type {type(inputs).__name__} must be a dict of the "
            "prompt's keyword inputs, e.g. {'input_ids': ids, "
            "'pixel_values': pixels}"
        )
    check_forward_keys(inputs, model)
    # an encoder-decoder's prompt is its decoder's
    key = "decoder_input_ids" if is_encoder_decoder(model) else "input_ids"
    extras = {k: v for k, v in inputs.items() if k != key}
    ids = inputs.get(key)
    if ids is None and key == "input_ids":
        config = getattr(model, "config", None)
        token = next(
            (getattr(config, n) for n in _IMAGE_TOKEN if getattr(config, n, None) is not None), None
        )
        if token is not None and extras:
            raise ModelProfError(
                f"inputs={sorted(extras)} without input_ids: {type(model).__name__} places the "
                f"image where its prompt has image tokens (id {token}); give the prompt's "
                "input_ids in inputs= too, with as many image tokens as the image becomes"
            )
    if ids is None:
        return PromptInputs(None, extras), 128 if prompt_len is None else prompt_len
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ModelProfError(f"inputs[{key!r}] must be a (batch, tokens) tensor of token ids")
    length = int(ids.shape[1])
    if prompt_len is not None and prompt_len != length:
        raise ModelProfError(
            f"prompt_len={prompt_len!r} contradicts inputs[{key!r}] of "
            f"{length} tokens; leave prompt_len out"
        )
    return PromptInputs(ids, extras), length


def _batched(name: str, t: torch.Tensor, batch: int) -> torch.Tensor:
    """``t`` at ``batch``: as it is, or its one row repeated."""
    if t.dim() == 0 or t.shape[0] == batch:
        return t
    if t.shape[0] != 1:
        raise ModelProfError(
            f"inputs[{name!r}] has batch {t.shape[0]}; give batch 1 (repeated "
            f"to each batch size) or the batch size {batch}"
        )
    return t.repeat(batch, *([1] * (t.dim() - 1)))
