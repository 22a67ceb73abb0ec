"""Recurrent layers: RNN/LSTM/GRU gate matmuls, whether the backend runs them as one fused op
(cuDNN, oneDNN) or they reach the dispatcher as per-step ``addmm``s (then matmul.py counts them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from modelprof.counting.formulas.registry import Cost, dot_madd, register_formula, register_ops

__all__ = ["cudnn_has_biases", "cudnn_layout", "cudnn_weight_shapes", "rnn_cost", "rnn_layers"]

aten = torch.ops.aten

# gates per cell and elementwise flops per hidden unit per step (after the gate matmuls):
#   LSTM: 4 gates; 3 sigmoid + 2 tanh + c = f*c + i*g (3) + h = o*tanh(c) (1)  -> 9
#   GRU:  3 gates; 2 sigmoid + 1 tanh + r*(W_hn h + b_hn) (1) + h' = n + z*(h - n) (3) -> 7
#         (ATen's gru_cell: sub, mul, add; not (1-z)*n + z*h, which would be 4)
#   RNN:  1 gate;  tanh or relu                                                  -> 1
CELL_ELEMENTWISE = {"lstm": 9, "gru": 7, "rnn": 1}
GATES = {"rnn": 1, "lstm": 4, "gru": 3}


def gate_work(
    tokens: int, weight_shapes: list, hidden: int, kind: str, directions_layers: int
) -> tuple[int, int, int]:
    """(MACs of the gate matmuls, gate units, elementwise flops of the cells) of an RNN over
    ``tokens`` = steps x batch: per token, the layer input and hidden state times the gate
    matrices, sum(numel of 2-D weights) MACs (an LSTM layer: 4*h*(in + h)); G*h gate units per
    layer and direction (a proj_size projection's rows are none of them)."""
    macs = tokens * sum(s[0] * s[1] for s in weight_shapes if len(s) == 2)
    gate_units = directions_layers * GATES[kind] * hidden if weight_shapes else 0
    return macs, gate_units, tokens * directions_layers * hidden * CELL_ELEMENTWISE[kind]


def rnn_cost(
    tokens: int,
    weight_shapes: list,
    hidden_per_direction: int,
    kind: str,
    directions_layers: int,
    has_biases: bool,
) -> Cost:
    """:func:`gate_work`; per gate unit, 1 add joins W_ih x and W_hh h, 2 more add the biases
    (as the per-step addmm path computes it)."""
    macs, gate_units, cell = gate_work(
        tokens, weight_shapes, hidden_per_direction, kind, directions_layers
    )
    bias_adds = tokens * gate_units * (3 if has_biases else 1)
    # madd: (2k - 1) per gate output of each product (a bias add is not MAdd, as for addmm;
    # 0 for a product of length 0, an input of no features), + the add joining W_ih x and
    # W_hh h (an elementwise op: MAdd = FLOPs) + the cell's work
    products = sum(
        dot_madd(tokens * s[0] * s[1], tokens * s[0]) for s in weight_shapes if len(s) == 2
    )
    joins = tokens * gate_units
    return Cost(macs, flops=2 * macs + bias_adds + cell, madd=products + joins + cell)


GATE_MODE = {0: "rnn", 1: "rnn", 2: "lstm", 3: "gru"}


def _tokens(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.dim() else 0


@register_ops("mkldnn_rnn_layer")
def _mkldnn_rnn_layer(args, kwargs, out) -> Cost:
    # (input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size,
    #  num_layers, has_biases, bidirectional, batch_first, train): one layer, one direction
    x, w_ih, w_hh = args[0], args[1], args[2]
    mode, hidden, has_biases = int(args[9]), int(args[10]), bool(args[12])
    return rnn_cost(
        _tokens(x), [tuple(w_ih.shape), tuple(w_hh.shape)], hidden, GATE_MODE[mode], 1, has_biases
    )


def cudnn_weight_shapes(
    input_size: int, kind: str, hidden: int, proj: int, num_layers: int, bidirectional: bool
) -> list[tuple[int, int]]:
    """The 2-D weights of this RNN as ``nn.LSTM``/``nn.GRU``/``nn.RNN`` hold them, per layer and
    direction ``(G*h, in)``, ``(G*h, h_out)`` and, with ``proj_size``, ``(proj, h)``; ``in`` is
    ``input_size`` for the first layer, ``h_out`` times the directions after it. From the op's
    sizes: under autocast its weight list is ``(numel, 1)`` views of one flat buffer."""
    dirs = 2 if bidirectional else 1
    out = proj or hidden
    gate_rows = GATES[kind] * hidden
    shapes: list[tuple[int, int]] = []
    for layer in range(num_layers):
        width = input_size if layer == 0 else out * dirs
        per_direction = [(gate_rows, width), (gate_rows, out)] + ([(proj, hidden)] if proj else [])
        shapes += per_direction * dirs
    return shapes


def cudnn_has_biases(weight_stride0: int) -> bool:
    """Tensors per layer and direction: w_ih, w_hh (+ b_ih, b_hh) (+ w_hr): 4 or 5 with biases."""
    return int(weight_stride0) in (4, 5)


def cudnn_layout(args: tuple, mode_at: int) -> tuple[int, list, int, str, int]:
    """(tokens, weight shapes, hidden size, gate kind, layers x directions) of a cuDNN/MIOpen
    RNN call whose ``mode, hidden_size, proj_size, num_layers`` start at ``args[mode_at]``,
    ``bidirectional`` 7 after."""
    kind = GATE_MODE[int(args[mode_at])]
    hidden, proj, num_layers = (int(a) for a in args[mode_at + 1 : mode_at + 4])
    bidirectional = bool(args[mode_at + 7])
    x = args[0]
    shapes = cudnn_weight_shapes(x.shape[-1], kind, hidden, proj, num_layers, bidirectional)
    return _tokens(x), shapes, hidden, kind, num_layers * (2 if bidirectional else 1)


@register_ops("_cudnn_rnn miopen_rnn")
def _cudnn_rnn(args, kwargs, out) -> Cost:
    # (input, weight[], weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size,
    #  num_layers, batch_first, dropout, train, bidirectional, batch_sizes, dropout_state)
    return rnn_cost(*cudnn_layout(args, 6), cudnn_has_biases(args[2]))


def rnn_layers(kind: str, weights: Callable[[Any], list] = lambda p: [p]):
    """Family factory: a whole RNN of ``kind``; ``weights`` gives the weight tensors of one
    entry of its params[] (of a dynamically quantized one: the unpacked weights)."""

    def formula(args, kwargs, out) -> Cost:
        # (input, hx, params[], has_biases, num_layers, dropout, train, bidirectional, batch_first)
        x, params = args[0], args[2]
        has_biases, num_layers, bidirectional = bool(args[3]), int(args[4]), bool(args[7])
        # an LSTM's hidden size from c0: h0 has proj_size units when there is one
        hidden = (args[1][1] if kind == "lstm" else args[1]).shape[-1]
        shapes = [tuple(t.shape) for p in params for t in weights(p)]
        layers = num_layers * (2 if bidirectional else 1)
        return rnn_cost(_tokens(x), shapes, hidden, kind, layers, has_biases)

    return formula


register_formula(aten.lstm.input)(rnn_layers("lstm"))
register_formula(aten.gru.input)(rnn_layers("gru"))
register_formula(aten.rnn_tanh.input, aten.rnn_relu.input)(rnn_layers("rnn"))


@register_ops("_thnn_fused_lstm_cell _thnn_fused_gru_cell")
def _fused_cell(args, kwargs, out) -> Cost:
    # (input_gates [B, G*h], hidden_gates [B, G*h], cx/hx, ...): the gate matmuls ran as
    # addmm before; here only the elementwise cell (about 3 flops per gate unit)
    return Cost(0, flops=3 * args[0].numel())
