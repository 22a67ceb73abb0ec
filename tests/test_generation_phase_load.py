"""A phase's time read on a loaded machine is marked rough by the rule a single profile() marks
a loaded end to end by (``unquotable``): the summary called every TTFT/TPOT of a loaded run
no figure to quote while ``phase_table()`` held ``latency_rough`` False on every phase. The
load is made up (``MachineShare`` patched, as tests/test_machine_load.py does), never made."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import tiny_llama

from modelprof import profile_generation
from modelprof.errors import LoadedMachineWarning
from modelprof.runtime.env import MachineShare
from modelprof.timing.measurement import LOADED_COMPETING_CORES

transformers = pytest.importorskip("transformers")


def test_a_phase_timed_on_a_loaded_machine_is_rough_and_the_caption_says_why(monkeypatch):
    # every window reads 1.5 cores' worth of other work, over LOADED_COMPETING_CORES = 0.25
    other = 1.5
    assert other > LOADED_COMPETING_CORES
    monkeypatch.setattr(MachineShare, "competing_cores", property(lambda self: other))
    monkeypatch.setattr(MachineShare, "margin", property(lambda self: 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = profile_generation(tiny_llama(), prompt_len=4, new_tokens=2, budget_s=0.05)
    table = r.phase_table()
    # prefill (the first new token) and new_tokens - 1 = 1 decode step, at context 4 = the
    # prompt: 2 phases, each read under the same 1.5 cores of other work, so loaded and rough
    assert len(table) == 2
    assert table["latency_rough"].tolist() == [True, True]
    for p in r.phases():
        assert p.report.latency.competing_cores == other  # the share read into the phase
        assert p.report.latency.loaded
    # each phase's per-layer rows are rough with it (phase_frame)
    frame = r.phase_frame(r.prefill())
    assert frame["latency_rough"].sum() == frame["latency_ms"].notna().sum() > 0
    # the caption names the rough phases under why (unquotable's words for a loaded run)
    caption = table.attrs["modelprof_caption"]
    assert caption.startswith("latency marked ~ is no figure to quote (the machine was loaded")
    # real times: the load may also make one phase slower than one doing more work
    points = ("prefill at batch 1", "decode@4 at batch 1")
    slower = [p for p in points if any(d.point == p for d in r.disagreements)]
    if not slower:  # both under the one reason, the load's
        assert "prefill at batch 1, decode@4 at batch 1)" in caption
    else:  # such a phase is named under both reasons, the other under the load's
        for point in slower:
            assert f"slower than a phase doing more work: {point}" in caption
        assert all(p in caption for p in points)
    # and the summary's timing notes count them among the figures no quote rests on
    notes = r.timing_notes
    assert any(n.startswith("prefill at batch 1, median") for n in notes)


def test_a_phase_on_an_idle_machine_is_not_marked_by_the_load(monkeypatch):
    # 0 cores of other work: below LOADED_COMPETING_CORES = 0.25, not loaded
    monkeypatch.setattr(MachineShare, "competing_cores", property(lambda self: 0.0))
    monkeypatch.setattr(MachineShare, "margin", property(lambda self: 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = profile_generation(tiny_llama(), prompt_len=4, new_tokens=2, budget_s=0.05)
    for p in r.phases():
        assert p.report.latency.competing_cores == 0.0
        assert not p.report.latency.loaded


def _loaded(monkeypatch, other):
    monkeypatch.setattr(MachineShare, "competing_cores", property(lambda self: other))
    monkeypatch.setattr(MachineShare, "margin", property(lambda self: 0.0))


@pytest.mark.parametrize(
    ("threads", "advice"),
    [
        # 1 thread: none fewer to ask for, so only a quieter machine (never "--threads 1")
        (1, None),
        # 2 threads less 1.5 cores of other work leave floor(0.5) = 0, so 1 (the least):
        # profile()'s rule (Measurement.threads_hint) names it
        (2, "torch.set_num_threads(1): other work took 1.50 of the cores its 2 threads need"),
    ],
)
def test_a_loaded_generations_advice_names_fewer_threads_than_it_ran_on(
    monkeypatch, threads, advice
):
    _loaded(monkeypatch, 1.5)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            r = profile_generation(tiny_llama(), prompt_len=4, new_tokens=2, budget_s=0.05)
    finally:
        torch.set_num_threads(before)
    # every figure was read under the 1.5 cores of other work: its warning says so (as a
    # LoadedMachineWarning, or appended to a drift or few-runs one)
    said_loaded = [str(w.message) for w in rec if "the machine was loaded" in str(w.message)]
    loaded = [str(w.message) for w in rec if issubclass(w.category, LoadedMachineWarning)]
    assert loaded and set(loaded) <= set(said_loaded)
    loaded = said_loaded
    said = loaded + r.timing_notes
    assert not any("for k cores left idle" in t for t in said)  # no literal k: the count read
    assert not any(f"set_num_threads({threads})" in t for t in said)  # never the one in use
    assert not any("--threads 1" in t for t in said)
    if advice is None:
        assert not any("set_num_threads" in t for t in said)
        assert all("time again on a quieter machine" in t for t in loaded)
    else:
        # (a warning whose CPU work holds says to quote it instead; the notes always advise)
        assert any(advice in n for n in r.timing_notes)
