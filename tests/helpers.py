"""Helpers shared by the test files, defined once (import them: ``from helpers import Fn``)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn

from modelprof.timing.agreement import AGREEMENT_TOLERANCE
from modelprof.timing.layers import MemoryStats

__all__ = [
    "FakeAllocator",
    "Fn",
    "MLP_NETS",
    "blocked",
    "latex_headers",
    "picture",
    "state_snapshot",
    "tiny_t5",
    "tv",
]


class Fn(nn.Module):
    """Wraps a function so that functional code runs inside a module call."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def blocked(levels: Any, per_block: int = 20, **kw: Any) -> Any:
    """A Measurement of constant samples at ``levels[b]`` in block b, block b taken at t = b
    seconds (each sample 1 ms after the one before it, so every block's mean time is b +
    const); ``kw`` to Measurement (``stop_reason="precision"`` unless given)."""
    import numpy as np

    from modelprof.timing.measurement import Measurement

    levels = np.asarray(levels, dtype=float)
    blocks = np.repeat(np.arange(levels.size), per_block)
    stamps = blocks + np.tile(np.arange(per_block) * 1e-3, levels.size)
    kw.setdefault("stop_reason", "precision")
    return Measurement(np.repeat(levels, per_block), blocks=blocks, timestamps_s=stamps, **kw)


def tv(name: str, **kw) -> nn.Module:
    """A torchvision model with random weights, in eval mode."""
    import torchvision

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(torchvision.models, name)(weights=None, **kw).eval()


class FakeAllocator:
    """Bytes in use and the peak since the last reset, like the CUDA caching allocator."""

    def __init__(self, base: int = 0) -> None:
        self.cur = self.peak = base

    def alloc(self, n: int) -> None:
        self.cur += n
        self.peak = max(self.peak, self.cur)

    def free(self, n: int) -> None:
        self.cur -= n

    def stats(self) -> MemoryStats:
        def reset() -> None:
            self.peak = self.cur

        return MemoryStats(lambda: self.peak, reset)


def equal_reports(a, b) -> None:
    """Two reports with the very same table, rows (ops per row), per-op totals and notes."""
    import pandas as pd

    pd.testing.assert_frame_equal(a.to_dataframe(), b.to_dataframe())
    assert list(map(repr, a.rows)) == list(map(repr, b.rows))  # ops per row, NaN-safe
    assert a.by_operator().equals(b.by_operator())

    def ops(r):
        return [
            (k, s.calls, s.macs, s.flops, s.madd, dict(s.notes or {})) for k, s in r._by_op.items()
        ]

    assert ops(a) == ops(b)
    assert a.unsupported == b.unsupported and a.model_params == b.model_params


def state_snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter and buffer, by name (compare with ``torch.equal``)."""
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def picture(obj: Any, _seen: set[int] | None = None) -> Any:
    """A comparable picture of ``obj``: tensors by their bytes, sizes, strides, dtype, gradient
    and flags; modules by class, flags, attributes and registries; containers and objects
    recursively (a cycle is marked)."""
    seen = set() if _seen is None else _seen
    if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.dtype, torch.device)):
        return obj
    if id(obj) in seen:
        return ("cycle", type(obj).__name__)
    seen = seen | {id(obj)}
    if isinstance(obj, torch.Tensor):
        return _tensor_picture(obj, seen)
    if isinstance(obj, nn.Module):
        return (
            "module",
            type(obj).__name__,
            obj.training,
            {k: picture(v, seen) for k, v in vars(obj).items()},
        )
    if isinstance(obj, torch.optim.Optimizer):
        return ("optimizer", picture(obj.state_dict(), seen))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [picture(o, seen) for o in obj])
    if isinstance(obj, (set, frozenset)):
        return (type(obj).__name__, sorted(map(repr, obj)))
    if isinstance(obj, dict):
        return ("dict", [(picture(k, seen), picture(v, seen)) for k, v in obj.items()])
    if hasattr(obj, "__dict__") and not callable(obj):
        return (type(obj).__name__, picture(vars(obj), seen))
    return ("object", type(obj).__name__, id(obj))


def _tensor_picture(t: torch.Tensor, seen: set[int]) -> tuple:
    base = t.detach()
    data = base.contiguous().view(-1).view(torch.uint8).clone() if base.numel() else base
    grad = picture(t.grad, seen) if t.is_leaf else None
    return (
        "tensor",
        type(t).__name__,
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.requires_grad,
        bytes(data.numpy().tobytes()) if data.numel() else b"",
        grad,
    )


#: A model file of two MLPs of closed-form cost on a (10,) input, and one that fails on it
#: (``Linear(11, 40)``): what the CLI and sweep tests load as ``nets.py:narrow`` etc.
MLP_NETS = """
from torch import nn
INPUT_SIZE = (10,)
def narrow():
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU())
def wide():
    return nn.Sequential(nn.Linear(10, 40), nn.ReLU())
def broken():
    return nn.Sequential(nn.Linear(11, 40))
"""


def tiny_t5(cls: Any = None) -> nn.Module:
    """A T5 of 3 encoder and 2 decoder layers (so that what is the decoder's is told apart),
    d_model 16, 2 heads of d_kv 4 (inner 8), d_ff 32 (ReLU), vocabulary 64, random weights
    (seed 0); ``cls``: T5ForConditionalGeneration or a subclass."""
    import transformers  # a test extra: imported by the tests that use it

    config = transformers.T5Config(
        vocab_size=64,
        d_model=16,
        d_kv=4,
        d_ff=32,
        num_layers=3,
        num_decoder_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (cls or transformers.T5ForConditionalGeneration)(config).eval()


def tiny_llama(kv_heads: int = 2, device: str = "cpu", **kw: Any) -> nn.Module:
    """A 2-layer Llama with random weights (hidden 64, 4 heads, ``kv_heads`` KV heads,
    vocabulary 128), seeded, in eval mode: the generation tests' language model."""
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        vocab_size=128,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
        **kw,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(cfg).eval()


def latex_headers(tex: str) -> list[str]:
    """A LaTeX table's column headers, each one's lines between ``\\toprule`` and ``\\midrule``
    joined (a name over two lines, its unit below): ``["module", "output shape", "params (M)"]``."""
    head = tex.split("\\toprule")[1].split("\\midrule")[0]
    lines = [line.strip().removesuffix("\\\\").split("&") for line in head.strip().splitlines()]
    return [" ".join(p.strip() for p in parts if p.strip()) for parts in zip(*lines)]


class Clamps(nn.Module):
    """Clamps its weight in place (through ``.data``, which no version counter sees)."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        with torch.no_grad():
            self.l.weight.mul_(10.0)  # so that the clamp below changes it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.l.weight.data.clamp_(-0.01, 0.01)
        return self.l(x)


class WritesLate(nn.Module):
    """Writes its weight in place from its second call on (``scale`` x it, then ``shift`` +):
    the counted (first) pass does not, so no copy of it is kept; the timed passes do."""

    def __init__(self, scale: float = 1.0, shift: float = 0.0) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.note = lambda: None
        self.scale, self.shift = scale, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self.note, "seen", False):
            with torch.no_grad():
                self.l.weight.mul_(self.scale).add_(self.shift)
        self.note.seen = True  # on the function: the guard restores attributes only
        return self.l(x)


def ratio_flag_holds(row: Any, name: str) -> bool:
    """``row``'s ``<name>_rough`` says what its columns show: the ratio ``name`` outside its
    interval (the per-round ratios', symmetric on the log scale: centred on ``sqrt(low
    high)``) and more than ``AGREEMENT_TOLERANCE`` from that centre. True without an
    interval (a single round: nothing to show)."""
    x, lo, hi = row[name], row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return True
    far = abs(math.log(x / math.sqrt(lo * hi))) > math.log1p(AGREEMENT_TOLERANCE)
    return 0 < lo <= hi and bool(row.get(f"{name}_rough", False)) == ((x < lo or x > hi) and far)


def counted_step_generation(**kw: Any) -> Any:
    """A counted (untimed) generation of a step function's model, Embedding(16, 8) then
    Linear(8, 16), prompt 4 + 3 new tokens (``kw``: more of profile_generation's keywords): a
    report the tests give timings of their own."""
    from modelprof import profile_generation

    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    return profile_generation(
        model,
        prompt_len=4,
        new_tokens=3,
        step=lambda tokens, cache: (model(tokens), cache),
        timing=False,
        **kw,
    )
