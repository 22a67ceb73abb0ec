"""A misspelt keyword to profile_generation or compare_generation (and fit, diff, sweep)
names the nearest of the function's own keywords, as profile's does: a newcomer's
``promt_len=`` was answered with the timing options alone, none of them near."""

from __future__ import annotations

import pytest
from helpers import tiny_llama

from modelprof import ModelProfError, compare_generation, profile_generation


@pytest.mark.parametrize(
    "given, meant",
    [("promt_len", "prompt_len"), ("new_token", "new_tokens"), ("targt", "target")],
)
def test_profile_generation_names_its_own_keyword(given, meant):
    with pytest.raises(ModelProfError, match=rf"\({given}=: did you mean {meant}=\?\)"):
        profile_generation(tiny_llama(), **{given: 4})


@pytest.mark.parametrize(
    "given, meant", [("promt_len", "prompt_len"), ("batch_sise", "batch_size"), ("cach", "cache")]
)
def test_compare_generation_names_its_own_keyword(given, meant):
    with pytest.raises(ModelProfError, match=rf"\({given}=: did you mean {meant}=\?\)"):
        compare_generation({"a": tiny_llama()}, **{given: 4})


def test_compare_generation_names_a_misspelt_baseline_and_refuses_an_unknown_one():
    # baseline= as compare()'s: a misspelling is named, a name not among the models refused
    with pytest.raises(ModelProfError, match=r"\(basline=: did you mean baseline=\?\)"):
        compare_generation({"a": tiny_llama()}, basline="a")
    with pytest.raises(ModelProfError, match=r"^baseline='b' is not one of the models: \['a'\]"):
        compare_generation({"a": tiny_llama()}, baseline="b")


def test_functions_of_fixed_keywords_name_the_nearest_too(tmp_path):
    # fit(devce=), report.diff(name=) and sweep(ot=) raised Python's bare TypeError, which names
    # only the keyword refused
    from torch import nn

    from modelprof import fit, profile, sweep

    report = profile(nn.Linear(4, 4), (4,), timing=False)
    with pytest.raises(ModelProfError, match=r"^fit\(\) .*\(devce=: did you mean device=\?\)"):
        fit(nn.Linear(4, 4), devce="L4")
    with pytest.raises(ModelProfError, match=r"\(name=: did you mean names=\?\); it takes \["):
        report.diff(report, name=("a", "b"))
    with pytest.raises(ModelProfError, match=r"\(ot=: did you mean out=\?\)"):
        sweep(tmp_path / "grid.toml", ot=tmp_path)
    with pytest.raises(ModelProfError, match=r"takes no keyword\(s\) \['foo'\]; it takes"):
        report.to_trace(foo=1)
    assert report.diff(report, names=("a", "b"))["macs_ratio"].eq(1.0).all()  # still runs


def test_the_measuring_functions_name_their_own_keywords_too():
    # measure_throughput(max_bach=2) was "unknown timing option(s)" with no nearest name: its
    # own keywords were not among those searched
    from torch import nn

    from modelprof import measure_latency, measure_throughput

    model = nn.Linear(4, 4)
    with pytest.raises(ModelProfError, match=r"\(max_bach=: did you mean max_batch=\?\)"):
        measure_throughput(model, (4,), max_bach=2)
    with pytest.raises(ModelProfError, match=r"\(devce=: did you mean device=\?\)"):
        measure_latency(model, input_size=(4,), devce="cpu")
    with pytest.raises(ModelProfError, match=r"\(budgt_s=: did you mean budget_s=\?\)"):
        measure_latency(model, input_size=(4,), budgt_s=1.0)


def test_per_layer_false_points_to_layer_timing():
    # per_layer picks how layers are timed; the option that times none is layer_timing=False
    with pytest.raises(ModelProfError, match=r"profile_generation's layer_timing=False times no"):
        profile_generation(tiny_llama(), prompt_len=4, new_tokens=2, per_layer=False)
