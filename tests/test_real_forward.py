"""A counting-only profile (``timing=False``) runs the user's forward as it really runs: the
same branches, the same shared objects, the same errors, and what the forward keeps is what
the model would keep. Afterwards the model is the same bit for bit (parameters, buffers,
``__dict__``, class attributes, hooks, flags) and gives the same output.

Each model here counts otherwise, fails, or is left broken when its forward is run anywhere
but on its own tensors (a copy of the model, stand-in tensors of another device)."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import picture
from torch import nn

from modelprof import ModelProfError, profile

# one Linear(8, 8) without bias on a (2, 8) input: 2 * 8 * 8 = 128 MACs
ONE = 128


def _lin() -> nn.Linear:
    return nn.Linear(8, 8, bias=False)


def whole(model: nn.Module) -> Any:
    """The model and the attributes of every class in it, as ``picture`` sees them."""
    classes = {type(m): dict(vars(type(m))) for m in model.modules()}
    return picture([model, list(classes.values())])


def counted_as_it_runs(model: nn.Module, x: torch.Tensor) -> Any:
    """``profile(model, inputs=x, timing=False)``, checking that the model and its output are
    as before (bit for bit)."""
    before = whole(model)
    with torch.no_grad():
        out = model(x)
    report = profile(model, inputs=x, timing=False)
    assert whole(model) == before
    with torch.no_grad():
        assert torch.equal(model(x), out)
    assert whole(model) == before
    return report


# -- branches the forward takes on its own tensors ------------------------------------------------


class Branchy(nn.Module):
    """``a``, then ``b`` too where ``deep(self, x)`` says so."""

    def __init__(self, deep: Callable[[nn.Module, torch.Tensor], bool]) -> None:
        super().__init__()
        self.a, self.b = _lin(), _lin()
        self.deep = deep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(y) if self.deep(self, x) else y


def _catches(m: nn.Module, x: torch.Tensor) -> bool:
    try:
        return bool(x.abs().sum().item() > 0)
    except Exception:  # noqa: BLE001 - the model's own habit, tried as a user writes it
        return False


_WEAK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BY_ID: dict[int, bool] = {}


def _registered(deep: Callable) -> Callable[[], nn.Module]:
    """A ``Branchy`` that looks itself up by ``self`` or ``id(self)`` (``deep``)."""

    def make() -> nn.Module:
        model = Branchy(deep)
        _WEAK[model] = True
        _BY_ID[id(model)] = True
        return model

    return make


BRANCHES = {
    "catches its own error": lambda m, x: _catches(m, x),
    "WeakKeyDictionary by self": lambda m, x: _WEAK[m],
    "dict by id(self)": lambda m, x: _BY_ID.get(id(m), False),
    "x.device == cpu": lambda m, x: x.device == torch.device("cpu"),
    "repr(x.device)": lambda m, x: repr(x.device) == "device(type='cpu')",
    "x.data_ptr()": lambda m, x: x.data_ptr() != 0,
    "x.storage_offset()": lambda m, x: x.storage_offset() == 8,  # x = base[1:], rows of 8
}


@pytest.mark.parametrize("case", list(BRANCHES))
def test_the_forward_takes_the_branch_it_takes_on_its_own_tensors(case: str) -> None:
    torch.manual_seed(0)
    model = _registered(BRANCHES[case])()
    x = torch.randn(3, 8)[1:]  # (2, 8), storage offset 8
    r = counted_as_it_runs(model, x)
    assert r.totals["macs"] == 2 * ONE  # a and b: 2 * 128 = 256
    # (the root's own ops, where it runs any: abs, sum, gt)
    own = ["(self)"] if case == "catches its own error" else []
    assert list(r.to_dataframe()["module"]) == ["", "a", "b", *own]


# -- an object shared between modules ---------------------------------------------------------


class Encoder(nn.Module):
    def __init__(self, skips: Any) -> None:
        super().__init__()
        self.lin, self.skips = _lin(), skips

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if isinstance(self.skips, list):
            self.skips.append(y)
        else:
            self.skips["skip"] = y
        return y


class Decoder(nn.Module):
    def __init__(self, skips: Any) -> None:
        super().__init__()
        self.lin, self.skips = _lin(), skips

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.skips:
            skip = self.skips.pop() if isinstance(self.skips, list) else self.skips.pop("skip")
            return x + self.lin(skip)
        return x


class EncoderDecoder(nn.Module):
    def __init__(self, skips: Any) -> None:
        super().__init__()
        self.enc, self.dec = Encoder(skips), Decoder(skips)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(self.enc(x))


@pytest.mark.parametrize("skips", [[], {}], ids=["list", "dict"])
def test_a_list_or_dict_shared_by_encoder_and_decoder_is_one_object(skips: Any) -> None:
    torch.manual_seed(0)
    model = EncoderDecoder(skips)
    r = counted_as_it_runs(model, torch.randn(2, 8))
    assert r.totals["macs"] == 2 * ONE  # enc.lin and dec.lin: 256
    assert list(r.to_dataframe()["module"]) == [
        "",
        "enc",
        "enc.lin",
        "dec",
        "dec.lin",
        "dec.(self)",
    ]  # (its add)
    assert not skips  # the decoder took what the encoder left


# -- errors the model raises ------------------------------------------------------------------


class Cholesky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(-torch.eye(4))  # not positive definite

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.linalg.cholesky(self.w)


@pytest.mark.parametrize(
    "make, x, raised",
    [
        (
            lambda: nn.Sequential(nn.Embedding(10, 8), _lin()),
            torch.tensor([[1, 50, 3]]),
            IndexError,
        ),
        (Cholesky, torch.randn(2, 4), torch.linalg.LinAlgError),
    ],
    ids=["embedding index out of range", "cholesky of a matrix not positive definite"],
)
def test_the_models_own_error_is_raised_as_the_model_raises_it(
    make: Callable, x: torch.Tensor, raised: type
) -> None:
    torch.manual_seed(0)
    model = make()
    with pytest.raises(raised):
        model(x)
    before = whole(model)
    with pytest.raises(ModelProfError) as info:
        profile(model, inputs=x, timing=False)
    assert isinstance(info.value.__cause__, raised)
    assert raised.__name__ in str(info.value)
    assert whole(model) == before


# -- what the forward keeps -------------------------------------------------------------------


class Memoised(nn.Module):
    """``x @ (2 W)ᵀ``, ``2 W`` kept where ``get``/``put`` say on the first call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = _lin()

    def get(self) -> torch.Tensor | None:
        raise NotImplementedError

    def put(self, w: torch.Tensor) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.get()
        if w is None:
            w = self.lin.weight * 2
            self.put(w)
        return x @ w.t()


class ClassMemo(Memoised):
    memo: dict[str, torch.Tensor] = {}

    def get(self) -> torch.Tensor | None:
        return type(self).memo.get("w")

    def put(self, w: torch.Tensor) -> None:
        type(self).memo["w"] = w


@dataclasses.dataclass(slots=True)
class Box:
    w: torch.Tensor | None = None


class SlotsMemo(Memoised):
    def __init__(self) -> None:
        super().__init__()
        self.box = Box()

    def get(self) -> torch.Tensor | None:
        return self.box.w

    def put(self, w: torch.Tensor) -> None:
        self.box.w = w


def _closure() -> tuple[Callable, Callable]:
    memo: dict[str, torch.Tensor] = {}
    return (lambda: memo.get("w")), (lambda w: memo.__setitem__("w", w))


class ClosureMemo(Memoised):
    def __init__(self) -> None:
        super().__init__()
        self.get, self.put = _closure()


_MODULE_MEMO: dict[str, torch.Tensor] = {}


class ModuleMemo(Memoised):
    """A module-level memo, and a forward that reads a value after filling it (a copy of the
    forward on tensors without values would stop there)."""

    def get(self) -> torch.Tensor | None:
        return _MODULE_MEMO.get("w")

    def put(self, w: torch.Tensor) -> None:
        _MODULE_MEMO["w"] = w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y if bool(y.isfinite().all()) else y.nan_to_num()


@pytest.mark.parametrize(
    "make",
    [ClassMemo, SlotsMemo, ClosureMemo, ModuleMemo],
    ids=["class attribute dict", "dataclass(slots=True)", "closure", "module level"],
)
def test_what_the_forward_keeps_is_what_the_model_would_keep(make: type) -> None:
    ClassMemo.memo.clear()
    _MODULE_MEMO.clear()
    torch.manual_seed(0)
    model = make()
    before = picture(model)
    x = torch.randn(2, 8)
    r = profile(model, inputs=x, timing=False)
    assert r.totals["macs"] == ONE  # (2, 8) @ (8, 8): 128
    assert picture(model) == before
    kept = model.get()
    assert type(kept) is torch.Tensor and kept.device.type == "cpu"
    assert torch.equal(kept, model.lin.weight.detach() * 2)
    with torch.no_grad():  # the next forward: from the memo, as without
        assert torch.equal(model(x), x @ (model.lin.weight * 2).t())  # a profile


# -- one forward ------------------------------------------------------------------------------


class CountsCalls(nn.Module):
    """Counts its calls in a class attribute; reads a value of its output."""

    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.lin = _lin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        y = self.lin(x)
        return y if bool(y.isfinite().all()) else y.nan_to_num()


def test_a_counting_only_profile_runs_the_forward_once() -> None:
    CountsCalls.calls = 0
    r = profile(CountsCalls(), inputs=torch.randn(2, 8), timing=False)
    assert CountsCalls.calls == 1
    assert r.totals["macs"] == ONE  # 128
