"""Loss functions and their gradients (what ``profile(..., backward=True, loss_fn=...)`` runs).

Per element of the input (flops), ``+ 1`` for the mean/sum reduction when the loss reduces:
    nll_loss           picks one log-probability per target: 1 per target (the reduction),
                       + 1 per target with class weights; backward writes -g/N (or -w*g/N)
                       at each target: 1 per target (+1 with weights).
                       (cross_entropy = log_softmax, counted as softmax, + nll_loss)
    mse_loss           (x - y)^2: 2, backward 2 * (x - y) * g / N: 3
    smooth_l1 / huber  |d| compared with beta, then a square or a line: 4, backward 3
    binary_cross_entropy          -(y log x + (1 - y) log(1 - x)): 7, backward 5
    binary_cross_entropy_with_logits  the stable form (1 - y) * x + log(1 + exp(-x)): 6 (+1 with
                       pos_weight, +1 with weight)
"""

from __future__ import annotations

import torch

from modelprof.counting.formulas.registry import Cost, arg, register_formula, register_ops

__all__ = ["LOSS_FLOPS_PER_ELEMENT"]

aten = torch.ops.aten

LOSS_FLOPS_PER_ELEMENT = dict(
    mse=2, mse_backward=3, smooth_l1=4, smooth_l1_backward=3, bce=7, bce_backward=5, bce_logits=6
)


def _reduces(args, kwargs, pos: int) -> int:
    """1 when the loss reduces (its ``reduction`` at ``pos``: 0 = none, 1 = mean, 2 = sum)."""
    return int(int(arg(args, kwargs, pos, "reduction", 1)) != 0)


@register_ops("nll_loss_forward nll_loss2d_forward")
def _nll_loss(args, kwargs, out) -> Cost:
    # (self [N, C, ...], target [N, ...], weight, reduction, ignore_index)
    target, weight = args[1], args[2] if len(args) > 2 else None
    n = target.numel()
    weighted = n if isinstance(weight, torch.Tensor) else 0
    return Cost(0, flops=(n if _reduces(args, kwargs, 3) else 0) + weighted)


@register_ops("nll_loss_backward nll_loss2d_backward")
def _nll_loss_backward(args, kwargs, out) -> Cost:
    # (grad_output, self, target, weight, reduction, ignore_index, total_weight)
    target, weight = args[2], args[3]
    n = target.numel()
    return Cost(0, flops=n + (n if isinstance(weight, torch.Tensor) else 0))


def _per_input(key: str, pos: int, weights: tuple = ()):
    """Per element of the input, ``reduction`` at ``pos``, + 1 for each of the optional
    ``weights`` (position, name) given."""
    per = LOSS_FLOPS_PER_ELEMENT[key]

    def formula(args, kwargs, out) -> Cost:
        given = sum(isinstance(arg(args, kwargs, i, n), torch.Tensor) for i, n in weights)
        return Cost(0, flops=(per + given + _reduces(args, kwargs, pos)) * args[0].numel())

    return formula


def _per_grad(key: str):
    per = LOSS_FLOPS_PER_ELEMENT[key]

    def formula(args, kwargs, out) -> Cost:
        # (grad_output, self, target, ...): one gradient per input element
        return Cost(0, flops=per * args[1].numel())

    return formula


register_formula(aten.mse_loss)(_per_input("mse", 2))
register_ops("mse_loss_backward")(_per_grad("mse_backward"))
register_ops("smooth_l1_loss huber_loss")(_per_input("smooth_l1", 2))
register_ops("smooth_l1_loss_backward huber_loss_backward")(_per_grad("smooth_l1_backward"))
register_ops("binary_cross_entropy")(_per_input("bce", 3))
register_ops("binary_cross_entropy_backward")(_per_grad("bce_backward"))
# (self, target, weight, pos_weight, reduction)
register_ops("binary_cross_entropy_with_logits")(
    _per_input("bce_logits", 4, weights=((2, "weight"), (3, "pos_weight")))
)
