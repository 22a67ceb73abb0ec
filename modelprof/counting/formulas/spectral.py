"""Fast Fourier transforms and histograms.

A length-n FFT costs ``n log2 n`` flops (the butterflies, once per complex operation); the
scaling of a normalised transform is not counted. A d-dimensional transform over N elements is
N / n_i 1-D transforms along each dimension: ``N * sum(log2 n_i)``. The signal is the real side
of an r2c (input) or c2r (output) transform, either side of a c2c one; zero-padding is a pad op.

``histc``: 2 flops per input element (subtract the lower edge, scale to a bin index); when the
range is not given (``min == max``) 2 more per element find the data's minimum and maximum.
"""

from __future__ import annotations

import math

from modelprof.counting.formulas.registry import Cost, arg, register_ops

__all__ = ["fft_flops"]

HISTC_FLOPS_PER_ELEMENT = 2
HISTC_RANGE_FLOPS_PER_ELEMENT = 2


def fft_flops(signal_shape: tuple[int, ...], dims: list[int]) -> int:
    """``N * sum(log2 n_i)`` over the transformed dimensions of a signal of ``signal_shape``."""
    numel = math.prod(signal_shape)
    if numel == 0:
        return 0
    return round(numel * sum(math.log2(signal_shape[d]) for d in dims if signal_shape[d] > 1))


def _fft(signal_is_output: bool):
    def formula(args, kwargs, out) -> Cost:
        # (input, dim, normalization, onesided | last_dim_size | forward)
        signal = out if signal_is_output else args[0]
        dims = [int(d) % signal.dim() for d in args[1]] if signal.dim() else []
        return Cost(0, flops=fft_flops(tuple(signal.shape), dims))

    return formula


register_ops("_fft_r2c _fft_c2c")(_fft(False))
register_ops("_fft_c2r")(_fft(True))


@register_ops("histc")
def _histc(args, kwargs, out) -> Cost:
    # (input, bins=100, min=0, max=0): min == max means the data's own range
    own_range = arg(args, kwargs, 2, "min", 0) == arg(args, kwargs, 3, "max", 0)
    per = HISTC_FLOPS_PER_ELEMENT + (HISTC_RANGE_FLOPS_PER_ELEMENT if own_range else 0)
    return Cost(0, flops=per * args[0].numel())
