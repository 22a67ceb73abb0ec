"""Pooling, fixed and adaptive, max and average, 1-3 d: per output of a k-element window, max
k - 1 comparisons, avg k - 1 additions + 1 division = k (torchstat's MAdd). Adaptive pools use
each output's exact window [floor(i*In/Out), ceil((i+1)*In/Out)), also when Out does not divide In.
"""

from __future__ import annotations

from math import ceil, floor, prod

import torch

from modelprof.counting.formulas.registry import Cost, first, register_ops

__all__ = ["adaptive_window_sum", "adaptive_windows", "pool_cost"]


def pool_cost(n_out: int, window: int, kind: str) -> Cost:
    per = window - 1 if kind == "max" else window
    return Cost(0, flops=n_out * per)


def window(kernel, dims: int) -> int:
    """Elements of a ``dims``-d window of ``kernel`` (an int or one size for every dim)."""
    k = [kernel] if isinstance(kernel, int) else list(kernel)
    return prod(k * dims if len(k) == 1 else k)


def _fixed(kind: str, dims: int):
    def formula(args, kwargs, out) -> Cost:
        # (input, kernel_size, stride, padding, ...)
        return pool_cost(first(out).numel(), window(args[1], dims), kind)

    return formula


for _kind, _dims, _names in (
    ("max", 1, "max_pool1d max_pool1d_with_indices quantized_max_pool1d"),
    ("max", 2, "max_pool2d max_pool2d_with_indices mkldnn_max_pool2d quantized_max_pool2d"),
    ("max", 3, "max_pool3d max_pool3d_with_indices mkldnn_max_pool3d"),
    ("avg", 1, "avg_pool1d"),
    ("avg", 2, "avg_pool2d mkldnn_avg_pool2d"),
    ("avg", 3, "avg_pool3d"),
):
    register_ops(_names)(_fixed(_kind, _dims))


def adaptive_window_sum(in_size: int, out_size: int) -> int:
    """Sum over the outputs of one dimension of their window lengths."""
    return sum(
        ceil((i + 1) * in_size / out_size) - floor(i * in_size / out_size) for i in range(out_size)
    )


def adaptive_windows(x: torch.Tensor, spatial_out: tuple[int, ...]) -> int:
    """Sum over the outputs of an adaptive pool of ``x`` [N, C, *in] of their window sizes:
    windows multiply across the pooled dims (the last ``len(spatial_out)``)."""
    spatial_in = x.shape[-len(spatial_out) :]
    lead = x.numel() // prod(spatial_in) if prod(spatial_in) else 0
    return lead * prod(adaptive_window_sum(i, o) for i, o in zip(spatial_in, spatial_out))


def _adaptive(kind: str):
    def formula(args, kwargs, out) -> Cost:
        # (input [N, C, *in], output_size)
        o, size = first(out), args[1]
        dims = 1 if isinstance(size, int) else len(size)
        total_window = adaptive_windows(args[0], o.shape[-dims:])
        return Cost(0, flops=total_window if kind == "avg" else total_window - o.numel())

    return formula


register_ops(
    "_adaptive_avg_pool2d adaptive_avg_pool1d _adaptive_avg_pool3d mkldnn_adaptive_avg_pool2d"
)(_adaptive("avg"))
register_ops("adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d")(_adaptive("max"))
