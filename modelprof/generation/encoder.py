"""An encoder-decoder model's encoder (T5's and BART's source ids, Whisper's log-mel features):
its inputs, given in ``inputs=`` or built from the config (one sequence: Whisper's
``num_mel_bins x 2 max_source_positions`` frames, else ``prompt_len`` source ids), checked
before anything is allocated, and the module that runs it once as the encoder phase.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError

__all__ = ["EncoderModule", "complete_encoder_inputs", "is_encoder_decoder", "source_length"]


def is_encoder_decoder(model: Any) -> bool:
    """A transformers model whose config says it is an encoder-decoder."""
    return getattr(getattr(model, "config", None), "is_encoder_decoder", False) is True


def _main_input(model: Any) -> str:
    return str(getattr(model, "main_input_name", "input_ids"))


def source_length(model: Any, extras: dict[str, Any], prompt_len: int) -> int:
    """The encoder's output length, without allocating: the given source's length, Whisper's
    ``max_source_positions``, else ``prompt_len``; the given inputs are checked here."""
    name, config = _main_input(model), model.config
    value = extras.get(name)
    if name == "input_features":
        positions = getattr(config, "max_source_positions", None)
        mels = int(getattr(config, "num_mel_bins", 0) or 0)
        if not positions or not mels:
            # Speech2Text lays its features out otherwise, and subsamples them by its own rule
            raise ModelProfError(
                f"{type(model).__name__} takes input_features, and its config has no "
                f"{'num_mel_bins' if positions else 'max_source_positions'}: modelprof knows "
                "Whisper's layout (batch, num_mel_bins, 2 x max_source_positions) only, so it "
                "can neither make them up nor tell the encoder's output length"
            )
        frames = 2 * int(positions)
        if value is not None and (
            not isinstance(value, torch.Tensor) or tuple(value.shape[1:]) != (mels, frames)
        ):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ModelProfError(
                f"inputs['input_features'] of shape {shape}: {type(model).__name__} takes "
                f"(batch, num_mel_bins={mels}, 2 x max_source_positions={frames})"
            )
        return frames // 2
    if value is not None:
        if not isinstance(value, torch.Tensor) or value.dim() < 2:
            raise ModelProfError(f"inputs[{name!r}] must be a (batch, length, ...) tensor")
        return int(value.shape[1])
    if name != "input_ids":
        raise ModelProfError(
            f"{type(model).__name__} encodes {name!r}, which modelprof cannot make up; give "
            f"it in inputs={{{name!r}: ...}}"
        )
    return prompt_len


def complete_encoder_inputs(model: Any, extras: dict[str, Any], source_len: int) -> dict[str, Any]:
    """``extras`` with the encoder's main input built from the config when not given."""
    name, config = _main_input(model), model.config
    if name in extras:
        return extras
    gen = torch.Generator().manual_seed(0)
    if name == "input_features":
        value = torch.randn((1, int(config.num_mel_bins), 2 * source_len), generator=gen)
    else:
        vocab = int(getattr(config, "vocab_size", 0) or 0) or 2
        value = torch.randint(0, vocab, (1, source_len), generator=gen)
    return {name: value, **extras}


class EncoderModule(nn.Module):
    """Calls the model's ``get_encoder()``; its children are the model's own, so rows keep the
    names they have in the decoder's phases. The last output is kept (in a box: the state
    guard puts back what a forward adds)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        for name, child in model.named_children():
            self.add_module(name, child)
        self._encoder = model.get_encoder
        self._last: list[Any] = [None]

    @property
    def last(self) -> Any:
        return self._last[0]

    def forward(self, **inputs: Any) -> Any:
        # a ModelOutput, as generate() makes it: the decoder reads it by name
        out = self._encoder()(**{"return_dict": True, **inputs})
        self._last[0] = out
        return out
