"""How the timed callable runs: torch.compile, CUDA graphs and the cold-cache flush, each a small
function that leaves the user's model as it was (eval/no_grad, AMP, channels_last:
``modelprof.runtime.execution``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from modelprof.errors import ModelProfError
from modelprof.timing.peaks import last_level_cache_bytes

__all__ = [
    "COMPILE_MODES",
    "CPU_FLUSH_BYTES",
    "CacheFlusher",
    "compile_callable",
    "flush_bytes",
    "graph_replay",
    "last_level_cache_bytes",
    "parse_compile",
]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: Lower bound of the cold-cache flush buffer (the CPU default when the LLC size is unknown).
CPU_FLUSH_BYTES = 64 * 2**20


def parse_compile(compile: Any) -> str | None:
    """``False``/``None`` -> no compile; ``True`` -> ``"default"``; or a torch.compile mode."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return "default"
    if isinstance(compile, str) and compile in COMPILE_MODES:
        return compile
    raise ModelProfError(f"compile={compile!r} must be True/False or one of {COMPILE_MODES}")


def compile_callable(
    fn: Callable[..., Any], mode: str, compile_kwargs: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """``torch.compile`` a wrapper around ``fn`` (so the user's module is not touched)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    opts = dict(compile_kwargs or {})
    if mode != "default":
        opts.setdefault("mode", mode)
    return torch.compile(run, **opts)


def graph_replay(step: Callable[[], Any], side_warmup: int = 3) -> Callable[[], Any]:
    """Warm ``step`` up on a side stream, capture it once into a CUDA graph, and a callable that
    replays it, returning the static output each replay overwrites."""
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

    def replay() -> Any:
        graph.replay()
        return out

    return replay


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
