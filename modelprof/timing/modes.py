"""How the timed callable runs: eval/no_grad, AMP, channels_last, torch.compile, CUDA graphs and the
cold-cache flush. Each mode is a small function or context manager; the user's model is never
changed in place (converted copies come from ``modelprof.inputs.moved_model``) and every flag set
on it is restored in ``finally``.
"""
from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..errors import ModelProfError
from ..inputs import map_tensors, parse_dtype
from ..state import set_training

__all__ = [
    "COMPILE_MODES",
    "CPU_FLUSH_BYTES",
    "CacheFlusher",
    "amp_context",
    "capture_cuda_graph",
    "compile_callable",
    "flush_bytes",
    "grad_context",
    "last_level_cache_bytes",
    "model_state",
    "parse_amp",
    "parse_compile",
    "to_channels_last",
]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: Lower bound of the cold-cache flush buffer (the CPU default when the LLC size is unknown).
CPU_FLUSH_BYTES = 64 * 2**20


@contextlib.contextmanager
def model_state(model: Any, eval_mode: bool) -> Iterator[None]:
    """``model.eval()`` for the block (when asked); every submodule's own ``training`` flag is
    restored afterwards, also when the block raises."""
    if not isinstance(model, nn.Module):
        yield
        return
    flags = [(m, m.training) for m in model.modules()]
    try:
        if eval_mode:
            set_training(model, False)  # model.eval(), also for torch.export modules
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def grad_context(no_grad: bool) -> contextlib.AbstractContextManager:
    """``torch.no_grad()`` when asked, else leave grad mode as the caller has it."""
    return torch.no_grad() if no_grad else contextlib.nullcontext()


def parse_amp(amp: Any) -> torch.dtype | None:
    """``None``, or ``torch.float16`` / ``torch.bfloat16`` (names accepted) for autocast."""
    if amp is None or amp is False:
        return None
    try:
        dt = parse_dtype(amp)
    except ModelProfError:
        dt = None
    if dt not in (torch.float16, torch.bfloat16):
        raise ModelProfError(f"amp={amp!r} must be torch.float16 or torch.bfloat16 "
                             "(or 'fp16'/'bf16')")
    return dt


def amp_context(device: torch.device, amp: torch.dtype | None,
                cache_enabled: bool = True) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device`` at ``amp``, or nothing. CUDA-graph capture needs
    ``cache_enabled=False`` (cast weights must be made inside the graph)."""
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp, cache_enabled=cache_enabled)


def parse_compile(compile: Any) -> str | None:
    """``False``/``None`` -> no compile; ``True`` -> ``"default"``; or a torch.compile mode."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return "default"
    if isinstance(compile, str) and compile in COMPILE_MODES:
        return compile
    raise ModelProfError(f"compile={compile!r} must be True/False or one of {COMPILE_MODES}")


def compile_callable(fn: Callable[..., Any], mode: str,
                     compile_kwargs: dict[str, Any] | None = None) -> Callable[..., Any]:
    """``torch.compile`` a wrapper around ``fn`` (so the user's module is not touched)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    opts = dict(compile_kwargs or {})
    if mode != "default":
        opts.setdefault("mode", mode)
    return torch.compile(run, **opts)


def to_channels_last(obj: Any) -> Any:
    """A copy of ``obj`` with every 4-D tensor in channels_last layout (others untouched)."""
    def conv(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 4:
            return t.clone(memory_format=torch.channels_last)
        return t
    return map_tensors(obj, conv)


def capture_cuda_graph(step: Callable[[], Any], side_warmup: int = 3
                       ) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Warm ``step`` up on a side stream, capture it once into a CUDA graph; returns the graph and
    the static output that each ``graph.replay()`` overwrites."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(side_warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    torch.cuda.synchronize()
    return graph, out


@functools.lru_cache(maxsize=1)
def last_level_cache_bytes() -> int | None:
    """The CPU's largest cache (L3 usually) from sysfs, or None when unreadable."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            value = int(text.rstrip("KMG")) * mult
            best = value if best is None else max(best, value)
    except (OSError, ValueError):
        return best
    return best


def flush_bytes(device: torch.device) -> int:
    """Size of the flush buffer: twice the L2 (CUDA) / last-level cache (CPU), at least 64 MiB."""
    if device.type == "cuda":
        cache = torch.cuda.get_device_properties(device).L2_cache_size
    elif device.type == "cpu":
        cache = last_level_cache_bytes()
    else:
        cache = None
    return max(2 * int(cache or 0), CPU_FLUSH_BYTES)


class CacheFlusher:
    """Writes a buffer bigger than the cache between samples (outside the timed span), so each
    sample starts with a cold L2/LLC — the ``triton.testing.do_bench`` flush."""

    def __init__(self, device: torch.device) -> None:
        self.nbytes = flush_bytes(device)
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()
