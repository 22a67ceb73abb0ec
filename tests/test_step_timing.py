"""The training step timed on CPU: a backward that spins a known time reads it back in its own
row, one synchronize per instrumented pass, the CUDA peak-memory path with fake allocator
statistics, and a model whose control flow changes."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.errors import ModelProfError
from modelprof.runtime.inputs import make_inputs
from modelprof.step import timing as step_timer
from modelprof.step.count import count_step
from modelprof.step.spec import StepSpec
from modelprof.timing import MemoryStats, runner
from modelprof.timing.clock import CpuClock, StampBuffer

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")

SPIN_MS = 4.0


def spin(ms: float) -> None:
    """Busy-wait ``ms`` milliseconds without any tensor op."""
    end = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < end:
        pass


class SpinBackward(torch.autograd.Function):
    """Identity forward; the backward spins 4 ms, timing itself with a plain host clock (no
    tensor op anywhere in it), then passes the gradient on untouched."""

    durations_ms: list[float] = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        t = time.perf_counter_ns()
        spin(SPIN_MS)
        SpinBackward.durations_ms.append((time.perf_counter_ns() - t) / 1e6)
        return grad


class SpinLayer(nn.Module):
    def forward(self, x):
        return SpinBackward.apply(x)


def spin_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), SpinLayer(), nn.Linear(4, 4))


def test_spinning_backward_reads_back_in_its_layer():
    SpinBackward.durations_ms.clear()
    report = profile(spin_model(), (4,), backward=True, repeat=25, warmup=3, roofline=False)
    timing = report.training_step.timing
    # Each spin timed itself: on a loaded machine a preempted spin ends late, so the spin lasts
    # what it lasts, pass by pass; the reference is that pass's own plain clock, not a fixed
    # 4 ms nor a loop run at another moment. The backward ran once counted, 3 + 25 clean steps
    # (warm-up, samples), 3 instrumented warm-up passes, then 25 instrumented passes each
    # beside a plain one: pair j's plain pass second for an even j, first for an odd one.
    own = np.asarray(SpinBackward.durations_ms)
    assert own.size == 1 + 3 + 25 + 3 + 2 * 25
    assert own.min() >= SPIN_MS
    instrumented = own[-50:][[2 * j + j % 2 for j in range(25)]]
    record = next(r.record for r in report.rows if r.module == "1")
    # the stretches between stamps as read, per pass: (column, ms) each
    raw = np.vstack([np.bincount(c, weights=ms, minlength=record + 1) for c, ms in timing.segments])
    excess = raw[:, record] - instrumented
    # every pass: the layer's stretches hold its whole spin, plus only its node's own dispatch
    # and stamp
    assert excess.min() >= 0.0
    assert float(np.median(excess)) < 0.1 * SPIN_MS
    # its row: those stretches less the stamps' measured cost, one per stretch
    cost = timing.stamp_cost  # (25 pairs: measured; applied where it lies above the noise)
    stretches = np.bincount(timing.segments[0][0], minlength=record + 1)[record]
    row_passes = timing.calls_ms[:, record]
    taken = stretches * cost.per_call_ms if cost.applied else 0.0
    np.testing.assert_allclose(row_passes, np.clip(raw[:, record] - taken, 0.0, None))
    assert cost is not None and cost.per_call_ms < 0.1 * SPIN_MS  # (a stamp: microseconds)
    df = report.to_dataframe().set_index(["module", "call"])
    row = df.loc[("1", 1)]
    assert row["backward_latency_ms"] == float(np.median(row_passes))  # the column's median
    # The column is checked through its passes (the excess above), not against the spins' own
    # median: two medians may fall on different passes, and under load one preempted spin moves
    # one median and not the other (a loaded run read 4.29 against 4.02 ms)
    # the spin is charged to its layer and nowhere else: every other leaf's median is far below
    others = df[df["leaf"]].drop(index=("1", 1))["backward_latency_ms"]
    assert (others < 0.5 * SPIN_MS).all()
    # each clean backward contains that step's spin; the layer's forward (a clone) does not
    assert (report.backward_latency.samples_ms >= own[4:29]).all()
    assert row["latency_ms"] < 0.5 * SPIN_MS
    # every instrumented pass is partitioned among its stretches, nothing lost
    np.testing.assert_allclose([ms.sum() for _, ms in timing.segments], timing.passes_ms)
    assert report.backward_latency.n == 25 and timing.passes_ms.size == 25  # repeat=25 each


class _CountingStamps(StampBuffer):
    """Host stamps that count how often they are synchronised."""

    syncs = 0

    def __init__(self, inner: StampBuffer) -> None:
        self.inner = inner
        self.record = inner.record

    def sync(self) -> None:
        type(self).syncs += 1
        self.inner.sync()

    def elapsed_ms(self, starts, ends):
        return self.inner.elapsed_ms(starts, ends)


class _CountingClock(CpuClock):
    def stamps(self, size: int) -> StampBuffer:
        return _CountingStamps(super().stamps(size))


def _setup(model: nn.Module, **spec):
    mi = make_inputs(model, (4,), batch_size=2)
    step_spec = StepSpec.parse(**spec)
    static, _ = count_step(model, mi, step_spec)
    return mi, step_spec, len(static.records)


def test_one_synchronize_per_instrumented_pass(monkeypatch):
    model = spin_model()
    mi, spec, n_calls = _setup(model)
    # the Runner makes every timed pass's clock
    monkeypatch.setattr(runner, "clock_for", lambda device, mode="auto": _CountingClock(device))
    _CountingStamps.syncs = 0
    timing = step_timer.time_step(model, mi, spec, n_calls, repeat=5, warmup=2)
    # 2 instrumented warm-up passes + 5 timed ones, and the plain backward beside each timed
    # one: one synchronize each and no other
    assert _CountingStamps.syncs == 2 + 5 + 5
    assert timing.calls_ms.shape == (5, n_calls + 1)  # + the loss's column


def test_step_peak_memory_with_fake_allocator_statistics():
    model = spin_model()
    mi, spec, n_calls = _setup(model, optimizer=torch.optim.SGD)
    calls = {"reset": 0, "read": 0}

    def reset() -> None:
        calls["reset"] += 1

    def read() -> int:
        calls["read"] += 1
        return 123_456

    timing = step_timer.time_step(
        model, mi, spec, n_calls, repeat=3, warmup=1, memory_stats=MemoryStats(read, reset)
    )
    # one dedicated step: the peak reset once before it, read once after it
    assert calls == {"reset": 1, "read": 1}
    # less what only modelprof holds: its copy of the model (parameters and buffers) and, with
    # an optimizer, the snapshot of the parameters each block starts from
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert params > 0
    assert timing.peak_memory_bytes == 123_456 - (params + buffers) - params
    assert timing.optimizer is not None and timing.optimizer.n == 3
    # a fake reading nothing: never a negative peak
    nothing = MemoryStats(lambda: 0, lambda: None)
    assert (
        step_timer.time_step(
            model, mi, spec, n_calls, repeat=2, warmup=1, memory_stats=nothing
        ).peak_memory_bytes
        == 0
    )
    # on the CPU, without statistics given, there is no peak
    assert (
        step_timer.time_step(model, mi, spec, n_calls, repeat=2, warmup=1).peak_memory_bytes is None
    )


class Flaky(nn.Module):
    """Calls its extra layer on every other forward: the control flow changes between passes."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.extra = nn.Linear(4, 4), nn.Linear(4, 4)
        self.n = 0

    def forward(self, x):
        self.n += 1
        x = self.a(x)
        return self.extra(x) if self.n % 2 else x


def test_control_flow_that_changes_is_refused():
    model = Flaky()
    mi, spec, n_calls = _setup(model)
    with pytest.raises(ModelProfError, match="control flow changes"):
        step_timer.time_step(model, mi, spec, n_calls, repeat=3, warmup=1)


def test_optimizer_timed_as_its_own_row():
    model = spin_model()
    report = profile(
        model, (4,), backward=True, optimizer=torch.optim.Adam, repeat=5, warmup=1, roofline=False
    )
    df = report.to_dataframe().set_index("module")
    timing = report.training_step.timing
    assert df.loc["(optimizer)", "latency_ms"] == timing.optimizer.median_ms
    # the step is the sum of its phases, sample by sample
    parts = [timing.forward, timing.loss, timing.backward, timing.optimizer]
    np.testing.assert_allclose(timing.step.samples_ms, sum(m.samples_ms for m in parts))
    # and so is its CPU time (read phase by phase beside the wall clock, on the CPU)
    np.testing.assert_allclose(timing.step.cpu_ms, sum(m.cpu_ms for m in parts))
    assert timing.backward.cpu_clock == timing.step.cpu_clock is not None
    # every row but the optimizer's ran a backward and has its time and share; the optimizer
    # has none: missing (NaN, printed -), as its latency share, never rough (was 0 ms, 0 %)
    others = df.drop(index="(optimizer)")
    assert others["backward_latency_pct"].notna().all()
    assert others["backward_latency_ms"].notna().all()
    optimizer = df.loc["(optimizer)"]
    assert np.isnan(optimizer["backward_latency_ms"]) and np.isnan(optimizer["latency_pct"])
    assert np.isnan(optimizer["backward_latency_pct"])
    assert not optimizer["backward_latency_rough"]
    # the grouped sums skip it: its group's backward latency is missing, the others' sum is
    # the leaves' (sum(min_count=1)), and the utilization's step time stays a number
    grouped = report.by_layer_type()
    assert np.isnan(grouped.loc["optimizer", "backward_latency_ms"])
    leaves = df[df["leaf"]].drop(index="(optimizer)")
    assert grouped["backward_latency_ms"].sum() == pytest.approx(
        leaves["backward_latency_ms"].sum()
    )
    assert np.isfinite(report.utilization(peak="H100 SXM").rows["time_ms"]).all()


def test_amp_step_is_timed_under_autocast():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    report = profile(
        model, (4,), backward=True, amp=torch.bfloat16, repeat=3, warmup=1, roofline=False
    )
    timing = report.training_step.timing
    assert timing.env["mode"]["amp"] == "torch.bfloat16"
    assert timing.backward.n == 3 and timing.calls_ms.shape[0] == 3
    assert next(model.parameters()).dtype == torch.float32  # the model was not converted


def test_a_short_budget_still_gives_every_phase_min_samples_steps():
    # a step whose backward spins 4 ms against a 5 ms budget: the budget allows one or two
    # clean steps; the sample floor takes the rest one per block, so forward, loss, backward
    # and the step each come from min_samples=10 (the per-layer passes have layer_extend_s)
    model = spin_model()
    mi, spec, n_calls = _setup(model)
    timing = step_timer.time_step(
        model, mi, spec, n_calls, budget_s=0.005, warmup=1, layer_extend_s=0, warn=False
    )
    for m in (timing.forward, timing.loss, timing.backward, timing.step):
        assert m.n == 10 and not m.undersampled and m.extended_s > 0, m


def test_a_step_converted_on_the_device_leaves_out_the_users_model_and_the_snapshot():
    # the steps run a float64 conversion of the user's float32 model on the same device: the
    # peak leaves out the user's float32 parameters and buffers, still there beside it, and the
    # float64 snapshot of the parameters (a float64 step in the user's own loop holds neither)
    model = spin_model()
    mi = make_inputs(model, (4,), batch_size=2, dtype=torch.float64)
    spec = StepSpec.parse(optimizer=torch.optim.SGD)
    n_calls = len(count_step(model.double(), mi, spec)[0].records)
    model.float()
    params32 = sum(p.numel() * 4 for p in model.parameters())
    buffers32 = sum(b.numel() * b.element_size() for b in model.buffers())
    mode = step_timer.RunMode(training=True, no_grad=False, dtype=torch.float64)
    fake = MemoryStats(lambda: 10_000_000, lambda: None)
    timing = step_timer.time_step(
        model, mi, spec, n_calls, mode, repeat=2, warmup=1, memory_stats=fake
    )
    assert params32 > 0 and next(model.parameters()).dtype == torch.float32
    assert timing.peak_memory_bytes == 10_000_000 - (params32 + buffers32) - 2 * params32


def test_instrumented_backward_passes_that_disagree_with_the_clean_backward_are_said(
    monkeypatch,
):
    # a newcomer's per-layer backward rows summed to 46.9 ms beside a clean backward of 30.6 ms,
    # with no warning (the forward's window check had no backward twin). Here the instrumented
    # passes are made to read exactly 2x the clean backward, every sample: beyond both (zero-
    # width) intervals and the 10 % tolerance, the clean backward the faster window to quote;
    # 1 ms more over the step's 10 autograd nodes is 100 us each, beyond what stamps cost
    import dataclasses
    import importlib
    import json
    import warnings

    from modelprof.errors import TimingDisagreementWarning
    from modelprof.timing.measurement import Measurement

    profile_module = importlib.import_module("modelprof.profile")
    real = profile_module.time_step

    made = {"passes": 2.0, "nodes": None}

    def slowed(*args, **kwargs):
        t = real(*args, **kwargs)
        clean = Measurement(np.full(12, 1.0))  # the clean backward: 1 ms each
        passes = np.full(12, made["passes"])
        return dataclasses.replace(
            t,
            backward=clean,
            passes_ms=passes,
            passes=Measurement(passes),
            calls_ms=t.calls_ms * 0 + made["passes"] / 3,
            nodes=made["nodes"] or t.nodes,
            stamp_cost=None,  # not taken off (as on a GPU): what the stamps explain is said
        )

    monkeypatch.setattr(profile_module, "time_step", slowed)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.warns(TimingDisagreementWarning, match="per-layer backward passes and") as rec:
        r = profile(model, (8,), backward=True, repeat=12, warmup=1, roofline=False)
    a = r.training_step.agreement
    assert not a.agree and a.phase == "backward" and a.ratio == pytest.approx(2.0)
    note = a.note()
    assert a.nodes == 10  # (2 Linear x (addmm, t / mm...) + ReLU + the loss's nodes)
    assert note.startswith(
        "the per-layer backward passes and the clean backward runs DISAGREE: the instrumented "
        "backward (every row's, (loss) included) read 2.000 ms (95 % CI 2.000-2.000), the clean "
        "backward median 1.000 ms"
    )
    assert "quote the clean backward 1.000 ms" in note and "stamp on each autograd node" in note
    assert len([w for w in rec if "backward passes" in str(w.message)]) == 1
    assert note in r.timing_notes and f"!! {note}" in r.summary()
    # every row with a backward time is marked rough, in the frame and in the human views
    df = r.to_dataframe()
    timed = df["backward_latency_ms"].notna()
    assert timed.any() and (df["backward_latency_rough"] == timed).all()
    md = r.export(
        "markdown", columns=["module", "backward_latency_ms"], standalone=False, caption=None
    )
    assert md.splitlines()[2].split("|")[2].strip().startswith("~")  # the (root) row's cell
    # by kind of layer too: the leaves' backward times, summed
    kinds = r.by_layer_type()
    leaves = df[df["leaf"]]
    assert kinds["backward_latency_ms"].sum() == pytest.approx(leaves["backward_latency_ms"].sum())
    env = json.loads(r.to_json())["env"]
    assert env["training_step"]["backward_agreement"]["agree"] is False
    # warn=False: the same note and marks, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", TimingDisagreementWarning)
        quiet = profile(model, (8,), backward=True, repeat=12, warmup=1, roofline=False, warn=False)
    assert not quiet.training_step.agreement.agree
    # 1.3x over 200 nodes: 1.5 us each, what the stamps cost (1.5-2.5 us measured here): said in
    # a note, the rows marked, no alarm (a small model's every step was a warning)
    made.update(passes=1.3, nodes=200)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        stamped = profile(model, (8,), backward=True, repeat=12, warmup=1, roofline=False)
    said = [str(w.message) for w in rec if issubclass(w.category, TimingDisagreementWarning)]
    assert not [m for m in said if "backward" in m]  # (the forward's may warn, and load may)
    s = stamped.training_step.agreement
    assert s.verdict == "stamps" and s.stamp_us == pytest.approx(1.5) and not s.agree
    assert s.note().startswith(
        "the per-layer backward rows include their stamps: the instrumented backward read "
        "1.300 ms, 1.30x the clean backward's 1.000 ms, about 1.5 us for each of its 200 "
        "autograd nodes"
    )
    assert f"note: {s.note()}" in stamped.summary() and f"!! {s.note()}" not in stamped.summary()
    assert stamped.to_dataframe()["backward_latency_rough"].any()
    assert "backward times: they include the per-node stamps' cost" in stamped.to_latex()


def test_a_training_step_prints_as_its_summary():
    # print(report.training_step) dumped every PassCost (many thousands of characters)
    r = profile(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (8,), backward=True, timing=False)
    text = repr(r.training_step)
    assert text == f"TrainingStep({r.training_step.summary()})" and "PassCost" not in text


def test_the_backward_check_reads_the_instrumented_passes_with_their_blocks():
    # unmocked: the instrumented backward is judged as a Measurement of its blocks (its interval
    # the blocks'), not as independent samples, and knows the step's autograd nodes
    r = profile(
        nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (8,), backward=True, repeat=12, warn=False
    )
    t, a = r.training_step.timing, r.training_step.agreement
    assert t.passes is not None and t.passes.n == t.passes_ms.size == 12
    assert t.passes.blocks is not None
    # each pass less its stretches' stamps (one stretch per stamp but the last) where the cost
    # was measured (12 pairs, above MIN_COST_PASSES = 10, so on the CPU it is) and lies above
    # the noise
    cost, stretches = t.stamp_cost, len(t.segments[0][1])
    assert t.plain_ms.size == 12
    taken = stretches * cost.per_call_ms if cost.applied else 0.0
    np.testing.assert_allclose(t.passes.samples_ms, t.passes_ms - taken)
    assert a.nodes == t.nodes > 0 and a.passes_ms == t.passes.median_ms
    assert a.passes_ci_ms == t.passes.median_ci_ms


def _pairs(n: int, excess_ms: Any, stretch_ms: list[float]):
    """What ``_Instrumented.stamp_cost`` reads: ``n`` plain backwards of 1 ms, the stretches
    of every pass (two columns), and instrumented passes ``excess_ms`` (one, or one per pass)
    slower than their pair."""
    ms = np.asarray(stretch_ms)
    inst = SimpleNamespace(
        plain=[1.0] * n,
        segments=[(np.array([0] * (len(ms) - 1) + [1]), ms)] * n,
    )
    return step_timer._Instrumented.stamp_cost(inst, 1.0 + np.broadcast_to(excess_ms, n))


def test_the_stamps_cost_is_the_paired_excess_over_a_pass_s_stretches():
    # 12 pairs, each instrumented pass 0.02 ms above its plain one, over 10 stretches a pass:
    # 0.002 ms a stamp, below the cheapest stretch's 0.005 ms
    cost = _pairs(12, 0.02, [0.005] + [0.1] * 9)
    assert cost.applied and not cost.capped
    assert cost.per_call_ms == pytest.approx(0.002)
    # a stretch holds at least its stamp: never more than the cheapest stretch's median
    capped = _pairs(12, 0.02, [0.001] + [0.1] * 9)
    assert capped.applied and capped.capped and capped.per_call_ms == pytest.approx(0.001)
    # a plain pass slower than its instrumented pair: nothing to take off, never less
    slower = _pairs(12, -0.01, [0.1] * 10)
    assert slower.per_call_ms == 0.0 and not slower.applied
    # noise: differences of +-0.05 ms about a median of 0.01 ms; the 95 % interval of the
    # median of 12 (order statistics 3 and 10 of the sorted differences) holds 0: not applied
    noisy = _pairs(12, [0.06, -0.04] * 6, [0.1] * 10)
    assert noisy.per_call_ms == pytest.approx(0.001) and not noisy.applied
    # fewer than MIN_COST_PASSES = 10 pairs: not measured
    assert _pairs(9, 0.02, [0.1] * 10) is None


def test_only_the_cpu_runs_a_plain_backward_beside_each_instrumented_one():
    runs = []
    for device, expected in (("cpu", ["one", "plain", "plain", "one", "one", "plain"]),
                             ("cuda", ["one", "one", "one"])):  # fmt: skip
        runs.clear()
        inst = SimpleNamespace(pairs=device == "cpu", plain=[])
        inst.one = lambda: runs.append("one") or 1.0
        inst.plain_one = lambda: runs.append("plain") or 0.5
        step_timer._Instrumented.chunk(inst, 3)
        # on the CPU the plain pass comes second, then first, in turn
        assert runs == expected


def test_the_backward_rows_stamps_are_taken_off_and_said_unless_asked_not_to():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    r = profile(model, (8,), backward=True, repeat=12, warmup=1, roofline=False, warn=False)
    t = r.training_step.timing
    cost = t.stamp_cost  # 12 pairs on the CPU: measured
    assert cost is not None and t.plain_ms.size == 12
    said = [n for n in r.timing_notes if n.startswith("per-layer backward times")]
    assert len(said) == 1 and f"note: {said[0]}" in r.summary()  # taken off or not: said
    env = r.training_step.to_dict()
    assert env["backward_stamp_cost"]["per_call_us"] == cost.per_call_ms * 1e3
    # taken off where the pairs' excess lies above 0 (load may hide it: then nothing is)
    stretches = len(t.segments[0][1])
    taken = stretches * cost.per_call_ms if cost.applied else 0.0
    np.testing.assert_allclose(t.passes.samples_ms, t.passes_ms - taken)
    assert f"{cost.per_call_ms * 1e3:.2f} us per stamp on each of {t.nodes}" in said[0]
    if cost.applied:
        assert said[0].startswith("per-layer backward times are corrected for the stamps'")
        if not cost.capped:  # the corrected passes sit on their plain pairs, in the median
            excess = t.passes.samples_ms - t.plain_ms
            assert abs(float(np.median(excess))) < 1e-9
    else:
        assert said[0].endswith("was not taken off (it lies within the pass pairs' noise); "
                                "read the rows by their backward latency share")  # fmt: skip
    # correct_overhead=False: measured, not taken off; the rows are the stretches as read
    raw = profile(
        model,
        (8,),
        backward=True,
        repeat=12,
        warmup=1,
        roofline=False,
        warn=False,
        correct_overhead=False,
    )
    t = raw.training_step.timing
    assert t.stamp_cost is not None and not t.stamp_cost.applied
    read = np.vstack(
        [np.bincount(c, weights=ms, minlength=t.calls_ms.shape[1]) for c, ms in t.segments]
    )
    np.testing.assert_allclose(t.calls_ms, read)
    np.testing.assert_allclose(t.passes.samples_ms, t.passes_ms)
    said = [n for n in raw.timing_notes if n.startswith("per-layer backward times")]
    assert said == [
        f"per-layer backward times include their stamps: the stamps' measured cost, "
        f"{t.stamp_cost.per_call_ms * 1e3:.2f} us per stamp on each of {t.nodes} autograd "
        "nodes, was not taken off (correct_overhead=False); read the rows by their backward "
        "latency share"
    ]
    # the step's summary: the rows' sum beside the clean backward, and the raw ratio
    assert (
        f"backward rows: the calls' medians sum to {t.coverage * t.backward.median_ms:.3f} ms, "
        f"{100 * t.coverage:.1f}% of the clean backward median"
    ) in raw.summary()
