"""One peak per run, said the same everywhere (issue 38 item 15): the summary's note on a busy
probe quotes the roof its MFU line and the plot use; a generation's utilization without a peak
says why in a sentence that fits a generation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import modelprof
from modelprof import ModelProfError
from modelprof.render.units import format_rate
from modelprof.report.roofline import run_peaks
from modelprof.timing.peaks import MemoryLevel, Peaks

# a probe that read far too low on a busy machine (wall/CPU 2): every layer beats its roofs
LOW = Peaks(
    peak_flops=1e6,
    peak_bytes=1e6,
    source="probe",
    device="test CPU",
    levels=(MemoryLevel("L1", 1 << 16, 1e6), MemoryLevel("DRAM", None, 1e6)),
    wall_over_cpu=2.0,
)


@pytest.fixture(scope="module")
def disturbed():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    return modelprof.profile(model, (64,), batch_size=16, roofline=LOW, repeat=3, warmup=1)


def test_the_busy_probe_note_quotes_the_roof_the_mfu_uses(disturbed):
    used = run_peaks(disturbed)
    lines = disturbed.summary().splitlines()
    note = next(line for line in lines if "ran on a busy machine" in line)
    mfu = next(line for line in lines if line.startswith("MFU"))
    roof = format_rate(used.peak_flops, "FLOP/s")
    df = disturbed.to_dataframe()
    # a row not marked rough proves the compute roof (every row's FLOP/s beats 1e6); none does
    # where all are (a loaded machine's: the layers rough as a whole, or each row scattered)
    if not ((df["latency_ms"] > 0) & ~df["latency_rough"]).any():
        assert used == LOW and "raised" not in note and f"peak {roof}" in mfu
        return
    assert "compute" in used.raised and used.peak_flops > LOW.peak_flops
    # the note said only the bare probe (1.00 MFLOP/s) beside an MFU against the raised roof
    assert f"compute {roof}" in note and "raised to what layers of this run reached" in note
    assert f"peak {roof}" in mfu


def test_the_plot_draws_the_roof_the_table_and_summary_use_and_says_why(disturbed):
    used = run_peaks(disturbed)
    fig = disturbed.plot_roofline()
    ax = fig.axes[0]
    roofs = [line for line in ax.get_lines() if line.get_label().startswith("compute roof")]
    assert roofs and max(roofs[0].get_ydata()) == pytest.approx(used.peak_flops)
    title = ax.get_title().replace("\n", " ")
    assert "The probe was disturbed (the machine was busy) and read low" in title
    assert "raised to measured" not in title
    util = disturbed.utilization("probe")
    assert util.convention.peaks.peak_flops == pytest.approx(used.peak_flops)
    # no row above the roof, unless its time is marked rough (under load: passes scattered
    # wider than their median, or every row where the layers are rough, prove nothing)
    rough = disturbed.to_dataframe()["latency_rough"].to_numpy(dtype=bool)
    mfu = util.rows["mfu"].to_numpy(dtype=float)
    assert not (mfu[~rough] > 1 + 1e-9).any()


def test_a_generation_without_a_peak_says_why_in_its_own_words():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    g = modelprof.profile_generation(
        GPT2LMHeadModel(config).eval(), prompt_len=4, new_tokens=3, budget_s=0.1,
        min_samples=3, warn=False,
    )  # fmt: skip
    # it said "no probe (roofline=False)": profile_generation takes no roofline and probes none
    with pytest.raises(
        ModelProfError, match=r"a phase of profile_generation, which does not probe.*pass peak="
    ):
        g.utilization()
    given = g.utilization(dataclasses.replace(LOW, source="user", wall_over_cpu=None))
    assert given.phases["mfu"].notna().all()


def test_an_untimed_report_with_a_peak_says_mfu_was_not_measured():
    report = modelprof.profile(nn.Linear(8, 8), (8,), timing=False)
    text = report.utilization("H100 SXM").describe()
    # it printed "MFU nan (forward; ...)"
    assert text.startswith("MFU not measured (no time: profile with timing)") and "nan" not in text
