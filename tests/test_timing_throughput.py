"""Throughput search: doubling, plateau stop, out-of-memory binary search, the curve."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import blocked
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.render.options import ViewOptions
from modelprof.timing import Throughput, ThroughputPoint, measure_throughput
from modelprof.timing.calibration import spin
from modelprof.timing.layers import is_oom
from modelprof.timing.measurement import Measurement
from modelprof.timing.throughput import search_batches

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


def fake_measure(sps_of, limit: int | None = None, error=torch.OutOfMemoryError):
    """A measure(b) whose samples/s is ``sps_of(b)``; batches above ``limit`` run out of memory."""
    tried: list[int] = []

    def measure(b: int) -> ThroughputPoint:
        tried.append(b)
        if limit is not None and b > limit:
            raise error(f"CUDA out of memory. Tried to allocate {b} MiB")
        sps = float(sps_of(b))
        return ThroughputPoint(b, 1e3 * b / sps, sps)

    return measure, tried


def test_stops_when_samples_per_s_plateau():
    # sps = 100 * min(b, 16): 1..16 each double it; 32 and 64 give no >= 5 % gain -> stop after 64
    measure, tried = fake_measure(lambda b: 100 * min(b, 16))
    points, reason, fit, oom = search_batches(measure, max_batch=1024)
    assert tried == [1, 2, 4, 8, 16, 32, 64]
    assert reason == "no_improvement" and oom is None and fit == 64
    assert max(points, key=lambda p: p.samples_per_s).batch_size == 16


def test_small_gain_counts_as_no_improvement():
    # +4 % per doubling after 8 is below the 5 % threshold: 16 and 32 are stale -> stop at 32
    measure, tried = fake_measure(lambda b: b if b <= 8 else 8 * 1.04 ** (b.bit_length() - 4))
    _, reason, _, _ = search_batches(measure, max_batch=1024, gain=0.05, patience=2)
    assert tried == [1, 2, 4, 8, 16, 32] and reason == "no_improvement"


def test_stops_at_max_batch_even_when_not_a_power_of_two():
    measure, tried = fake_measure(lambda b: b)
    _, reason, fit, _ = search_batches(measure, max_batch=12)
    assert tried == [1, 2, 4, 8, 12] and reason == "max_batch" and fit == 12


def test_oom_binary_search_finds_the_largest_batch_that_fits():
    frees = []
    measure, tried = fake_measure(lambda b: b, limit=37)
    points, reason, fit, oom = search_batches(measure, max_batch=1024, free=lambda: frees.append(1))
    # 64 fails; then between 32 (ran) and 64: 48 x, 40 x, 36 ok, 38 x, 37 ok
    assert tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert (reason, fit, oom) == ("oom", 37, 38)
    assert len(frees) == 4  # 64, 48, 40, 38
    assert [p.batch_size for p in points] == [1, 2, 4, 8, 16, 32, 36, 37]


def test_runtime_error_saying_out_of_memory_counts_as_oom():
    measure, _ = fake_measure(lambda b: b, limit=5, error=RuntimeError)
    _, reason, fit, _ = search_batches(measure, max_batch=64)
    assert (reason, fit) == ("oom", 5)
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 GB"))
    assert not is_oom(RuntimeError("shape mismatch"))


def test_other_errors_propagate():
    measure, _ = fake_measure(lambda b: b, limit=3, error=ValueError)
    with pytest.raises(ValueError):
        search_batches(measure, max_batch=64)


def test_batch_one_out_of_memory_is_a_modelprof_error():
    measure, _ = fake_measure(lambda b: b, limit=0)
    with pytest.raises(ModelProfError, match="batch_size=1"):
        search_batches(measure, max_batch=64)


class OomAbove(nn.Module):
    """Spins a fixed 0.2 ms per call whatever the batch (so samples/s grows with it) and runs
    'out of memory' above ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0]} GiB")
        spin(0.2)
        return x


def test_measure_throughput_finds_the_memory_limit_of_a_model():
    model = OomAbove(limit=21)
    tp = measure_throughput(model, (2,), budget_s=0.03, warmup_s=0.0, min_samples=3)
    assert isinstance(tp, Throughput)
    # 1..16 ran, 32 failed; 24 x, 20 ok, 22 x, 21 ok
    assert (tp.stop_reason, tp.max_fit_batch, tp.oom_batch) == ("oom", 21, 22)
    assert [p.batch_size for p in tp.points] == [1, 2, 4, 8, 16, 20, 21]
    # the best batch is the point with the most samples/s (a fixed time per call makes that the
    # biggest on a quiet machine; under load one preempted sample can decide it, so the
    # choice is checked, not which batch wins), of those not on too few runs where any is
    enough = [p for p in tp.points if not p.undersampled] or tp.points
    assert tp.best_batch_size == max(enough, key=lambda p: p.samples_per_s).batch_size
    for p in tp.points:
        m = p.measurement
        # samples/s = batches x batch / total measured time
        assert p.samples_per_s == pytest.approx(p.batch_size * m.n / (m.samples_ms.sum() / 1e3))
        assert p.latency_ms == m.median_ms
        # the median's 95 % interval travels with it (NaN where a point has none)
        ci = (p.latency_ci_low_ms, p.latency_ci_high_ms)
        np.testing.assert_equal(ci, m.median_ci_ms)
        assert not m.has_interval or ci[0] <= p.latency_ms <= ci[1]
    df = tp.to_dataframe()
    assert list(df.columns) == [
        "batch_size",
        "latency_ms",
        "latency_ci_low_ms",
        "latency_ci_high_ms",
        "latency_n",  # how many batches a point rests on (a newcomer saw no n anywhere)
        "samples_per_s",
        # (no peak_memory_bytes: the CPU keeps no allocator peak, and a report leaves it out)
        "loaded",
        # the point disagrees with a bigger batch (tests/test_agreement_*), or read loaded
        "latency_rough",
    ]
    assert df["batch_size"].tolist() == [1, 2, 4, 8, 16, 20, 21]
    assert df["latency_n"].tolist() == [p.measurement.n for p in tp.points]
    assert str(df["latency_n"].dtype) == "Int64"  # whole numbers, <NA> where a point has none
    assert tp.memory_before_bytes is None and tp.memory_restored is None  # CPU
    d = json.loads(json.dumps(tp.to_dict(), allow_nan=False))  # strict JSON: no NaN
    assert d["best_batch_size"] == tp.best_batch_size == d["env"]["batch_size"]
    assert "samples/s" in repr(tp)
    # its samples/s is a mean over all its runs, not batch / median as profile()'s summary and
    # a Measurement's fps are (2x apart under load): the head and the caption say which
    assert "samples/s over all its runs at batch" in repr(tp).splitlines()[0]
    assert "samples/s over all its runs at batch" in tp.to_markdown()
    assert model.training  # flag restored


def test_measure_throughput_rejects_bad_options():
    with pytest.raises(ModelProfError, match="max_batch=0"):
        measure_throughput(nn.Linear(2, 2), (2,), max_batch=0)
    with pytest.raises(ModelProfError, match="batch_size="):
        measure_throughput(nn.Linear(2, 2), (2,), batch_size=4)


SEEN: list[tuple] = []  # what TokenLM's calls got (its copies' too: a training step's search)


class TokenLM(nn.Module):
    """A language model fed token ids: records what each call got in SEEN."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 4)

    def forward(self, input_ids, attention_mask=None):
        SEEN.append((tuple(input_ids.shape), input_ids.dtype, int(input_ids.max()), attention_mask))
        return self.embed(input_ids)


def test_a_language_model_is_searched_on_token_ids():
    # a float input of input_size cannot feed an Embedding: tokens=8 makes input_ids of
    # (batch, 8) below the vocabulary (50) and an all-ones attention_mask, at every batch
    lm = TokenLM()
    SEEN.clear()
    tp = measure_throughput(lm, tokens=8, max_batch=4, budget_s=0.02, warmup_s=0.0, min_samples=3)
    assert [p.batch_size for p in tp.points] == [1, 2, 4]
    shapes = {shape for shape, *_ in SEEN}
    assert shapes == {(1, 8), (2, 8), (4, 8)}
    for shape, dtype, top, mask in SEEN:
        assert dtype == torch.int64 and top < 50
        assert mask.shape == shape and bool((mask == 1).all())
    # the training step's search takes the same ids (the sum of the outputs as its loss)
    from modelprof.step.throughput import step_measure

    SEEN.clear()
    steps = measure_throughput(
        lm, tokens=8, max_batch=2, measure=step_measure(None, tokens=8), budget_s=0.02
    )
    assert [p.batch_size for p in steps.points] == [1, 2]
    assert {shape for shape, *_ in SEEN} == {(1, 8), (2, 8)}
    for given in ({}, {"input_size": (8,), "tokens": 8}):  # neither, or both
        with pytest.raises(ModelProfError, match="pass one of input_size .* or tokens="):
            measure_throughput(lm, **given)
    with pytest.raises(ModelProfError, match="tokens="):
        measure_throughput(lm, tokens=0)
    with pytest.raises(ModelProfError, match="input_size or tokens=, not both"):
        step_measure((8,), tokens=8)


def test_progress_bar_does_not_break_the_search(capsys):
    tp = measure_throughput(
        OomAbove(limit=2), (2,), budget_s=0.02, warmup_s=0.0, min_samples=3, progress=True
    )
    assert tp.max_fit_batch == 2


def test_a_search_under_load_says_so_once_in_its_notes():
    # the points warn=False (one warning a search, not one a point): a point whose wall time is
    # 2x its CPU time (wall/CPU 2.0 > 1.15, test_timing_measurement) is loaded; one whose
    # blocks ramp 10 * 1.02^b (b = 0..9: +19.5 % beyond its +-8.9 %) drifted; a quiet one is
    # neither. Each kind is said once, naming its batch sizes, with its warning's kind
    from modelprof.errors import DriftWarning, LoadedMachineWarning
    from modelprof.timing.measurement import Measurement

    rng = np.random.default_rng(0)
    cpu = 10.0 + rng.normal(0.0, 0.01, 40)
    blocks = np.repeat(np.arange(8), 5)
    stamps = blocks * 0.1

    def loaded() -> Measurement:
        return Measurement(2.0 * cpu, blocks=blocks, timestamps_s=stamps, cpu_ms=cpu)

    drifted = blocked(10.0 * 1.02 ** np.arange(10))
    quiet = Measurement(cpu, blocks=blocks, timestamps_s=stamps, cpu_ms=cpu)
    assert (
        loaded().loaded and drifted.stable is False and not (quiet.loaded or quiet.stable is False)
    )
    points = [
        ThroughputPoint(b, m.median_ms, b / m.median_ms * 1e3, measurement=m)
        for b, m in ((1, loaded()), (2, quiet), (4, loaded()), (8, drifted))
    ]
    tp = Throughput(points, "max_batch")
    assert [kind for _, kind in tp.timing_warnings] == [LoadedMachineWarning, DriftWarning]
    notes = tp.timing_notes
    assert notes[0].startswith("batch 1, batch 4 timed on a loaded machine (")
    assert notes[1].startswith("batch 8 drifted while timed")
    assert Throughput(points[1:2], "max_batch").timing_notes == []  # quiet: nothing to say
    # a GPU clock that moved (1980 / 1500 - 1 = 32 % > 5 %) on a quiet point: said as such
    from modelprof.errors import GpuClockWarning

    clocked = Measurement(cpu, blocks=blocks, timestamps_s=stamps, sm_clock_mhz=[1980] + [1500] * 7)
    moved = Throughput([ThroughputPoint(16, 10.0, 1600.0, measurement=clocked)], "max_batch")
    [(text, kind)] = moved.timing_warnings
    assert kind is GpuClockWarning and text.startswith("the GPU's SM clock moved by more than 5 %")
    assert "while batch 16 was timed" in text
    # a point without an interval: NaN in the frame, None (strict JSON) in the dict
    bare = Throughput([ThroughputPoint(1, 1.0, 1000.0)], "max_batch")
    assert bare.to_dataframe()["latency_ci_low_ms"].isna().all()
    assert (
        json.loads(json.dumps(bare.to_dict(), allow_nan=False))["points"][0]["latency_ci_high_ms"]
        is None
    )
    assert all(f"!! {n}" in repr(tp) for n in notes) and tp.to_dict()["timing_notes"] == notes


def test_a_throughput_search_warns_once_of_each_unless_told_not_to(monkeypatch):
    # measure_throughput warns of what timing_warnings holds, once each, and not with
    # warn=False; a comparison says it naming the model, in its notes too
    import warnings

    import modelprof
    from modelprof.errors import LoadedMachineWarning
    from modelprof.timing import throughput

    said = [("batch 1 timed on a loaded machine (x)", LoadedMachineWarning)]
    monkeypatch.setattr(throughput.Throughput, "timing_warnings", property(lambda self: said))
    for warn, expected in ((True, 1), (False, 0)):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            measure_throughput(nn.Linear(2, 2), (2,), max_batch=2, repeat=3, warn=warn)
        mine = [w for w in got if issubclass(w.category, LoadedMachineWarning)]
        assert len(mine) == expected
        if expected:
            assert str(mine[0].message) == "modelprof: throughput: " + said[0][0]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        df = modelprof.compare(
            {"a": nn.Linear(2, 2), "b": nn.Linear(2, 4)},
            (2,),
            timing=False,
            throughput=True,
            throughput_options={"max_batch": 2, "repeat": 3},
        )
    mine = [str(w.message) for w in got if issubclass(w.category, LoadedMachineWarning)]
    assert mine == [f"modelprof: {n} throughput: {said[0][0]}" for n in "ab"]
    said_notes = [n for n in df.attrs["notes"] if "timed on a loaded machine" in n]
    assert said_notes == [m[11:] for m in mine]
    # besides them, a model's throughput notes only say where the search stopped at its cap
    others = [n for n in df.attrs["notes"] if "throughput" in n and n not in said_notes]
    assert all(" throughput: stopped at max_batch=2" in n for n in others)


def test_a_meta_device_has_no_throughput():
    # it was searched: meta tensors run no kernel, so batch 1024 "ran" at ~2 million samples/s
    from modelprof import ModelProfError

    model = nn.Linear(4, 4)
    with pytest.raises(ModelProfError, match=r"^device='meta' has no clock"):
        measure_throughput(model, (4,), device="meta", max_batch=2)
    assert model.weight.device.type == "cpu"
    # nor a model that lies on meta, with no device= given
    with pytest.raises(ModelProfError, match=r"^device='meta' has no clock"):
        measure_throughput(nn.Linear(4, 4, device="meta"), (4,), max_batch=2)


def _point(batch: int, ms: float, cpu: float, **point_args: Any) -> ThroughputPoint:
    """A point of 10 runs around ``ms``, ``cpu`` ms of CPU work each: loaded (another core's
    worth of work beside it) where the wall clock is not its CPU work."""
    m = Measurement(
        np.linspace(0.98, 1.02, 10) * ms,
        cpu_ms=np.full(10, cpu),
        competing_cores=0.0 if cpu == ms else 1.0,
        blocks=np.repeat(np.arange(5), 2),
    )
    return ThroughputPoint(batch, m.median_ms, batch / (ms / 1e3), measurement=m, **point_args)


def test_a_flattening_that_loaded_points_show_is_not_concluded():
    # a newcomer's batch 16 and 32 took 4.2 s and 5.9 s beside other work, batch 8 356 ms:
    # "the curve has flattened, a larger max_batch is unlikely to help", no point marked
    # batch 8 quiet (wall = CPU work); 16 and 32 read twice their CPU work, another core's
    # worth of work beside them
    points = [_point(8, 40.0, 40.0), _point(16, 160.0, 80.0), _point(32, 320.0, 160.0)]
    env = {"gain": 0.05, "patience": 2}
    loaded = Throughput(points, "no_improvement", env=env)
    text = loaded.stop_explanation
    assert "batch 16, 32 read on a loaded machine" in text and "has flattened" not in text
    assert loaded.to_dataframe()["latency_rough"].tolist() == [False, True, True]
    assert loaded.to_dataframe()["latency_n"].tolist() == [10, 10, 10]
    quiet = Throughput([points[0], _point(16, 80.0, 80.0)], "no_improvement", env=env)
    assert "the curve has flattened" in quiet.stop_explanation


def _loaded_curve(**point_args) -> Throughput:
    """Batch 8 quiet (its wall clock its CPU work), 16 and 32 read at twice their CPU work with
    another core's worth of work beside them: loaded, so rough (as the test above builds it)."""

    def point(batch: int, ms: float, cpu: float) -> ThroughputPoint:
        return _point(batch, ms, cpu, **point_args)

    points = [point(8, 40.0, 40.0), point(16, 160.0, 80.0), point(32, 320.0, 160.0)]
    return Throughput(points, "no_improvement", env={"gain": 0.05, "patience": 2})


def _cells(text: str, batch: str) -> list[str]:
    """The cells of the Markdown row of ``batch``."""
    (row,) = [
        r for r in text.splitlines() if r.startswith("|") and r.split("|")[1].strip() == batch
    ]
    return [c.strip() for c in row.split("|")[1:-1]]


def test_a_throughput_curve_exports_in_every_registered_format(tmp_path):
    # a newcomer's curve.to_csv("tp.csv"): AttributeError, though the command line wrote one
    from modelprof.render import read_csv, read_json
    from modelprof.render.formats import table_formats

    tp = _loaded_curve()
    df = tp.to_dataframe()
    assert all(hasattr(tp, f"to_{f.name}") for f in table_formats())
    # CPU points keep no allocator peak: the column is left out, not a column of None
    assert "peak_memory_bytes" not in df.columns
    back = read_csv(tp.to_csv(tmp_path / "tp.csv"))
    pd.testing.assert_frame_equal(back, df, check_exact=True)
    rows, totals, env = read_json(tp.to_json())
    pd.testing.assert_frame_equal(rows, df, check_exact=True)
    assert totals is None and env["best_batch_size"] == tp.best_batch_size and "points" not in env
    md = str(tp.to_markdown())
    # batch 16 and 32 were loaded: their latency and samples/s marked, batch 8's not; the
    # caption says what the marks mean, the notes below say why
    assert "~ rough: batch 16, 32 timed on a loaded machine" in md.replace("\\~", "~")
    header = _cells(md, "batch size")
    assert "latency rough" not in header and "loaded" in header  # the flag said by its marks
    for batch, marked in (("8", False), ("16", True), ("32", True)):
        cells = dict(zip(header, _cells(md, batch)))
        for column in ("latency", "samples/s"):
            assert cells[column].startswith("~") == marked, (batch, column)
    assert tp.stop_explanation in md and tp.timing_notes[0] in md
    # greyed: 2 loaded rows x 4 cells (latency, its interval's two bounds, samples/s)
    assert str(tp.to_latex(width=None)).count("\\textcolor{gray}") == 2 * 4
    assert str(tp.to_html()).count('class="r rough"') == 2 * 4
    # a caption of one's own keeps what the marks mean
    own = str(tp.to_text(view=ViewOptions(caption="mine", title="mine")))
    assert own.splitlines()[0] == "mine; ~ rough: batch 16, 32 timed on a loaded machine"
    with pytest.raises(ModelProfError, match="rows are its batch sizes"):
        tp.to_markdown(group_by="layer_type")


def test_a_throughput_curves_peak_memory_reads_back_where_kept(tmp_path):
    # CUDA's allocator peak (here given): a float64 column, as the registry declares it
    from modelprof.render import read_csv

    df = _loaded_curve(peak_memory_bytes=2**20).to_dataframe()
    assert df["peak_memory_bytes"].dtype == "float64" and (df["peak_memory_bytes"] == 2**20).all()
    pd.testing.assert_frame_equal(read_csv(_loaded_curve(peak_memory_bytes=2**20).to_csv()), df)
