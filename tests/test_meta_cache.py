"""The table of meta outputs (counting/meta_cache.py): a repeat of an op on the same metadata is
made from the table, a fresh tensor with the very shape, strides and dtype the kernel gave;
anything whose output could differ, or that aliases or writes, runs every time; and a model's
report on meta is the same with the table as without it."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.counting import counter as counter_mod
from modelprof.counting import meta_cache
from modelprof.counting.meta_cache import run_meta

from helpers import equal_reports

aten = torch.ops.aten


def meta(*shape: int, dtype=torch.float32, stride=None) -> torch.Tensor:
    stride = stride or torch.empty(shape, device="meta").stride()
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


class Calls:
    """An op wrapped to count how often its kernel really runs."""

    def __init__(self, op) -> None:
        self.op, self.ran = op, 0
        self._schema, self.tags, self.namespace = op._schema, op.tags, op.namespace

    def __call__(self, *args, **kwargs):
        self.ran += 1
        return self.op(*args, **kwargs)

    def __hash__(self) -> int:
        return id(self)


@pytest.fixture(autouse=True)
def _empty_table():
    meta_cache.clear()
    yield
    meta_cache.clear()


def test_a_repeat_is_made_from_the_table_with_the_kernels_metadata() -> None:
    mm = Calls(aten.mm.default)
    a, b = meta(3, 4), meta(4, 5, stride=(1, 4))     # b transposed: strides in the key
    first = run_meta(mm, (a, b), {})
    second = run_meta(mm, (meta(3, 4), meta(4, 5, stride=(1, 4))), {})
    assert mm.ran == 1 and second is not first
    assert (second.shape, second.stride(), second.dtype, second.device) == \
        (first.shape, first.stride(), first.dtype, first.device) == \
        (torch.Size([3, 5]), (5, 1), torch.float32, torch.device("meta"))
    # other strides, dtype or shape: asked again
    run_meta(mm, (a, meta(4, 5)), {})
    run_meta(mm, (meta(3, 4, dtype=torch.float64), meta(4, 5, dtype=torch.float64)), {})
    run_meta(mm, (meta(2, 4), b), {})
    assert mm.ran == 4


def test_numbers_are_keyed_with_their_type_and_tuples_of_outputs_come_back() -> None:
    add = Calls(aten.add.Tensor)
    x = meta(2, 2, dtype=torch.int64)
    assert run_meta(add, (x, x), {"alpha": 1}).dtype == torch.int64
    assert run_meta(add, (x, x), {"alpha": True}).dtype == torch.int64
    assert add.ran == 2                     # 1 and True are equal in Python, not here
    bn = Calls(aten.native_batch_norm.default)
    args = (meta(2, 3, 4, 4), meta(3), meta(3), meta(3), meta(3), False, 0.1, 1e-5)
    outs = [run_meta(bn, args, {}) for _ in range(2)]
    assert bn.ran == 1
    kernel = aten.native_batch_norm.default(*args)
    assert [(o.shape, o.stride()) for o in outs[1]] == [(o.shape, o.stride()) for o in kernel]


def test_what_could_differ_runs_every_time() -> None:
    x = meta(4, 4)
    for op, args in [(aten.view.default, (x, [16])),             # an alias of its input
                     (aten.add_.Tensor, (meta(4, 4), x)),       # writes its argument
                     (aten.nonzero.default, None),              # data-dependent shape
                     (aten.bernoulli.default, (x,))]:           # nondeterministic
        assert meta_cache._may_cache(op) is False, op
    mm = Calls(aten.mm.default)
    cpu = torch.ones(4, 4)
    for _ in range(2):   # a CPU operand (meta's mm takes it), an unknown object: never keyed
        run_meta(mm, (x, cpu), {})
    assert mm.ran == 2
    assert meta_cache._key(aten.mm.default, (x, object()), {}) is None
    # a factory op without a dtype follows the default dtype
    empty = Calls(aten.empty.memory_format)
    assert run_meta(empty, ([2],), {"device": torch.device("meta")}).dtype == torch.float32
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert run_meta(empty, ([2],), {"device": torch.device("meta")}).dtype == torch.float64
    finally:
        torch.set_default_dtype(before)
    assert empty.ran == 2


def test_the_table_is_emptied_at_its_limit(monkeypatch) -> None:
    monkeypatch.setattr(meta_cache, "LIMIT", 3)
    for n in range(1, 5):   # four signatures: the fourth finds three and empties the table
        run_meta(aten.mm.default, (meta(n, 2), meta(2, 2)), {})
    assert len(meta_cache._table) == 1


class _Blocks(nn.Module):
    """Four identical blocks (each a repeat of the one before): attention, norm, MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"attn": nn.MultiheadAttention(16, 2, batch_first=True),
                           "norm": nn.LayerNorm(16), "mlp": nn.Sequential(
                               nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))})
            for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b["norm"](x + b["attn"](x, x, x, need_weights=False)[0])
            x = x + b["mlp"](x)
        return x.softmax(-1).mean()


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_reports_on_meta_are_the_same_with_the_table_as_without(device, monkeypatch) -> None:
    # device="meta", and a counting-only CPU profile counted on meta (counting/meta_route.py)
    model = _Blocks().eval()
    x = torch.randn(2, 5, 16)

    def counted(table: bool):
        meta_cache.clear()
        if not table:
            monkeypatch.setattr(counter_mod, "run_meta", lambda f, a, k: f(*a, **k))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = profile(model, inputs=x, device=device, timing=False)
        monkeypatch.undo()
        return report

    with_table = counted(True)
    used = len(meta_cache._table)
    without = counted(False)
    if device == "cpu":   # counted on meta (the route), the report still on the CPU
        assert with_table.env["static_route"] == "meta" and with_table.device == "cpu"
    assert used > 0 and len(meta_cache._table) == 0   # the table served one, not the other
    equal_reports(with_table, without)
