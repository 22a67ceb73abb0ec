"""Numbers a user compares with other tools, and outputs a person reads: the total parameters are
the model's, whatever the forward called."""

from __future__ import annotations

import pytest
import torch
from helpers import tv
from torch import nn

from modelprof import profile
from modelprof.counting.scope import NOT_CALLED
from modelprof.render.views import select_rows


class _Heads(nn.Module):
    """A body the forward calls and two heads it does not (an auxiliary head in eval)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 6)  # 4*6 + 6 = 30
        self.aux = nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 2))  # 21 + 8 = 29
        self.extra = nn.Linear(2, 2, bias=False)  # 4
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
    assert idle["type"].iloc[0] == "aux, extra"  # whole modules named, outermost
    assert int(idle["params"].iloc[0]) == 29 + 4
    assert int(idle["trainable_params"].iloc[0]) == 29  # extra.weight is frozen
    assert int(idle["macs"].iloc[0]) == 0 and int(idle["read_bytes"].iloc[0]) == 0
    assert int(df.loc[df["leaf"], "params"].sum()) == 63  # the leaf rows add up
    assert "33 of the params are in modules this forward did not call: aux, extra" in r.summary()


def test_the_not_called_row_stays_in_a_collapsed_table():
    # depth=0 showed the (root) row alone: 30 params above a total of 63 (the row sits at depth
    # 1, the root's sibling, and was cut with the root's children)
    r = profile(_Heads(), (4,), timing=False)
    for options in ({"depth": 0}, {"depth": 0, "leaf_only": True}, {"depth": 1}):
        shown = select_rows(r.to_dataframe(), **options)
        assert NOT_CALLED in set(shown["module"]), options
        # the root-level rows (depth 0) and the unused parameters' row: 30 + 33
        top = shown[(shown["depth"] == 0) | (shown["module"] == NOT_CALLED)]
        assert int(top["params"].sum()) == r.totals["params"] == 63, options
    assert "(not called)" in r.to_markdown(depth=0, standalone=False)


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


# -- frames a person prints: whole, in human units, numbers numeric underneath -----------------


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(1000, 1000), nn.ReLU(), nn.Linear(1000, 10))


def test_memory_estimate_prints_in_bytes_units_and_stays_numeric():
    est = profile(_mlp(), (1000,), timing=False).memory_estimate()
    # parameters: (1000*1000 + 1000 + 1000*10 + 10) * 4 bytes = 4,044,040 B = 3.86 MiB
    assert int(est.loc["parameters", "inference"]) == 4_044_040
    assert str(est["inference"].dtype) == "int64"
    text = repr(est)
    assert "3.86 MiB" in text and "4044040" not in text
    assert "training step" in text and "how" in text  # every column shown
    assert "3.86 MiB" in est._repr_html_()


def test_by_operator_prints_whole():
    ops = profile(_mlp(), (1000,), timing=False).by_operator()
    text = repr(ops)
    assert "rows x" not in text and "..." not in text
    # addmm: 1000*1000 + 1000*10 = 1,010,000 MACs, shown as 1.01 M
    assert "aten.addmm.default" in text and "1.01 M" in text
    assert int(ops.loc[ops["op"] == "aten.addmm.default", "macs"].iloc[0]) == 1_010_000


def test_training_step_phases_print_one_line_each():
    r = profile(
        _mlp(),
        (1000,),
        backward=True,
        optimizer="sgd",
        repeat=3,
        warmup=1,
        budget_s=0.2,
        roofline=False,
    )
    phases = r.training_step.timing.phases()
    lines = repr(phases).splitlines()
    assert lines[0].split() == ["phase", "median", "95%", "CI", "n", "stable"]
    assert [line.split()[0] for line in lines[1:]] == [
        "forward",
        "loss",
        "backward",
        "optimizer",
        "step",
    ]
    assert phases["forward"].median_ms > 0  # still the measurements underneath
    assert "<table>" in phases._repr_html_()


def test_phase_table_prints_every_column_and_names_the_bound_variant():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=128,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    from modelprof import profile_generation

    report = profile_generation(
        model, prompt_len=8, new_tokens=4, timing=False, cache=None, target="A100 SXM 80GB"
    )
    table = report.phase_table()
    text = repr(table)
    assert "rows x" not in text and "..." not in text
    assert text.splitlines()[0].startswith(
        "bound_*: roofline lower bound on A100 SXM 80GB (float32, datasheet: 19.50 TFLOP/s, "
        "2.04 TB/s)"
    )  # the variant, with its 2,039 GB/s
    assert "memory bound share" in text and "bound" in text.splitlines()[1]
    assert table["bound_ms"].dtype.kind == "f"  # numeric underneath
