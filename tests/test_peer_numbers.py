"""Numbers a user compares with other tools, and outputs a person reads: the total parameters are
the model's, whatever the forward called."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.counting.scope import NOT_CALLED
from helpers import tv


class _Heads(nn.Module):
    """A body the forward calls and two heads it does not (an auxiliary head in eval)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 6)                                  # 4*6 + 6 = 30
        self.aux = nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 2))   # 21 + 8 = 29
        self.extra = nn.Linear(2, 2, bias=False)                     # 4
        self.extra.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize("route", ["meta", "real"])
def test_total_params_are_the_models_with_a_not_called_row(route, monkeypatch):
    monkeypatch.setenv("MODELPROF_STATIC_ROUTE", route)
    r = profile(_Heads(), (4,), timing=False)
    assert r.totals["params"] == r.model_params == 30 + 29 + 4  # every tensor once: 63
    df = r.to_dataframe()
    idle = df[df["module"] == NOT_CALLED]
    assert len(idle) == 1 and bool(idle["leaf"].iloc[0])
    assert idle["type"].iloc[0] == "aux, extra"       # whole modules named, outermost
    assert int(idle["params"].iloc[0]) == 29 + 4
    assert int(idle["trainable_params"].iloc[0]) == 29   # extra.weight is frozen
    assert int(idle["macs"].iloc[0]) == 0 and int(idle["read_bytes"].iloc[0]) == 0
    assert int(df.loc[df["leaf"], "params"].sum()) == 63   # the leaf rows add up
    assert "33 of the params are in modules this forward did not call: aux, extra" in r.summary()


def test_a_partly_used_module_names_its_unused_parameter():
    class Half(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(torch.ones(3))
            self.inner = nn.Module()
            self.inner.used = nn.Parameter(torch.ones(3))
            self.inner.spare = nn.Parameter(torch.ones(5))
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x * self.a + x * self.inner.used)

    r = profile(Half(), (3,), timing=False)
    assert r.totals["params"] == 3 + 3 + 5
    idle = r.to_dataframe().set_index("module").loc[NOT_CALLED]
    assert idle["type"] == "inner.spare" and idle["params"] == 5


def test_training_step_rows_add_up_with_a_not_called_head():
    r = profile(_Heads(), (4,), timing=False, backward=True)
    assert r.totals["params"] == 63
    assert r.to_dataframe().set_index("module").loc[NOT_CALLED, "params"] == 33


def test_inception_v3_eval_params_match_the_peers():
    model = tv("inception_v3", init_weights=False, aux_logits=True).eval()
    r = profile(model, (3, 299, 299), timing=False)
    # torchvision's documented count, as torchinfo, thop and calflops report it
    assert r.totals["params"] == 27_161_264
    idle = r.to_dataframe().set_index("module").loc[NOT_CALLED]
    assert idle["type"] == "AuxLogits"
    assert idle["params"] == sum(p.numel() for p in model.AuxLogits.parameters())
