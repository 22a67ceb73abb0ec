"""MFU, HFU and MBU (``Report.utilization``): the counted model FLOPs against the formulas people
use (nanoGPT's 6N + 12 L H Q T, MaxText's training count), recomputation in HFU only, the
conventions, the probe and the utilization agreeing on the CPU, generation phases and groups."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import modelprof
from modelprof import ModelProfError
from modelprof.report.utilization import Convention, group_mfu
from modelprof.timing.peaks import MemoryLevel, Peaks, lookup_peaks, probe_peaks

transformers = pytest.importorskip("transformers")


def _step_on_meta(model: nn.Module, batch: int, seq: int):
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return modelprof.profile(
        model, inputs={"input_ids": ids}, device="meta", backward=True, timing=False
    )


def test_gpt2_small_training_step_per_token_against_nanogpt():
    cfg = transformers.GPT2Config(
        n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024
    )
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(cfg)
    L, H, Q, T, d = 12, 12, 64, 1024, 768
    # nanoGPT's N: every parameter but the position embeddings (get_num_params(True))
    n = sum(p.numel() for p in model.parameters()) - T * d
    assert n == 123_653_376
    nanogpt = 6 * n + 12 * L * H * Q * T
    assert nanogpt == 855_166_464  # 741,920,256 + 113,246,208
    u = _step_on_meta(model, 1, T).utilization(peak="H100 SXM")
    per_token = u.phases.set_index("phase").loc["step", "model_flops"] / T
    # Term by term. nanoGPT's 6N charges every parameter 6 FLOPs per token as if it were a
    # matmul weight; the count charges 2 x MACs of the contractions that ran, forward (2) and
    # backward (4: dX and dW). Parameters that are no matmul weight are elementwise work,
    # outside the 2 x MACs convention:
    #   biases per layer 2304 + 768 + 3072 + 768 = 6,912; LayerNorm weights and biases per layer
    #   4 x 768 = 3,072; the final LayerNorm 2 x 768 = 1,536:
    #   12 x (6,912 + 3,072) + 1,536 = 121,344 parameters -> 6 x 121,344 = 728,064 per token.
    # The token embedding is counted once, as the tied lm_head matmul (768 x 50257), as nanoGPT
    # counts it once in N; the embedding lookup is a gather (no MACs). Attention: 2 x (QK^T and
    # AV: 2 x 1024 x 768 MACs per token per layer) x 12 layers x 3 (forward + backward) =
    # 12 L H Q T = 113,246,208, equal (HF's SDPA runs full T x T products, counted unmasked).
    assert per_token == nanogpt - 6 * 121_344 == 854_438_400
    # MaxText's causal convention halves the attention: 113,246,208 / 2 per token less
    half = _step_on_meta(model, 1, T).utilization(peak="H100 SXM", causal="half")
    assert (
        half.phases.set_index("phase").loc["step", "model_flops"] / T
        == 854_438_400 - 113_246_208 // 2
    )


def test_llama2_7b_training_step_against_maxtext():
    cfg = transformers.LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    report = _step_on_meta(model, 4, 256)
    B, S, E, F, Hq, Hkv, D, L, V = 4, 256, 4096, 11008, 32, 32, 128, 32, 32000
    # MaxText calculate_tflops_training_per_device, per layer and token: FFN 2 x 3 x E x F,
    # QKV 2 x E x (Hq + 2 Hkv) x D, output projection 2 x E x Hq x D; the unembedding
    # 2 x E x V; times 3 for forward + backward
    weights = (
        3 * B * S * (L * (2 * 3 * E * F + 2 * E * (Hq + 2 * Hkv) * D + 2 * E * Hq * D) + 2 * E * V)
    )
    attention = 3 * L * 4 * B * S * S * Hq * D  # QK^T and AV, not halved
    assert weights == 40_593_883_398_144 and attention == 412_316_860_416  # 40.5939 + 0.4123 T
    # the rotary angles, once per position for the whole batch (position ids [1, S]):
    # transformers 5.17 as a matmul inv_freq [1, D/2, 1] @ positions [1, 1, S] = 64 x 256 =
    # 16,384 MACs, a contraction like any other (2 x 16,384 = 32,768 model FLOPs, no backward:
    # no gradient reaches inv_freq); 5.24 as an elementwise product, 0 MACs. MaxText leaves it out.
    rope = report.to_dataframe().set_index("module").loc["model.rotary_emb", "macs"]
    assert rope in (0, D // 2 * S)
    u = report.utilization(peak="H100 SXM")
    step = u.phases.set_index("phase").loc["step"]
    assert weights + attention == 41_006_200_258_560
    assert step["model_flops"] == weights + attention + 2 * rope
    # no checkpointing; the fused attention backward recomputes the scores Q K^T: one of its
    # five contractions, 2 x B x S x S x Hq x D x L = 68,719,476,736, hardware FLOPs only
    assert (
        step["hardware_flops"] - step["model_flops"] == 2 * B * S * S * Hq * D * L == 68_719_476_736
    )
    half = report.utilization(peak="H100 SXM", causal="half")
    assert (
        half.phases.set_index("phase").loc["step", "model_flops"]
        == weights + attention // 2 + 2 * rope
    )
    # the datasheet's dense float32 figure is what the convention names
    assert half.convention.peaks.peak_flops == lookup_peaks("H100 SXM", "float32").peak_flops


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class _Net(nn.Module):
    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.blk, self.head, self.checkpointed = _Block(), nn.Linear(8, 4), checkpointed

    def forward(self, x):
        if self.checkpointed:
            return self.head(checkpoint(self.blk, x, use_reentrant=False))
        return self.head(self.blk(x))


@pytest.mark.parametrize("reentrant", [False, True])
def test_recomputation_counts_in_hfu_and_not_in_mfu(reentrant):
    torch.manual_seed(0)
    plain = _Net(False)
    ckpt = _Net(True)
    ckpt.load_state_dict(plain.state_dict())
    if reentrant:
        ckpt.forward = lambda x: ckpt.head(checkpoint(ckpt.blk, x, use_reentrant=True))
    x = torch.randn(2, 8, requires_grad=reentrant)  # the reentrant variant needs a grad input
    kw = dict(inputs=x, backward=True, timing=False)
    a = modelprof.profile(plain, **kw).utilization(peak=Peaks(1e9, 1e9))
    b = modelprof.profile(ckpt, **kw).utilization(peak=Peaks(1e9, 1e9))
    pa, pb = a.phases.set_index("phase"), b.phases.set_index("phase")
    assert pb.loc["step", "model_flops"] == pa.loc["step", "model_flops"]
    # the forward that ran again in the backward: the non-reentrant variant stops once it has
    # what the backward unpacks (blk.a's addmm and the ReLU: 8 x 16 MACs x batch 2 = 256), the
    # reentrant one reruns the whole block (blk.a and blk.b: 2 x 256 MACs); 2 x MACs each
    again = 2 * (512 if reentrant else 256)
    assert pb.loc["step", "hardware_flops"] - pb.loc["step", "model_flops"] == again
    rows = b.rows.set_index("module")
    # charged to the call whose autograd node ran it: blk's (its saved-tensor unpack), or, for
    # the reentrant variant, the root's own CheckpointFunction node, made outside blk
    where = "(self)" if reentrant else "blk"
    assert rows.loc[where, "hardware_flops"] - rows.loc[where, "model_flops"] == again
    assert rows.loc["head", "hardware_flops"] == rows.loc["head", "model_flops"]
    if reentrant:
        return
    full = modelprof.profile(ckpt, **kw).utilization(peak=Peaks(1e9, 1e9), flops="flops")
    # in full FLOPs the recomputed addmm (2 x 256 + 32 bias adds) and ReLU (32) count
    p = full.phases.set_index("phase").loc["step"]
    assert p["hardware_flops"] - p["model_flops"] == 544 + 32


def _slowed_clean_runs(lat: float) -> Any:
    """A timing check that found the clean runs (median ``lat``) slowed: the (root) row's half
    of it is the figure to quote."""
    from modelprof.timing.agreement import TimingAgreement

    half = lat / 2
    return TimingAgreement(
        clean_ms=lat,
        clean_ci_ms=(lat, lat),
        passes_ms=half,
        passes_ci_ms=(half, half),
        leaf_sum_ms=half,
        ratio=0.5,
        agree=False,
        quote_ms=half,
        quote="per-layer",
        verdict="disagree",
    )


def test_rows_add_up_and_times_make_the_ratio():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    peaks = Peaks(peak_flops=2e9, peak_bytes=1e9)
    report = modelprof.profile(
        model, (64,), batch_size=16, roofline=peaks, repeat=5, warmup=1, budget_s=1
    )
    u = report.utilization()  # the report's own (given) peaks
    rows, whole = u.rows, u.phases.set_index("phase").loc["forward"]
    leaves = rows[[r.leaf for r in report.rows]]
    # 2 x MACs: 16 x (64 x 128 + 128 x 32) = 196,608 MACs
    assert whole["model_flops"] == leaves["model_flops"].sum() == 2 * 196_608
    assert rows.loc[0, "model_flops"] == 2 * 196_608  # the root sums its subtree
    lat = report.latency.median_ms
    assert whole["mfu"] == pytest.approx(2 * 196_608 / (lat * 1e-3 * 2e9))
    traffic = report.totals["read_bytes"] + report.totals["write_bytes"]
    assert whole["mbu"] == pytest.approx(traffic / (lat * 1e-3 * 1e9))
    r1 = report.rows[1]
    assert rows.loc[1, "mfu"] == pytest.approx(2 * 16 * 64 * 128 / (r1.latency_ms * 1e-3 * 2e9))
    full = report.utilization(flops="flops").phases.set_index("phase").loc["forward"]
    assert full["model_flops"] == report.totals["flops"]
    assert "MFU" in report.summary() and "2 x MACs of contractions" in report.summary()
    assert "given" in u.convention.describe()
    # where the check says the clean runs were slowed and the (root) row's time is the one to
    # quote, the summary gives the MFU over it too: work / time, so at half the time, twice
    report.timing_agreement = _slowed_clean_runs(lat)
    line = next(x for x in report.summary().splitlines() if x.startswith("MFU"))
    assert line.endswith(
        f"over the (root) row's {lat / 2:.3f} ms, the figure to quote (the clean median "
        f"{lat:.3f} ms was slowed): the forward's MFU {2 * whole['mfu']:.3g}"
    )
    # a quoted time of 0 (nothing to divide by) says nothing more
    report.timing_agreement = dataclasses.replace(report.timing_agreement, quote_ms=0.0)
    assert "the figure to quote" not in report.summary()


def test_cpu_matmul_mfu_against_the_probe_in_the_same_process():
    # CPU time on one thread: what load on a shared machine stretches least. The probe's best
    # run of the same product is the peak; the model's median is taken over a window as long
    # (blocks 0.1 s apart until the budget or the spread stop). Three rounds alternate a probe
    # window and a profile window: one CI run with a single window each read the model's best
    # at 0.77 of the probe's, the machine slower in the model's window than in the probe's
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = nn.Linear(512, 512, bias=False)
    rounds = []
    try:
        for _ in range(3):
            peaks = probe_peaks("cpu", matmul_size=512, budget_s=0.4)
            report = modelprof.profile(
                model,
                (512,),
                batch_size=512,
                roofline=peaks,
                clock="cpu",
                precision=1e-6,
                warmup=2,
                budget_s=0.4,
            )
            rounds.append((peaks, report))
    finally:
        torch.set_num_threads(threads)
    u = report.utilization(peak="probe")
    assert u.phases.loc[0, "model_flops"] == 2 * 512**3  # the probe's own product
    # the probe is a lower bound: where a timed row ran the product faster than the probe's
    # best, the roof is raised to that row's rate (Peaks.raised names it), else it is the probe's
    # as measured (a CI run's Linear row beat the probe by 6.8 %: the MFU against the unraised
    # probe read 0.702, the report's 0.657)
    roof = u.convention.peaks
    rates = [2 * 512**3 / (r.latency_ms / 1e3) for r in report.rows]  # every row runs it
    if "compute" in roof.raised:
        assert roof.peak_flops == pytest.approx(max(rates)) and max(rates) > peaks.peak_flops
    else:
        assert roof.peak_flops == peaks.peak_flops and max(rates) <= peaks.peak_flops
    # MFU is the model's FLOPs over its median time x the peak, exactly
    lat = report.latency
    assert u.mfu == pytest.approx(2 * 512**3 / (lat.median_ms / 1e3) / roof.peak_flops)
    # like with like: in one of the three rounds at least, the model's fastest run reaches 80 %
    # of the probe's fastest (the peak) of the same round. Not against the best probe of all
    # rounds: this VM's speed moves by itself, the three probes of one idle run read 84.5, 70.9
    # and 64.1 GFLOP/s, so the fastest probe can fall in a window no model run shares (0.75
    # in that run). Medians need not reach it either (a CI run's median read MFU 0.637)
    per_round = [
        2 * 512**3 / (float(r.latency.samples_ms.min()) / 1e3) / p.peak_flops for p, r in rounds
    ]
    assert max(per_round) >= 0.8, (per_round, u.describe())
    assert u.by_peak["probe"] == u.mfu
    # a datasheet peak named: both recorded, and both in the line
    sheet = report.utilization("H100 SXM")
    assert sheet.by_peak == {"probe": u.mfu, "datasheet": sheet.mfu}
    # 67 TFLOP/s dense float32 against the probe's: the ratio of the two MFUs is theirs
    assert sheet.mfu / u.mfu == pytest.approx(roof.peak_flops / 67e12)
    assert "datasheet, dense, H100 SXM" in sheet.describe()
    probe_part = sheet.describe().split("against the probe peak ", 1)[1]
    assert probe_part.startswith(f"{u.mfu:.3f}" if u.mfu <= 1 else f"above 1 ({u.mfu:.3f}:")


@pytest.fixture
def quotable_phases(monkeypatch):
    """The phases' own times taken as quotable, whatever the machine's load or the runs' count
    (a repeat=3 forward has no interval: its time, and a ratio over it, would be marked ~ too):
    for the tests of what the peak alone marks."""
    monkeypatch.setattr("modelprof.report.utilization.unquotable", lambda m: [])


def test_a_ratio_above_one_is_never_printed_as_a_utilization(quotable_phases):
    # a given peak far below the device: 1 kFLOP/s and 1 kB/s, which any forward outruns
    # (2 x 16 x 64 x 128 = 262,144 FLOPs would need 262 s to sit at that roof)
    low = Peaks(peak_flops=1e3, peak_bytes=1e3, source="user", device="cpu")
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
    report = modelprof.profile(
        model, (64,), batch_size=16, roofline=low, repeat=3, warmup=1, budget_s=1
    )
    u = report.utilization()
    assert u.mfu > 1  # the number itself stays in the frames, numeric
    line = u.describe()
    assert f"MFU above 1 ({u.mfu:.3f}: more than the given peak allows" in line
    assert f"MFU {u.mfu:.3f} " not in line  # never the plain figure
    assert "more than the given peak allows" in report.summary()
    # a datasheet peak recorded beside it: the figure against it is plain
    sheet = report.utilization("H100 SXM")
    assert sheet.mfu < 1  # 262,144 FLOPs in under a second, against 67 TFLOP/s
    assert f"MFU {sheet.mfu:.3f} (" in sheet.describe()
    # the table marks each ratio above 1 as rough, and leaves one below 1 plain
    text = report.to_text(columns=["module", "mfu", "mbu"], units="human")
    linear = next(row for row in text.splitlines() if row.lstrip().startswith("0"))
    assert linear.count("~") == 2, text  # its MFU and MBU, both above 1
    high = Peaks(peak_flops=1e30, peak_bytes=1e30, source="probe")
    plain = modelprof.profile(
        model, (64,), batch_size=16, roofline=high, repeat=3, warmup=1, budget_s=1
    )
    # no ratio above 1 marks nothing; only rough per-layer times would (a disagreement of the
    # two timing windows, which a loaded machine can cause, marks every timed cell). The rows
    # only: a loaded machine's caption may say "the end-to-end latency marked ~ is no figure"
    plain_text = plain.to_text(columns=["module", "mfu", "mbu"], units="human")
    lines = plain_text.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) == {"-", " "})
    cells = "\n".join(lines[rule + 1 :])  # below the header's rule
    assert ("~" in cells) == plain.layers_rough, plain_text
    assert "above 1" not in plain.summary()
    # a given roof is never raised to what ran: its efficiency above 1 is marked
    over = modelprof.profile(
        model, (64,), batch_size=16, roofline=low, repeat=3, warmup=1, budget_s=1
    )
    assert over.to_dataframe().loc[1, "efficiency"] > 1
    text = over.to_text(columns=["module", "efficiency"], units="human")
    assert next(r for r in text.splitlines() if r.lstrip().startswith("0")).count("~") == 1
    # the same figures from a probe: the probe was disturbed, and the run's one peak is
    # what its fastest layer proved, so no row's MFU is above 1 and the line says why
    probed = modelprof.profile(
        model,
        (64,),
        batch_size=16,
        roofline=dataclasses.replace(low, source="probe"),
        repeat=3,
        warmup=1,
        budget_s=1,
    )
    judged = probed.utilization("probe")
    # (a row marked rough may read above: under load, passes scattered wider than their
    # median, or every row where the layers are rough as a whole, prove nothing)
    rough = probed.to_dataframe()["latency_rough"].to_numpy(dtype=bool)
    assert not (judged.rows["mfu"].to_numpy(dtype=float)[~rough] > 1 + 1e-9).any()
    # a row not marked rough proves the compute roof (every row's FLOP/s beats 1e3); none
    # does where all are rough (the layers rough as a whole, or each scattered or cut short)
    proving = (probed.to_dataframe()["latency_ms"] > 0) & ~rough
    raised = "raised to what a layer of this run reached"
    assert (raised in judged.describe()) is bool(proving.any())


def test_a_utilization_prints_as_its_sentence_and_phases():
    report = modelprof.profile(nn.Linear(4, 4), (4,), repeat=20, warmup=2)
    u = report.utilization(Peaks(1e9, 1e9))
    text = repr(u)
    assert str(u) == text  # print() and a notebook's echo alike: no dataclass fields
    assert text.startswith(u.describe() + "\n\n")
    assert "Convention(" not in text and "MFU" in text.splitlines()[2]  # the phases' header
    assert text.endswith(repr(u.phases))


def test_bad_conventions_and_peaks_are_named():
    report = modelprof.profile(nn.Linear(4, 4), (4,), timing=False)
    with pytest.raises(ModelProfError, match="flops='3macs'"):
        report.utilization(Peaks(1e9, 1e9), flops="3macs")
    with pytest.raises(ModelProfError, match="causal='quarter'"):
        report.utilization(Peaks(1e9, 1e9), causal="quarter")
    with pytest.raises(ModelProfError, match="peak='probe'"):
        report.utilization("probe")
    with pytest.raises(ModelProfError, match="peak='Z9000'.*known: .*'H100 SXM'"):
        report.utilization("Z9000")
    with pytest.raises(ModelProfError, match="peak_flops must be a positive number, got 0"):
        Peaks(peak_flops=0, peak_bytes=1e9)
    # a bool is an int to Python, but True is no bandwidth (it read as 1 byte/s before)
    with pytest.raises(ModelProfError, match="peak_bytes must be a positive number, got True"):
        Peaks(peak_flops=1e9, peak_bytes=True)
    with pytest.raises(ModelProfError, match="bandwidth.*True"):
        MemoryLevel("DRAM", None, True)
    with pytest.raises(ModelProfError, match="peaks=3"):
        Convention(peaks=3)
    untimed = report.utilization(Peaks(1e9, 1e9))
    assert math.isnan(untimed.mfu)  # no time, no utilization; the FLOPs are still there
    assert untimed.phases.loc[0, "model_flops"] == 2 * 16


def test_group_mfu_is_every_ranks_flops_over_the_slowest_time():
    # 3 ranks, 1e9, 2e9, 3e9 FLOPs; the slowest took 2 ms; peak 1e12 per device:
    # 6e9 / (2e-3 x 3 x 1e12) = 1.0
    assert group_mfu([1e9, 2e9, 3e9], [1.0, 2.0, 1.5], 1e12) == pytest.approx(1.0)
    with pytest.raises(ModelProfError, match="one time per rank"):
        group_mfu([1e9], [1.0, 2.0], 1e12)
    with pytest.raises(ModelProfError, match="peak_flops=0"):
        group_mfu([1e9], [1.0], 0)


@pytest.mark.parametrize("where", [0, 1, 2])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_group_mfu_refuses_a_rank_time_that_is_not_a_time_wherever_it_stands(where, bad):
    # max() stops at a NaN in front and skips one behind: rank 1's NaN gave a number
    times = [1.0, 2.0, 1.5]
    times[where] = bad
    with pytest.raises(ModelProfError, match=rf"times_ms\[{where}\]="):
        group_mfu([1e9, 2e9, 3e9], times, 1e12)
    flops = [1e9, 2e9, 3e9]
    flops[where] = float("nan")
    with pytest.raises(ModelProfError, match=rf"model_flops\[{where}\]=nan"):
        group_mfu(flops, [1.0, 2.0, 1.5], 1e12)
    with pytest.raises(ModelProfError, match="peak_flops=inf"):
        group_mfu([1e9], [1.0], float("inf"))


def test_group_utilization_on_a_one_rank_group(tmp_path):
    import torch.distributed as dist

    from modelprof.report.utilization import group_utilization

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        report = modelprof.profile(
            nn.Linear(64, 64),
            (64,),
            batch_size=8,
            repeat=3,
            warmup=1,
            budget_s=1,
            roofline=Peaks(1e9, 1e9),
        )
        u = report.utilization()
        frame = group_utilization(u).set_index("rank")
    finally:
        dist.destroy_process_group()
    # one rank: the group's MFU is the rank's
    assert frame.loc[0, "model_flops"] == frame.loc[-1, "model_flops"] == 2 * 8 * 64 * 64
    assert frame.loc[-1, "mfu"] == pytest.approx(u.mfu)


class _ToyLM(nn.Module):
    """Embedding, one projection of the cache's mean, and the unembedding: a decode step's
    cost grows with the cache it reads."""

    def __init__(self, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.emb, self.proj, self.out = (
            nn.Embedding(vocab, d),
            nn.Linear(d, d),
            nn.Linear(d, vocab, bias=False),
        )

    def forward(self, tokens, cache):
        h = self.emb(tokens)
        cache = h if cache is None else torch.cat([cache, h], dim=1)
        return self.out(self.proj(h + cache.mean(dim=1, keepdim=True))), cache


def test_generation_phases_mfu_and_decode_mbu():
    lm = _ToyLM()
    report = modelprof.profile_generation(
        lm, step=lambda t, c: lm(t, c), prompt_len=8, new_tokens=3, repeat=3, warmup=1, budget_s=1
    )
    u = report.utilization(Peaks(1e9, 1e9))
    phases = u.phases
    assert list(phases["phase"]) == [p.name for p in report.phases()]
    for p, (_, row) in zip(report.phases(), phases.iterrows()):
        # per token 2 x (16 x 16 + 16 x 32) MACs = 1,536 FLOPs
        assert row["model_flops"] == 1536 * p.tokens * p.batch_size
        t = p.report.latency.median_ms
        assert row["mbu"] == pytest.approx(
            (p.totals["read_bytes"] + p.totals["write_bytes"]) / (t * 1e-3 * 1e9)
        )
    assert {"phase", "context", "mfu", "mbu"} <= set(u.rows.columns)
    # inside the timed generations: TTFT for the prefill, a decode step's median at its context
    timing = report.timing
    assert phases.loc[0, "generation_ms"] == timing.ttft.median_ms
    for i, p in enumerate(report.phases()[1:], start=1):
        at = timing.contexts == p.context
        assert at.any()
        assert phases.loc[i, "generation_ms"] == np.median(timing.step_ms[:, at])
        traffic = p.totals["read_bytes"] + p.totals["write_bytes"]
        assert phases.loc[i, "mbu_generation"] == pytest.approx(
            traffic / (phases.loc[i, "generation_ms"] * 1e-3 * 1e9)
        )


def test_the_table_carries_mfu_and_mbu_beside_latency():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
    peaks = Peaks(peak_flops=2e9, peak_bytes=1e9)
    report = modelprof.profile(
        model, (64,), batch_size=16, roofline=peaks, repeat=3, warmup=1, budget_s=1
    )
    df = report.to_dataframe()
    u = report.utilization()
    assert list(df["mfu"].fillna(-1)) == list(u.rows["mfu"].fillna(-1))
    assert list(df["mbu"].fillna(-1)) == list(u.rows["mbu"].fillna(-1))
    # Linear: 2 x 16 x 64 x 128 FLOPs over its latency and the 2e9 peak
    assert df.loc[1, "mfu"] == pytest.approx(
        2 * 16 * 64 * 128 / (df.loc[1, "latency_ms"] * 1e-3 * 2e9)
    )
    assert "hfu" not in df.columns
    assert "MFU" in report.to_text(columns=["module", "latency_ms", "mfu", "mbu"])


def test_every_mfu_and_mbu_against_a_busy_probe_is_marked_as_its_efficiency_is(quotable_phases):
    # a tester's loaded probe: efficiency ~67.12 % marked, MFU 67.05 % beside it not, though
    # both divide by the same compute peak that a busy machine read low
    from modelprof.render.views import is_rough_cell

    busy = Peaks(
        peak_flops=2.75e9, peak_bytes=1.61e9, source="probe", device="cpu", wall_over_cpu=3.0
    )
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    report = modelprof.profile(
        model, (64,), roofline=busy, repeat=3, warmup=1, budget_s=0.2, warn=False
    )
    assert report.peaks.loaded
    df = report.to_dataframe()
    timed = df["mfu"].notna().to_numpy()
    assert timed.any() and df.loc[timed, "mfu_rough"].all() and df.loc[timed, "mbu_rough"].all()
    # marked by the probe alone (the per-layer times' own roughness aside)
    rows = df.assign(latency_rough=False)
    for i in np.flatnonzero(timed):
        assert all(is_rough_cell(rows, i, name) for name in ("efficiency", "mfu", "mbu"))
    assert "every efficiency, MFU and MBU judged against them is marked" in report.summary()
    u = report.utilization(peak="probe")
    assert u.phases["mfu_rough"].all() and u.rows.loc[timed, "mbu_rough"].all()
    forward = repr(u.phases).splitlines()[-1]  # the flags are the cells' marks, not columns
    assert forward.count("~") == 3 and "rough" not in repr(u.phases)
    assert "run on a busy machine: its roofs read low, every ratio against them marked ~" in (
        u.describe()
    )
    # the same peaks from a quiet probe, or a datasheet's: no flag
    quiet = dataclasses.replace(busy, wall_over_cpu=1.02)
    q = modelprof.profile(
        model, (64,), roofline=quiet, repeat=3, warmup=1, budget_s=0.2, warn=False
    )
    assert not {"mfu_rough", "mbu_rough"} & set(q.to_dataframe().columns)
    assert "mfu_rough" not in q.utilization(peak="probe").phases.columns


def test_hf_generation_prefill_halved_decode_never():
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=128,
        n_positions=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    report = modelprof.profile_generation(model, prompt_len=8, new_tokens=4, timing=False)
    counted = report.utilization(Peaks(1e9, 1e9)).phases
    half = report.utilization(Peaks(1e9, 1e9), causal="half").phases
    # per token and layer the linears are 64 x (192 + 64 + 256 + 256) = 49,152 MACs; the
    # attention 4 heads x (L_q x L_k) x (16 + 16); the lm_head of the last token 64 x 128
    prefill = 8 * 2 * 49_152 + 2 * 4 * 8 * 8 * 32 + 64 * 128  # 811,008 MACs
    assert counted.loc[0, "model_flops"] == 2 * prefill
    # the prefill's causal attention halved: 2 x 16,384 MACs / 2
    assert half.loc[0, "model_flops"] == 2 * prefill - 16_384
    for i, L in enumerate(counted["context"][1:], start=1):
        decode = 2 * 49_152 + 2 * 4 * (L + 1) * 32 + 64 * 128  # one query, L + 1 keys
        assert counted.loc[i, "model_flops"] == half.loc[i, "model_flops"] == 2 * decode


def test_training_phases_split_forward_loss_and_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    x, target = torch.randn(2, 8), torch.randn(2, 4)
    report = modelprof.profile(
        model, inputs=x, backward=True, timing=False, loss_fn=nn.MSELoss(), target=target
    )
    p = report.utilization(Peaks(1e9, 1e9), flops="flops").phases.set_index("phase")
    loss = next(r for r in report.rows if r.kind == "loss")
    # forward: the Linear's addmm 2 x 8 x 4 MACs x 2 + 8 bias adds = 136 FLOPs
    assert p.loc["forward", "model_flops"] == report.totals["flops"] - loss.flops == 136
    assert p.loc["backward", "model_flops"] == report.totals["backward_flops"]
    assert p.loc["step", "model_flops"] == report.totals["flops"] + report.totals["backward_flops"]


MIG = "NVIDIA A100-SXM4-40GB MIG 1g.5gb"  # how torch names a MIG slice's device


def test_a_mig_slice_is_never_judged_against_the_whole_gpu():
    from modelprof.generation.bound import resolve_target
    from modelprof.report.utilization import resolve_peaks

    report = modelprof.profile(nn.Linear(4, 4), (4,), timing=False)
    report.env["device_name"] = MIG
    # the whole A100's 312 TFLOP/s would read a 1g slice's MFU ~7x low: no datasheet peak
    with pytest.raises(ModelProfError, match="is a MIG slice, which the whole GPU's datasheet"):
        resolve_peaks(None, report)
    assert "datasheet" not in resolve_peaks(Peaks(1e9, 1e9), report)[1]
    for peak in ("datasheet", MIG):
        with pytest.raises(ModelProfError, match=r"MIG slice \(1g\.5gb\), not the whole GPU"):
            report.utilization(peak)
    with pytest.raises(ModelProfError, match=r"target=.*MIG slice \(3g\.40gb\)"):
        resolve_target("NVIDIA H100 80GB HBM3 MIG 3g.40gb", torch.bfloat16)
    # the whole GPU by name is still the datasheet's
    assert resolve_peaks("A100 SXM 40GB", report)[0].peak_flops > 0


def test_fit_refuses_a_mig_slice_without_its_memory():
    from modelprof.fit import fit

    model = nn.Linear(4, 4)
    with pytest.raises(ModelProfError, match=r"device=.*MIG slice \(1g\.5gb\).*memory_bytes="):
        fit(model, device=MIG, training=False)  # 40 GiB where the slice has 4.75
    sliced = fit(model, device=MIG, memory_bytes=4.75 * 2**30, training=False)
    assert sliced.table.loc["memory", "inference"] == 4.75 * 2**30


def test_no_peak_on_the_cpu_is_a_sentence_not_a_frame_of_nan():
    # a CPU has no datasheet peak; without a probe there is nothing to judge against
    untimed = modelprof.profile(nn.Linear(4, 4), (4,), timing=False)
    with pytest.raises(
        ModelProfError,
        match=r"no peak to judge against: .+ is not in the datasheet table .+ was not timed "
        r"\(timing=False\).+pass peak=Peaks",
    ):
        untimed.utilization()
    unprobed = modelprof.profile(
        nn.Linear(4, 4), (4,), roofline=False, repeat=3, warmup=1, budget_s=0.2
    )
    with pytest.raises(
        ModelProfError, match=r"has no probed peak \(profile\(\.\.\., roofline=False\)"
    ):
        unprobed.utilization()
    assert "MFU" not in unprobed.summary()  # the summary leaves the line out, as before


def test_utilization_tables_print_flops_and_bytes_with_units():
    # Linear(64, 128) at batch 16: model FLOPs 2 x 16 x 64 x 128 = 262,144 -> "262.14 K";
    # bytes read: input 16 x 64 x 4 = 4,096, weight 128 x 64 x 4 = 32,768, bias 512; written:
    # 16 x 128 x 4 = 8,192; 45,568 B = 44.50 KiB. Never "262144.00"
    report = modelprof.profile(nn.Linear(64, 128), (64,), batch_size=16, timing=False)
    u = report.utilization(Peaks(1e9, 1e9))
    assert u.phases.loc[0, "model_flops"] == 262_144 and u.phases.loc[0, "bytes"] == 45_568
    for frame in (u.rows, u.phases):
        text = repr(frame)
        assert "model FLOPs" in text and "262.14 K" in text and "44.50 KiB" in text, text
        assert "262144" not in text and "45568" not in text
    # however the frames were put together (generation concatenates its phases' frames)
    joined = modelprof.report.utilization.Utilization(
        u.convention, u.rows.iloc[:1].copy(), u.phases.assign(mfu_generation=0.25), {}
    )
    assert "262.14 K" in repr(joined.rows) and "25.00%" in repr(joined.phases)


def test_a_training_steps_quoted_mfu_is_the_forwards():
    # the timing check compares the forward's windows, so the MFU over the quoted (root) time
    # is the forward's, not the whole step's (the last phase): its model FLOPs over the quoted
    # half of the clean median at the 2e9 FLOP/s peak (whatever time the phase itself took: a
    # step's forward phase is timed over the step's own forward, review)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    report = modelprof.profile(
        model, (64,), batch_size=16, backward=True, roofline=Peaks(2e9, 1e9), repeat=5, warmup=1
    )
    phases = report.utilization().phases.set_index("phase")
    assert phases.index[-1] != "forward"  # the step comes last
    report.timing_agreement = _slowed_clean_runs(report.latency.median_ms)
    line = next(x for x in report.summary().splitlines() if x.startswith("MFU"))
    quoted_s = report.latency.median_ms / 2 / 1e3
    mfu = phases.loc["forward", "model_flops"] / (quoted_s * 2e9)
    assert line.endswith(f"the forward's MFU {mfu:.3g}")


def test_a_training_steps_forward_phase_is_timed_over_the_steps_own_forward() -> None:
    # a newcomer's AdamW step read forward MFU over the clean eval-mode runs (24 us) where the
    # step's forward, autograd recording, took 63 us: 2.6 x the utilization it had
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    report = modelprof.profile(model, (64,), backward=True, repeat=5, warmup=1, roofline=False)
    phases = report.utilization(peak=Peaks(1e9, 1e9)).phases.set_index("phase")
    timing = report.training_step.timing
    assert phases.loc["forward", "time_ms"] == timing.forward.median_ms
    assert phases.loc["backward", "time_ms"] == timing.backward.median_ms
    # a forward alone keeps its clean runs
    plain = modelprof.profile(model, (64,), repeat=5, warmup=1, roofline=False)
    forward = plain.utilization(peak=Peaks(1e9, 1e9)).phases.set_index("phase").loc["forward"]
    assert forward["time_ms"] == plain.latency.median_ms


def test_the_summary_marks_an_mfu_its_frames_mark_rough(quotable_phases):
    from modelprof.timing.peaks import MemoryLevel

    # a probe run on a busy machine (wall/CPU 2): every ratio against it is rough, "~" in the
    # frames, and the summary's MFU line printed it plain
    busy = Peaks(
        peak_flops=1e12,
        peak_bytes=1e11,
        source="probe",
        device="test CPU",
        levels=(MemoryLevel("L1", 1 << 16, 1e11), MemoryLevel("DRAM", None, 1e11)),
        wall_over_cpu=2.0,
    )
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    with pytest.warns(Warning):  # (the busy probe, and whatever the load says)
        report = modelprof.profile(
            model, (64,), batch_size=16, roofline=busy, repeat=3, warmup=1, budget_s=1
        )
    u = report.utilization()
    assert bool(u.phases["mfu_rough"].iloc[-1]) and u.mfu <= 1  # 524,288 FLOPs over 1 TFLOP/s
    line = next(x for x in report.summary().splitlines() if x.startswith("MFU"))
    assert line.startswith(f"MFU ~{u.mfu:.3f} (forward;"), line
    # against a datasheet peak nothing is rough (the phase's time taken as quotable, whatever
    # the load: the fixture): plain
    sheet = report.utilization("H100 SXM")
    assert sheet.describe().startswith(f"MFU {sheet.mfu:.3f} (")
