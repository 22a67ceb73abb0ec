"""A comparison with a failing candidate keeps the others (the failure in its row); the timers'
errors name the candidate; a backward inside inference_mode says so; the human tables say which
way ``rank`` runs."""

from __future__ import annotations

import pytest
import torch
from helpers import latex_headers
from torch import nn

from modelprof import ModelProfError, compare, measure_latencies
from modelprof.profile import META_NOTE

QUICK = dict(budget_s=0.1, warn=False)


class _Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        raise RuntimeError("boom")


class _SecondCallFails(nn.Module):
    """Counted fine (its first call), fails when timed (every later call)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = [0]

    def forward(self, x):
        self.calls[0] += 1
        if self.calls[0] > 1:
            raise RuntimeError("tired")
        return self.fc(x)


@pytest.mark.parametrize("timing", [False, True])
def test_a_failing_model_keeps_the_others_table(timing):
    models = {"a": nn.Linear(4, 4), "bad": _Boom(), "c": nn.Linear(4, 8)}
    df = compare(models, (4,), timing=timing, **(QUICK if timing else {"warn": False}))
    assert list(df.index) == ["a", "bad", "c"]
    # a: 4 x 4 = 16 MACs; c: 4 x 8 = 32 MACs; the ratio to the baseline a: 2
    assert df.loc["a", "macs"] == 16 and df.loc["c", "macs"] == 32 and df.loc["c", "macs_x"] == 2
    assert "RuntimeError: boom" in df.loc["bad", "error"] and pd_isna(df.loc["bad", "macs"])
    assert df.attrs["failed"].keys() == {"bad"}
    assert any(n.startswith("bad failed and is not compared") for n in df.attrs["notes"])
    if timing:  # only the two that ran are ranked: unless the ranks are withheld, said in
        # attrs (too few runs, or the ranking ratio disagreeing with its rounds: a loaded run)
        withheld = df.attrs.get("unranked") or "ratios_disagree" in df.attrs
        ranks = sorted(df["rank"].dropna().tolist())
        assert ranks == [] if withheld else ranks in ([1, 2], [1, 1])
        assert pd_isna(df.loc["bad", "rank"])


def test_a_model_that_ran_shows_no_error_in_the_human_tables():
    # the error column holds the failed model's message; a model that ran has none, blank (not
    # "n/a", which every other missing cell reads: a reader took it for "error unknown")
    df = compare({"a": nn.Linear(4, 4), "bad": _Boom()}, (4,), timing=False, warn=False)
    for text in (df.render.to_markdown(), df.render.to_text()):
        ran = next(line for line in text.splitlines() if line.lstrip("| ").startswith("a "))
        assert "n/a" not in ran and "boom" not in ran
        assert "RuntimeError: boom" in text


@pytest.mark.parametrize("timing", [False, True])
def test_a_failed_models_row_stays_whole_and_reads_back_from_csv(timing):
    # a newcomer's table printed params 2542856.0 beside a failed model, and its CSV read back
    # rank as 1.0 / NaN and the error of a model that ran as ""
    import pandas as pd

    from modelprof.render import read_csv

    models = {"a": nn.Linear(4, 4), "bad": _Boom()}
    df = compare(models, (4,), timing=timing, **(QUICK if timing else {"warn": False}))
    # a: 4 x 4 + 4 = 20 params, 16 MACs; bad ran none: <NA> in a nullable Int64 column
    assert df["params"].dtype == "Int64" and df["params"].tolist() == [20, pd.NA]
    assert df["macs"].dtype == "Int64" and df["macs"].tolist() == [16, pd.NA]
    assert pd_isna(df.loc["a", "error"]) and pd_isna(df.loc["bad", "input_shape"])
    if timing:  # a ran at least once and is the only one ranked: 1
        assert df["latency_n"].dtype == "Int64" and df.loc["a", "latency_n"] >= 1
        assert df["rank"].dtype == "Int64" and df["rank"].tolist() == [1, pd.NA]
    for text in (df.to_csv(), df.render.to_csv()):  # pandas' CSV and modelprof's
        back = read_csv(text).set_index("model")
        pd.testing.assert_frame_equal(back, pd.DataFrame(df), check_exact=True)


@pytest.mark.parametrize("timing", [False, True])
def test_a_table_of_the_models_that_ran_reads_back_from_csv_as_it_is(timing):
    # filtered to the models that ran, a comparison keeps the dtypes a failure gave it (Int64
    # counts and rank, flags True/False/None): its CSV, with no gap left, read back int64 and
    # bool, and an error column of NaN as float64
    import pandas as pd

    from modelprof.render import read_csv

    models = {"a": nn.Linear(4, 4), "b": nn.Linear(4, 8), "bad": _Boom()}
    df = compare(models, (4,), timing=timing, **(QUICK if timing else {"warn": False}))
    ran = df[df["error"].isna()]
    assert list(ran.index) == ["a", "b"] and ran["params"].dtype == "Int64"
    for table in (ran, df):
        for kw in ({}, {"columns": ["params", "macs"]}):
            back = read_csv(table.render.to_csv(**kw)).set_index("model")
            want = pd.DataFrame(table)[back.columns]
            pd.testing.assert_frame_equal(back, want, check_exact=True)
            # (a selection keeps the error column: a CSV holds no dtypes, it says them)
            assert "error" in back.columns


def pd_isna(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def test_a_failing_baseline_hands_the_ratios_to_the_next():
    df = compare({"bad": _Boom(), "a": nn.Linear(4, 4), "c": nn.Linear(4, 8)}, (4,), timing=False)
    # the baseline is the first model that ran: a (16 MACs); c's 32 MACs are 2x
    assert df.attrs["baseline"] == "a" and df.loc["c", "macs_x"] == 2
    # a Markdown document says the failure once: in its caption, over the error column it
    # points to (the note below the table said it again); under a caption of one's own, the
    # note listed below the table says it
    said = "bad failed and is not compared (its error column says why)"
    md = df.render.to_markdown()
    assert md.startswith("**baseline a;") and md.count("bad failed") == 1 and said in md
    notes = df.render.to_markdown(caption="Models").split("\n\n")[-1].splitlines()
    assert notes == [f"- {said}"]


def test_a_model_failing_only_when_timed_leaves_the_timed_comparison():
    models = {"a": nn.Linear(4, 4), "tired": _SecondCallFails(), "c": nn.Linear(4, 8)}
    df = compare(models, (4,), **QUICK)
    assert "candidate 'tired'" in df.loc["tired", "error"] and "tired" in df.loc["tired", "error"]
    assert df.loc["a", "latency_median_ms"] > 0 and df.loc["c", "latency_median_ms"] > 0
    assert pd_isna(df.loc["tired", "rank"])


def test_every_model_failing_names_each():
    with pytest.raises(ModelProfError, match=r"every model failed: model 'x': .*boom.*model 'y'"):
        compare({"x": _Boom(), "y": _Boom()}, (4,), timing=False)


def test_measure_latencies_names_the_failing_candidate():
    x = torch.randn(1, 4)
    with pytest.raises(ModelProfError, match=r"^candidate 'bad': the forward pass failed"):
        measure_latencies({"ok": nn.Linear(4, 4), "bad": _Boom()}, x, **QUICK)
    with pytest.raises(ModelProfError, match=r"^candidate 'three': .*not callable"):
        measure_latencies({"ok": nn.Linear(4, 4), "three": 3}, x, **QUICK)
    with pytest.raises(ModelProfError, match=r"^candidate 'wide': .*shapes cannot be multiplied"):
        measure_latencies({"ok": nn.Linear(4, 4), "wide": nn.Linear(5, 5)}, x, **QUICK)


def test_a_backward_inside_inference_mode_says_inference_mode():
    # models built inside it too: their outputs then need no grad, and the refusal was the
    # default loss's "no floating tensor that requires grad"
    with torch.inference_mode():
        models = {"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)}
        with pytest.raises(ModelProfError, match=r"^backward=True inside torch.inference_mode"):
            compare(models, (4,), backward=True, **QUICK)


@pytest.mark.parametrize("fmt", ["markdown", "text", "html"])
def test_the_human_tables_say_which_way_rank_runs(fmt):
    df = compare({"a": nn.Linear(4, 4), "b": nn.Linear(4, 8)}, (4,), **QUICK)
    assert df.attrs["ranked_by"] in ("latency", "cpu_work")
    out = str(getattr(df.render, f"to_{fmt}")())
    by = "CPU work" if df.attrs["ranked_by"] == "cpu_work" else "latency"
    assert f"rank (1 = lowest {by})" in out
    assert "rank" in df.columns  # the frame's own column keeps its name


def test_profile_backward_inside_inference_mode_says_inference_mode():
    # the same refusal from profile() itself, before any forward runs (it was the forward's
    # "Inference tensors cannot be saved for backward", from inside the model)
    import modelprof

    model = nn.Linear(4, 4)
    with torch.inference_mode():
        with pytest.raises(ModelProfError, match=r"call profile\(\) outside inference_mode"):
            modelprof.profile(model, (4,), backward=True, timing=False)
    # outside it the same call counts the step
    assert modelprof.profile(model, (4,), backward=True, timing=False).totals["backward_flops"] > 0


@pytest.mark.parametrize(
    "models",
    [
        {"a": _Boom(), "b": _SecondCallFails()},  # one fails counted, the last one timed
        {"a": _SecondCallFails(), "b": _SecondCallFails()},  # both timed, one after the other
    ],
)
def test_every_model_failing_names_each_however_each_failed(models):
    # the last one left failing its timing raised its own error alone, naming only it
    with pytest.raises(ModelProfError, match="every model failed") as err:
        compare(models, (4,), **QUICK)
    text = str(err.value)
    assert "model 'a'" in text and "model 'b'" in text
    assert "candidate 'b': " not in text  # named once, not twice


def test_a_paper_table_of_a_comparison_says_who_failed():
    models = {"a": nn.Linear(4, 4), "bad": _Boom()}
    df = compare(models, (4,), timing=False, warn=False)
    tex = df.render.to_latex()
    # the error column is the first a page drops, and a .tex file holds no notes: the caption
    # says the error itself (the exception, without the module path and inputs before it),
    # pointing to nothing the table leaves out
    caption = next(line for line in tex.splitlines() if line.startswith("\\caption"))
    assert "dropped to fit" in tex and "error" not in latex_headers(tex)
    assert caption.endswith("; bad failed and is not compared: RuntimeError: boom}")
    assert "column" not in caption and "notes" not in caption
    # kept (width=None), the column says it, and the caption points to it
    wide = df.render.to_latex(width=None)
    assert "error" in latex_headers(wide)
    assert "bad failed and is not compared (its error column says why)}" in wide
    # Markdown (a document) and text alike: the column left out, the caption says the error,
    # and no note below the table points to the missing column
    md = df.render.to_markdown(columns=["params", "macs"])
    assert "bad failed and is not compared: RuntimeError: boom**" in md and "column" not in md
    text = df.render.to_text(columns=["params"])
    assert text.splitlines()[0].endswith("; bad failed and is not compared: RuntimeError: boom")
    # a caption of one's own keeps why the row is empty, as it keeps the rank's way
    own = df.render.to_latex(caption="Models")
    assert "\\caption{Models. bad failed and is not compared: RuntimeError: boom}" in own


def test_a_captions_error_is_the_exception_cut_at_a_word():
    from modelprof.render.comparison import brief_error

    said = (
        "the forward pass failed in module 'fc' (Linear, input 1x64); running: (root) > fc. "
        "Inputs were 1x64 (float32). RuntimeError: mat1 and mat2 shapes cannot be multiplied"
        " (1x64 and 10x10)\nhint: pass dtype=..."
    )
    # from the exception's name to the end of its line: 72 characters, under the 100 kept
    assert brief_error(said) == (
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x64 and 10x10)"
    )
    # over the limit: cut at the last space in its first 20 - 3 = 17 characters ("RuntimeError:
    # mat"), the colon before it dropped, "..." after: 15 characters
    assert brief_error(said, limit=20) == "RuntimeError..."
    # no exception named (modelprof's own words): the first line, whole
    assert brief_error("cannot load x.py: no build()\nmore") == "cannot load x.py: no build()"


def test_a_paper_table_of_a_comparison_keeps_rank_and_says_its_way_in_the_caption():
    import pandas as pd

    from modelprof.render.comparison import export_comparison

    df = pd.DataFrame(
        {
            "params": [4160.0, 8320.0],
            "macs": [4096.0, 8192.0],
            "latency_median_ms": [1.0, 2.0],
            "latency_x": [1.0, 2.0],
            "fps": [1000.0, 500.0],
            "flops": [8256.0, 16512.0],
            "rank": pd.array([1, 2], dtype="Int64"),
        },
        index=pd.Index(["a", "b"], name="model"),
    )
    df.attrs.update(baseline="a", ranked_by="latency")
    tex = export_comparison(df, "latex", columns=["model", *df.columns])
    head = tex.split(r"\midrule")[0]
    # headed "rank (1 = lowest latency)" the column was the widest and the first the fit
    # dropped, below FLOPs; as "rank" it stays and the caption says which way it runs
    assert head.rstrip().splitlines()[-2].startswith("model & params") and "rank" in head
    assert r"\caption{" in tex and "rank (1 = lowest latency)}" in tex


class _BackwardFailsLater(torch.autograd.Function):
    calls = [0]

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _BackwardFailsLater.calls[0] += 1
        if _BackwardFailsLater.calls[0] > 2:  # counted fine; fails once its step is timed
            raise RuntimeError("backward boom")
        return grad * 2


class _TrainsBadly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return _BackwardFailsLater.apply(self.fc(x))


def test_a_model_failing_its_timed_training_step_leaves_the_others():
    # the step timer's error named no candidate: the whole comparison was lost
    _BackwardFailsLater.calls[0] = 0
    models = {"a": nn.Linear(4, 4), "bad": _TrainsBadly(), "c": nn.Linear(4, 8)}
    df = compare(models, (4,), backward=True, **QUICK)
    named = "a training step of bad failed in the backward of module '(root)' (_TrainsBadly)"
    assert f"{named} while timing it" in df.loc["bad", "error"]
    assert "RuntimeError: backward boom" in df.loc["bad", "error"]
    assert df.loc["a", "backward_latency_median_ms"] > 0
    assert df.loc["c", "backward_latency_median_ms"] > 0
    assert pd_isna(df.loc["bad", "latency_median_ms"]) and pd_isna(df.loc["bad", "rank"])


def test_a_training_step_failing_midway_through_its_rounds_leaves_the_others():
    # repeat=6, warmup=1: bad's backward runs 8 times in all (counting, one warm-up step, six
    # rounds of one step); counted from -3 it fails on its 6th call, in the rounds, after the
    # others kept blocks. The others are timed again from scratch: their earlier blocks were
    # kept beside the new ones before ("blocks has 6 entries for 9 samples")
    _BackwardFailsLater.calls[0] = -3
    models = {"a": nn.Linear(4, 4), "bad": _TrainsBadly(), "c": nn.Linear(4, 8)}
    df = compare(models, (4,), backward=True, repeat=6, warmup=1, warn=False)
    assert "RuntimeError: backward boom" in df.loc["bad", "error"]
    assert df.loc["c", "backward_latency_median_ms"] > 0 and df.loc["a", "latency_n"] == 6


def test_a_failing_model_in_a_comparison_is_said_once_not_only_in_its_row():
    # a row with an error cell is easy to miss in a wide table: a warning names the model and
    # its error (warn=False: none)
    from modelprof import ModelProfWarning

    models = {"a": nn.Linear(4, 4), "bad": _Boom()}
    with pytest.warns(ModelProfWarning, match=r"bad failed and is not compared: .*boom"):
        compare(models, (4,), timing=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelProfWarning)
        compare(models, (4,), timing=False, warn=False)


def test_a_failing_throughput_search_keeps_the_models_counted_row():
    # a BatchNorm1d in train mode cannot run a batch of 1, where the search starts: the model
    # was counted at batch 4 and its row stays, its throughput NaN, the error in a note and a
    # warning; the other model's search runs (its throughput > 0)
    from modelprof import ModelProfWarning

    bn = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    models = {"bn": bn, "relu": nn.Sequential(nn.Linear(8, 8), nn.ReLU())}
    opts = {"max_batch": 2, "budget_s": 0.05}
    with pytest.warns(ModelProfWarning, match=r"bn throughput: not measured: .*BatchNorm1d"):
        df = compare(
            models,
            (8,),
            batch_size=4,
            training=True,
            timing=False,
            throughput=True,
            throughput_options=opts,
        )
    # bn: Linear 8 x 8 = 64 MACs per sample, x 4 samples = 256
    assert df.loc["bn", "macs"] == 256 and "error" not in df.columns
    assert pd_isna(df.loc["bn", "throughput_samples_per_s"])
    assert df.loc["relu", "throughput_samples_per_s"] > 0
    assert any("bn throughput: not measured" in n for n in df.attrs["notes"])
    # a bad search bound is the caller's mistake, said once before any model runs
    with pytest.raises(ModelProfError, match=r"^max_batch=0"):
        compare(models, (8,), timing=False, throughput=True, throughput_options={"max_batch": 0})


def test_a_misspelt_search_bound_in_throughput_options_is_named_with_the_bound():
    # a newcomer's {"max_btach": 4} read "unknown timing option(s)" and a list without
    # max_batch, as if max_batch were not an option either
    with pytest.raises(ModelProfError, match=r"max_btach=: did you mean max_batch=\?"):
        compare(
            [nn.Linear(4, 4)],
            (4,),
            timing=False,
            throughput=True,
            throughput_options={"max_btach": 4},
        )


def test_a_throughput_search_refusing_the_callers_options_is_an_error_not_a_nan():
    # only a model failing to run its batch leaves a NaN throughput beside its counted row; a
    # search on meta (no clock) is refused once, before any model is built (a spec naming no
    # model would say so first), not each model failing alike ("every model failed")
    with pytest.raises(ModelProfError, match=r"^device='meta' has no clock: throughput=True"):
        compare([nn.Linear(4, 4), "no_such_model"], (4,), device="meta", throughput=True)


def test_timing_on_meta_counts_only_with_a_note_as_profile_does():
    # it raised "every model failed: ... device='meta' has no clock: pass timing=False"
    table = compare([nn.Linear(4, 4), nn.Linear(4, 8)], (4,), device="meta")
    # batch 1: 4 * 4 = 16 and 4 * 8 = 32 MACs; nothing timed
    assert table["macs"].tolist() == [16, 32] and "latency_median_ms" not in table
    assert table.attrs["notes"] == [META_NOTE] and "error" not in table


def test_the_rates_print_as_counts_like_samples_per_s() -> None:
    import pandas as pd

    from modelprof.render.comparison import export_comparison

    # 1000 / 5.498 us = 181,884.32 FPS and 1000 / 1.3964 us = 716,127.18 (as compare() makes
    # them, 1000 / latency_median_ms); printed as samples/s is, SI prefix and 2 decimals:
    # 181884.32 / 1e3 = 181.88 K, 716127.18 / 1e3 = 716.13 K, 2240.5 / 1e3 = 2.24 K
    fps = [1000.0 / 0.005498, 1000.0 / 0.0013964]
    df = pd.DataFrame(
        {"fps": fps, "throughput_samples_per_s": [2240.5, 2240.5], "samples_per_s": fps},
        index=pd.Index(["a", "b"], name="model"),
    )
    df.attrs.update(baseline="a", ranked_by="latency")
    for fmt in ("text", "markdown"):
        out = export_comparison(df, fmt, columns=["model", *df.columns])
        a, b = (line.replace("|", " ").split() for line in out.splitlines()[-2:])
        assert a[1:] == ["181.88", "K", "2.24", "K", "181.88", "K"], out  # was 181884.32
        assert b[1:] == ["716.13", "K", "2.24", "K", "716.13", "K"], out


@pytest.mark.parametrize(
    "clash, said",
    [
        (dict(dtype=torch.float64, amp="bf16"), "amp=bfloat16 on a float64 run"),
        (dict(backward=True, compile=True), "not supported with backward=True"),
    ],
)
def test_options_every_model_refuses_are_refused_once_before_any_runs(clash, said):
    # each model was profiled and refused them alike: "every model failed", the reason once
    # per model, marked a failed model (the command line's exit status 1)
    ran = []
    models = {n: nn.Linear(4, 4) for n in "ab"}
    for m in models.values():
        m.register_forward_hook(lambda *_: ran.append(1))
    with pytest.raises(ModelProfError, match=said) as err:
        compare(models, (4,), timing=False, **clash)
    assert "every model failed" not in str(err.value) and str(err.value).count(said) == 1
    assert not getattr(err.value, "model_failed", False) and ran == []
