"""A ``cond`` costed without a predicate value (meta) whose branch raises leaves the counter as it
found it: the ops after it are charged, not staged into the failed branch's list."""

from __future__ import annotations

import torch
from torch._higher_order_ops.cond import cond

from modelprof.counting.counter import count_ops


def _raises(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("this branch fails")


def test_a_raising_cond_branch_leaves_no_staging_behind() -> None:
    caught = []

    def fn(pred: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        try:
            cond(pred, _raises, lambda x: x + 1, (x,))
        except ValueError as e:  # the model catches it and goes on
            caught.append(str(e))
        return x @ x

    meta = torch.device("meta")
    counter = count_ops(fn, torch.tensor(False, device=meta), torch.randn(3, 3, device=meta))
    assert caught == ["this branch fails"]
    assert counter._staged is None
    assert counter.tracker.current.macs == 27  # x @ x after the cond: 3*3*3 = 27 MACs
    assert counter.by_op["aten.mm.default"].calls == 1
