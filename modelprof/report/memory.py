"""An estimate of the memory a model needs, for inference and for a training step, from what
the static pass saw (torchinfo's "estimated total size", itemised).

Inference: parameters + buffers + inputs + the activations, taken as the largest working set of
one leaf call (its inputs and outputs) beyond the model's inputs, which their own row holds
(the first leaf fed tensors of the model's input shapes is taken to read them): a lower bound of
the true peak. A leaf of views only (``CallRecord.only_aliases``: an ``nn.Flatten``, an eval
``nn.Dropout``) holds no tensor of its own: it counts in neither, nor in the leaf outputs below
(its inputs and outputs are one tensor, another call's). A training step adds the
gradients (of a profiled step, of the parameters it gave one; without a step, of every trainable
parameter), the optimizer's state (without a profiled optimizer, ``optimizer_states`` state
tensors per trainable parameter, and the per-tensor ``step`` of the optimizer that count stands
for: Adam's 4 bytes for 2, as ``fit`` counts them) and the tensors autograd saves for the
backward: measured with ``backward=True`` (beyond the model's inputs, which that reader saved:
the inputs row holds them), else every leaf call's output (torchinfo's convention).

``modelprof.fit`` at the same batch, dtype and optimizer (``input_size=``) gives the same
inference sum component by component; its training plans leave out this step's activations
row (the largest working set, whose tensors are mostly among the saved ones), as the ZeRO
accounting does, so this estimate is the larger by that row (``fit``'s module doc).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from modelprof.counting.formulas.quantized import module_packed_weights
from modelprof.counting.sharding import held
from modelprof.errors import check_int
from modelprof.runtime.tensors import tensor_bytes
from modelprof.step.optimizer_state import OPTIMIZER_STATES, scalar_state_bytes

__all__ = ["MemoryFacts", "estimate_memory", "memory_facts"]


@dataclasses.dataclass(frozen=True)
class MemoryFacts:
    """Bytes the static pass knows: the model's tensors in the profiled dtype, the inputs, the
    largest leaf working set and the leaf outputs."""

    param_bytes: int
    #: the trainable parameters' bytes; of a profiled step, only those it gave a gradient
    trainable_param_bytes: int
    buffer_bytes: int
    input_bytes: int
    working_set_bytes: int
    leaf_output_bytes: int
    #: the largest working set without the model's inputs (a leaf that reads them: the inputs
    #: row has them); what the estimate adds to the inputs
    working_set_beyond_inputs_bytes: int = 0
    #: of the bytes saved for the backward, the model's inputs' (the inputs reader saved them:
    #: the inputs row has them); what the estimate leaves out of its saved row
    saved_inputs_bytes: int = 0
    #: the trainable parameters' shapes, each tensor once: what per-tensor state is sized by
    trainable_shapes: tuple[tuple[int, ...], ...] = ()


def memory_facts(
    model: nn.Module,
    input_bytes: int,
    records: Sequence[Any],
    dtype: torch.dtype | None,
    saved: Sequence[int] | None = None,
    ungraded: Collection[int] = (),
) -> MemoryFacts:
    """The facts of :class:`MemoryFacts` for ``model`` profiled in ``dtype`` (None: its own);
    the parameters include the packed weights of quantized layers, at their stored size. Of a
    sharded model, the tensors as the view counts them: this rank's shards, or the whole.
    ``saved``: the bytes each record saved for the backward (``backward=True``), in order;
    ``ungraded``: the ids of the trainable parameters that step gave no gradient, left out of
    the trainable ones (no gradient, no optimizer state)."""
    given = list(model.parameters())
    params = list(map(held, given))  # each read once: the trainable ones are of these
    trainable = [h for p, h in zip(given, params) if p.requires_grad and id(p) not in ungraded]
    leaves = [r for r in records if r.working_leaf]
    packed = module_packed_weights(model)[1]  # quantized layers' weights: no nn.Parameter
    at = _inputs_reader(records)
    first = None if at is None else records[at]

    def inputs_part(r: Any, nbytes: int) -> int:  # of what r read or saved, the inputs row's
        return min(nbytes, input_bytes) if r is first else 0

    return MemoryFacts(
        param_bytes=tensor_bytes(params, dtype) + packed,
        trainable_param_bytes=tensor_bytes(trainable, dtype),
        buffer_bytes=tensor_bytes(list(map(held, model.buffers())), dtype),
        input_bytes=int(input_bytes),
        working_set_bytes=max((r.input_bytes + r.output_bytes for r in leaves), default=0),
        leaf_output_bytes=sum(r.output_bytes for r in leaves),
        working_set_beyond_inputs_bytes=max(
            (r.input_bytes + r.output_bytes - inputs_part(r, r.input_bytes) for r in leaves),
            default=0,
        ),
        saved_inputs_bytes=min(saved[at], input_bytes) if at is not None and saved else 0,
        trainable_shapes=tuple(tuple(p.shape) for p in trainable),
    )


def _inputs_reader(records: Sequence[Any]) -> int | None:
    """The index of the leaf taken to read the model's inputs: the first leaf call fed tensors
    of their shapes (the first layer, or the model itself when it is one leaf); None without
    one. Its inputs (in its working set, or saved for the backward) are the inputs row's, and
    counting them twice overstated the bound. Later calls of those shapes (a stack of same-shape
    layers) read other tensors while the caller still holds the inputs: theirs count whole."""
    root = next((r for r in records if r.parent is None), None)
    if root is None:
        return None
    reads = (i for i, r in enumerate(records) if r.working_leaf)
    return next((i for i in reads if records[i].input_shapes == root.input_shapes), None)


def estimate_memory(
    facts: MemoryFacts,
    *,
    saved_bytes: int | None = None,
    optimizer_state_bytes: int | None = None,
    optimizer_states: int = 2,
) -> pd.DataFrame:
    """One row per component (bytes), columns ``inference`` and ``training_step`` and
    ``how`` (where each number comes from), a ``total`` row last."""
    optimizer_states = check_int("optimizer_states", optimizer_states, 0)
    saved, saved_how = (
        (
            saved_bytes - facts.saved_inputs_bytes,
            "measured: tensors autograd saved (backward=True) beyond the model's inputs",
        )
        if saved_bytes is not None
        else (facts.leaf_output_bytes, "estimated: every leaf call's output, views' none")
    )
    if optimizer_state_bytes is not None:
        state, state_how = optimizer_state_bytes, "the profiled optimizer's state tensors"
    else:
        state, state_how = _assumed_state(facts, optimizer_states)
    rows = [
        ("parameters", facts.param_bytes, facts.param_bytes, "every distinct parameter"),
        ("buffers", facts.buffer_bytes, facts.buffer_bytes, "every distinct buffer"),
        ("inputs", facts.input_bytes, facts.input_bytes, "the input tensors"),
        (
            "activations",
            facts.working_set_beyond_inputs_bytes,
            facts.working_set_beyond_inputs_bytes,
            "largest leaf call's inputs + outputs beyond the model's inputs (a lower bound "
            "of the peak)",
        ),
        ("saved for backward", 0, saved, saved_how),
        (
            "gradients",
            0,
            facts.trainable_param_bytes,
            "one per trainable parameter the profiled step gave one"
            if saved_bytes is not None
            else "one per trainable parameter (no step profiled: each assumed to get one)",
        ),
        ("optimizer state", 0, state, state_how),
    ]
    rows.append(("total", sum(r[1] for r in rows), sum(r[2] for r in rows), "sum"))
    df = pd.DataFrame(rows, columns=["component", "inference", "training_step", "how"])
    return df.set_index("component").astype({"inference": "int64", "training_step": "int64"})


def _assumed_state(facts: MemoryFacts, states: int) -> tuple[int, str]:
    """``states`` tensors per trainable parameter, with the per-tensor scalars of the optimizer
    that count stands for (2: Adam's 4-byte ``step``; 1: SGD with momentum, 0: SGD, none), as
    ``fit`` and the profiled optimizers count them."""
    named = next((n for n, (k, _) in OPTIMIZER_STATES.items() if k == states), None)
    scalars = scalar_state_bytes(named, facts.trainable_shapes) if named else 0
    how = f"assumed {states} state tensor(s) per trainable parameter"
    if scalars:
        how += f" and {named.capitalize()}'s {scalars:,} B of per-tensor step"
    return states * facts.trainable_param_bytes + scalars, how
