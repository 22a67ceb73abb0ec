"""TimingOptions: parsed once at the boundary, every bad name or value a ModelProfError that
names it, and the same object accepted by every timing entry point."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from modelprof import ModelProfError, profile
from modelprof.runtime.execution import RunMode
from modelprof.runtime.inputs import make_inputs
from modelprof.timing import TimingOptions, measure_latency, measure_throughput, time_layers
from modelprof.timing.options import OPTION_NAMES
from modelprof.timing.sampler import DEFAULT_BUDGET_S, DEFAULT_MIN_SAMPLES, StopRule, WarmupPolicy


def test_defaults_and_keyword_round_trip():
    o = TimingOptions.parse()
    assert o == TimingOptions()
    assert o.stop == StopRule() and o.warmup == WarmupPolicy()
    assert (o.stop.budget_s, o.stop.min_samples) == (DEFAULT_BUDGET_S, DEFAULT_MIN_SAMPLES)
    assert set(o.as_kwargs()) == set(OPTION_NAMES)
    custom = TimingOptions.parse(
        repeat=7,
        warmup=2,
        amp="bf16",
        channels_last=True,
        compile=True,
        cold_cache=True,
        seed=3,
        correct_overhead=False,
    )
    assert TimingOptions.parse(**custom.as_kwargs()) == custom
    assert (custom.stop.repeat, custom.warmup.count) == (7, 2)
    assert custom.amp is torch.bfloat16 and custom.compile == "default"
    # one carrier: autocast and layout are the run mode's, parsed as profile's RunMode is
    assert custom.run == RunMode.parse(amp="bf16", channels_last=True)
    assert custom.channels_last is True and TimingOptions().channels_last is False


def test_keywords_update_a_given_options_object():
    base = TimingOptions.parse(repeat=5, amp=torch.float16)
    o = TimingOptions.parse(base, warmup=1)
    assert (o.stop.repeat, o.amp, o.warmup.count) == (5, torch.float16, 1)
    r = base.replace(repeat=9)
    assert r.stop.repeat == 9 and r.amp is torch.float16
    assert base.stop.repeat == 5  # frozen: replace makes a copy
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.transfer = True  # type: ignore[misc]


def test_unknown_options_are_named_with_the_valid_ones():
    with pytest.raises(ModelProfError) as info:
        TimingOptions.parse(repeats=3, budget=1.0)
    text = str(info.value)
    assert "['budget', 'repeats']" in text  # each unknown name, sorted
    assert "'budget_s'" in text and "'repeat'" in text  # and what the user may have meant


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(clock="wall"), "clock='wall'"),
        (dict(compile_kwargs=["backend"]), "compile_kwargs=['backend']"),
        (dict(seed=True), "seed=True"),
        (dict(seed="7"), "seed='7'"),
        (dict(compile="fastest"), "compile='fastest'"),
        (dict(cuda_graph=True, compile=True), "cuda_graph=True with compile=True"),
        (dict(transfer="yes"), "transfer='yes'"),
        (dict(channels_last=1), "channels_last=1"),
        (dict(correct_overhead=None), "correct_overhead=None"),
        (dict(amp=torch.float32), "amp=torch.float32"),
        (dict(amp="int8"), "amp='int8'"),
        (dict(warmup=-1), "warmup=-1"),
        (dict(warmup_s=float("nan")), "warmup_s=nan"),
        (dict(repeat=0), "repeat=0"),
        (dict(precision=1.0), "precision=1.0"),
        (dict(budget_s=0), "budget_s=0"),
        (dict(min_blocks=0), "min_blocks=0"),
        (dict(min_samples=20, max_samples=5), "max_samples=5 is below min_samples=20"),
    ],
)
def test_bad_values_are_named(kwargs, needle):
    with pytest.raises(ModelProfError) as info:
        TimingOptions.parse(**kwargs)
    assert needle in str(info.value)


def test_options_must_be_a_timing_options_object():
    with pytest.raises(ModelProfError, match=r"options=\{'repeat': 3\}"):
        TimingOptions.parse({"repeat": 3})  # type: ignore[arg-type]


def test_modes_that_need_cuda_refuse_other_devices():
    o = TimingOptions.parse(transfer=True)
    o.check_device(torch.device("cuda", 0))  # fine on CUDA (nothing runs here)
    with pytest.raises(ModelProfError, match="transfer=True needs a CUDA device.*cpu"):
        o.check_device(torch.device("cpu"))
    with pytest.raises(ModelProfError, match="cuda_graph=True needs a CUDA device"):
        TimingOptions.parse(cuda_graph=True).check_device(torch.device("cpu"))


def test_end_to_end_only_modes_and_flags():
    assert TimingOptions().end_to_end_only == ()
    o = TimingOptions.parse(compile="max-autotune", transfer=True)
    assert o.end_to_end_only == ("compile='max-autotune'", "transfer")
    assert TimingOptions.parse(cuda_graph=True).end_to_end_only == ("cuda_graph",)
    f = TimingOptions.parse(amp="fp16", channels_last=True).flags(eval_mode=False)
    assert f == dict(
        transfer=False,
        pin_memory=None,
        cuda_graph=False,
        amp=torch.float16,
        channels_last=True,
        cold_cache=False,
        compile=None,
        eval_mode=False,
        no_grad=True,
    )


def test_every_entry_point_rejects_the_same_bad_option_before_running():
    model = nn.Linear(4, 4)
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    entry_points = [
        lambda: measure_latency(model, torch.zeros(1, 4), repeats=3),
        lambda: time_layers(model, make_inputs(model, (4,)), repeats=3),
        lambda: measure_throughput(model, (4,), repeats=3),
        lambda: profile(model, (4,), repeats=3),
    ]
    for run in entry_points:
        with pytest.raises(ModelProfError, match=r"\['repeats'\]"):
            run()
    assert calls == []  # rejected before any forward


def test_every_entry_point_takes_an_options_object():
    opts = TimingOptions.parse(warmup=1, repeat=3, warn=False)
    model = nn.Linear(4, 4)
    assert measure_latency(model, torch.zeros(1, 4), options=opts).n == 3
    assert time_layers(model, make_inputs(model, (4,)), options=opts).n == 3
    r = profile(model, (4,), options=opts, roofline=False)
    assert r.latency.n == 3 and r.layer_timing.n == 3
    assert r.options["repeat"] == 3
