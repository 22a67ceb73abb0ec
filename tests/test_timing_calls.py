"""The timed passes' one "which call is running" service (timing/calls.py) and its protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from modelprof.counting.tree import by_parents
from modelprof.errors import ModelProfError
from modelprof.runtime.hooks import module_names
from modelprof.timing.calls import CallPlan, Calls, TimedInstrument, discover


class Log(TimedInstrument):
    """A throwaway instrument: the order of its enters and exits."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def enter(self, i: int) -> None:
        self.events.append(("enter", i))

    def exit(self, i: int) -> None:
        self.events.append(("exit", i))


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Sequential(nn.Linear(2, 2)))


def _plan(model: nn.Module, x: torch.Tensor) -> CallPlan:
    return discover(model, lambda: model(x), CallPlan(module_names(model)))


def test_an_instrument_sees_each_call_by_its_plan_index_in_call_order():
    model, x = _model(), torch.ones(1, 2)
    plan = _plan(model, x)
    # pre-order: the root 0, its children 1, 2, 3, and 3's child 4
    assert plan.keys == [("", 1), ("0", 1), ("1", 1), ("2", 1), ("2.0", 1)]
    assert plan.parent_index == [None, 0, 0, 0, 3]
    log, seen_open = Log(), []
    # (set before Calls binds it) the innermost open call at each enter
    log.enter = lambda i: (log.events.append(("enter", i)), seen_open.append(calls.current()))
    calls = Calls(plan, log)
    for _ in range(2):  # a second pass starts over from call 0
        log.events.clear()
        calls.begin()
        with calls.hooked(model, plan.names):
            model(x)
        calls.check_complete()
    e = [("enter", i) for i in range(5)]
    assert log.events == [e[0], e[1], ("exit", 1), e[2], ("exit", 2), e[3], e[4]] + [
        ("exit", 4),
        ("exit", 3),
        ("exit", 0),
    ]
    # at each enter the call itself is the innermost open one; after the pass none is (n = 5)
    assert seen_open[-5:] == [0, 1, 2, 3, 4] and calls.current() == 5


class Swaps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.swap = nn.ReLU(), nn.Tanh(), False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(self.b(x)) if self.swap else self.b(self.a(x))


def test_a_call_out_of_the_plans_order_is_named():
    model, x = Swaps(), torch.ones(1)
    plan = _plan(model, x)  # the root, a, b
    calls = Calls(plan, Log())
    model.swap = True
    calls.begin()
    with pytest.raises(ModelProfError, match=r"module 'b' ran as call 2 .* saw module 'a' there"):
        with calls.hooked(model, plan.names):
            model(x)


class Skips(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.skip = nn.Linear(2, 2), nn.ReLU(), False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        return x if self.skip else self.b(x)


def test_a_pass_with_fewer_calls_is_refused_with_both_counts():
    model, x = Skips(), torch.ones(1, 2)
    plan = _plan(model, x)  # the root, a, b: 3 calls
    calls = Calls(plan, Log())
    model.skip = True
    calls.begin()
    with calls.hooked(model, plan.names):
        model(x)  # the root and a: 2 calls
    with pytest.raises(ModelProfError, match="made 2 module calls, the discovery pass 3"):
        calls.check_complete()


class Catches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bad = Raises()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.bad(x)
        except RuntimeError:
            return x


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("inside")


def test_always_exits_a_call_that_raised_and_close_open_the_rest_innermost_first():
    model, x = Catches(), torch.ones(1)
    plan = _plan(model, x)
    log = Log()
    calls = Calls(plan, log)
    calls.begin()
    with calls.hooked(model, plan.names, always=True):
        model(x)
    # the model caught its child's error and went on: both calls exited, the child first
    assert log.events == [("enter", 0), ("enter", 1), ("exit", 1), ("exit", 0)]
    log.events.clear()
    calls.begin()
    calls.pre(model, (), {})
    calls.pre(model.bad, (), {})
    calls.close_open()  # what a forward that failed for good left open
    assert log.events == [("enter", 0), ("enter", 1), ("exit", 1), ("exit", 0)]


def test_without_a_plan_calls_are_only_counted():
    model, x = _model(), torch.ones(1, 2)
    log = Log()
    calls = Calls(None, log, n=5)
    calls.begin()
    with calls.hooked(model, module_names(model)):
        model(x)
    calls.check_complete("the counted pass")  # 5 calls, as said
    assert [i for kind, i in log.events if kind == "enter"] == [0, 1, 2, 3, 4]
    four = Calls(None, Log(), n=4)
    four.begin()
    with four.hooked(model, module_names(model)):
        model(x)
    with pytest.raises(ModelProfError, match="made 5 module calls, the counted pass 4"):
        four.check_complete("the counted pass")


def test_own_readings_sum_up_the_tree_and_back():
    parents = [None, 0, 0, 0, 3]  # _model()'s plan: the root, three children, 3's child 4
    own = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 1.0, 0.0, 0.0, 1.0]])
    # call 3 holds 4 + 5 = 9; the root 1 + 2 + 3 + 9 = 15 (the second pass: 0 + 1 + 0 + 1 = 2)
    expected = [[15.0, 2.0, 3.0, 9.0, 5.0], [2.0, 1.0, 0.0, 1.0, 1.0]]
    assert by_parents(own, parents, "own", "inclusive").tolist() == expected
    assert by_parents(own, parents, "own", "own").tolist() == own.tolist()
    # and back: the root 15 - (2 + 3 + 9) = 1, call 3 9 - 5 = 4
    inc = np.array(expected)
    assert by_parents(inc, parents, "inclusive", "own").tolist() == own.tolist()
    assert own[0, 0] == 1.0 and inc[0, 0] == 15.0  # the readings themselves untouched
