"""Progress bars: tqdm only when asked for; a total (so an ETA); a no-op without tqdm; the
timing passes of profile, compare and throughput each under one bar, closed when they end."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from modelprof import compare, measure_latency, measure_throughput, profile
from modelprof.cli import main
from modelprof.errors import ModelProfError
from modelprof.runtime import progress
from modelprof.runtime.progress import NoProgress, progress_bar, sampling_bar
from modelprof.timing.sampler import StopRule, collect


def test_progress_never_imports_tqdm_auto_or_notebook() -> None:
    # a fresh interpreter: tqdm.auto (whose import alone prints "IProgress not found" in a
    # notebook without ipywidgets) and tqdm.notebook stay unimported by compare() with progress
    # off or on (outside a notebook). torch itself imports plain tqdm (torch.hub).
    code = (
        "import sys, torch\nfrom modelprof import compare\n"
        "compare({'a': torch.nn.Linear(4, 4)}, (4,), timing=False)\n"
        "compare({'a': torch.nn.Linear(4, 4)}, (4,), timing=False, progress=True)\n"
        "print(sorted(m for m in sys.modules if m in ('tqdm.auto', 'tqdm.notebook',"
        " 'tqdm.autonotebook')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def test_enabled_progress_is_a_text_bar_with_a_total(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bar = progress_bar(4, enabled=True, desc="compare", unit="model")
    assert type(bar).__module__ == "tqdm.std"  # plain tqdm, never tqdm.auto outside a notebook
    bar.update(1)
    bar.refresh()
    bar.close()
    text = err.getvalue()
    assert "compare" in text and "1/4" in text  # the total is known: n/total and an ETA
    assert "<" in text.split("1/4")[1]  # "[elapsed<remaining, rate]"


def test_a_rank_that_does_not_speak_shows_no_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    # launched by torchrun as rank 1 (RANK decides before a group exists): one voice, every bar
    # of modelprof is a no-op there, asked for or not; with MODELPROF_ALL_RANKS=1 it shows
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MODELPROF_ALL_RANKS", raising=False)
    assert isinstance(progress_bar(10, enabled=True), NoProgress)
    assert isinstance(sampling_bar(StopRule(repeat=5), enabled=True, desc="x").bar, NoProgress)
    monkeypatch.setenv("MODELPROF_ALL_RANKS", "1")
    bar = progress_bar(10, enabled=True)
    assert not isinstance(bar, NoProgress)
    bar.close()


def test_missing_tqdm_gives_a_quiet_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    bar = progress_bar(3, enabled=True)
    assert isinstance(bar, NoProgress)
    with bar:
        bar.update(2)
        bar.set_description("x")
        bar.set_postfix(batch=4)
    assert bar.n == 2


# --------------------------------------------------------------------------- the timing passes
# A fake tqdm class stands in for the real one (where progress_bar looks tqdm up, so a lookup
# with progress off would show): it records every bar made, its total, what it was advanced by
# and whether it was closed, and writes nothing.


class FakeBar:
    made: list[FakeBar] = []
    lookups = 0

    def __init__(
        self,
        total: float | None = None,
        desc: str | None = None,
        unit: str = "it",
        leave: bool = False,
        **kwargs: object,
    ) -> None:
        self.total, self.desc, self.unit, self.kwargs = total, desc, unit, kwargs
        self.first_desc = desc
        self.n: float = 0
        self.closed = False
        FakeBar.made.append(self)

    def update(self, n: float = 1) -> None:
        assert not self.closed, "a bar advanced after it was closed"
        self.n += n

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc

    def set_postfix(self, *args: object, **kwargs: object) -> None: ...

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_tqdm(monkeypatch: pytest.MonkeyPatch) -> list[FakeBar]:
    FakeBar.made = []
    FakeBar.lookups = 0

    def tqdm_class() -> type[FakeBar]:
        FakeBar.lookups += 1
        return FakeBar

    monkeypatch.setattr(progress, "_tqdm_class", tqdm_class)
    return FakeBar.made


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU())


def _by_desc(bars: list[FakeBar]) -> dict[str, FakeBar]:
    out = {str(b.first_desc): b for b in bars}
    assert len(out) == len(bars), [b.desc for b in bars]
    return out


def test_profile_times_under_bars_whose_total_is_the_budget(fake_tqdm: list[FakeBar]) -> None:
    # precision 1e-6 is never reached, so both passes sample until their 0.2 s budget is spent,
    # or stop on "spread" once the blocks show that the budget cannot reach it (from the 8th
    # block on: a 0.2 s budget of 0.1 s blocks seldom gets there, a loaded CI machine's did)
    report = profile(
        _mlp(),
        (16,),
        budget_s=0.2,
        precision=1e-6,
        warmup=1,
        warn=False,
        roofline=False,
        progress=True,
    )
    bars = _by_desc(fake_tqdm)
    assert set(bars) == {"latency Sequential", "per-layer Sequential"}
    for bar in bars.values():
        assert bar.total == 0.2 and bar.unit == "s"  # the budget: tqdm can show an ETA
        assert "{remaining}" in str(bar.kwargs["bar_format"])
        assert 0 < bar.n <= 0.2  # seconds sampled, never past the total
        assert bar.closed
    assert report.latency.stop_reason in ("budget", "spread")


def test_profile_with_repeat_counts_samples_to_the_target(fake_tqdm: list[FakeBar]) -> None:
    profile(_mlp(), (16,), repeat=4, warmup=1, warn=False, roofline=False, progress=True)
    bars = _by_desc(fake_tqdm)
    assert set(bars) == {"latency Sequential", "per-layer Sequential"}
    for bar in bars.values():
        assert (bar.total, bar.n, bar.unit, bar.closed) == (4, 4, "sample", True)


def test_progress_off_makes_no_bar_and_writes_nothing(
    fake_tqdm: list[FakeBar], capfd: pytest.CaptureFixture[str]
) -> None:
    profile(_mlp(), (16,), repeat=3, warmup=1, warn=False, roofline=False)
    assert fake_tqdm == [] and FakeBar.lookups == 0  # tqdm not even looked up
    assert capfd.readouterr().err == ""


def test_profile_without_tqdm_is_quiet(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    report = profile(_mlp(), (16,), repeat=3, warmup=1, warn=False, roofline=False, progress=True)
    assert report.latency.n == 3
    assert capfd.readouterr().err == ""


def test_a_failing_pass_still_closes_its_bar(fake_tqdm: list[FakeBar]) -> None:
    calls = 0

    def flaky(x: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls > 2:  # the warm-up call passes, the second sample fails
            raise RuntimeError("boom")
        return x

    with pytest.raises(ModelProfError, match="boom"):
        measure_latency(flaky, torch.zeros(2), warmup=1, repeat=5, progress=True)
    assert [b.closed for b in fake_tqdm] == [True]


def test_compare_shows_the_models_and_the_interleaved_timing(fake_tqdm: list[FakeBar]) -> None:
    compare(
        {"a": _mlp(), "b": _mlp()},
        (16,),
        budget_s=0.2,
        precision=1e-6,
        warmup=1,
        warn=False,
        progress=True,
    )
    overall, inner = fake_tqdm  # the bar over the comparison, then the one of the timing
    # 2 models + 1 interleaved timing step (the description names the step under way)
    assert (overall.first_desc, overall.total, overall.n, overall.closed) == ("compare", 3, 3, True)
    # interleaved rounds: 0.2 s per candidate, 2 candidates
    assert inner.first_desc == "interleaved timing" and inner.unit == "s"
    assert inner.total == pytest.approx(0.4) and 0 < inner.n <= inner.total and inner.closed


def test_throughput_shows_its_points_and_each_measurement(fake_tqdm: list[FakeBar]) -> None:
    measure_throughput(
        _mlp(), (16,), max_batch=4, budget_s=0.05, warmup=1, warn=False, progress=True
    )
    outer, inner = fake_tqdm[0], fake_tqdm[1:]
    # points 1, 2, 4: 4 .bit_length() = 3
    assert (outer.first_desc, outer.total, outer.closed) == ("throughput", 3, True)
    assert outer.n >= 3
    assert inner and all(b.total == 0.05 and b.closed for b in inner)


def test_cli_profile_passes_progress_on(fake_tqdm: list[FakeBar], tmp_path: Path) -> None:
    f = tmp_path / "net.py"
    f.write_text(
        "from torch import nn\nINPUT_SIZE = (16,)\n"
        "def build():\n    return nn.Sequential(nn.Linear(16, 16), nn.ReLU())\n"
    )
    assert main(["profile", f"{f}:build", "--budget", "0.1", "--progress"]) == 0
    descs = {b.first_desc for b in fake_tqdm}
    assert {"latency Sequential", "per-layer Sequential"} <= descs
    assert all(b.closed and b.total == 0.1 for b in fake_tqdm if b.unit == "s")


def test_collect_reports_each_block() -> None:
    ticks = iter(range(1000))  # every reading of the clock is 1 ms after the previous one
    seen: list[tuple[int, float]] = []
    rule = StopRule.parse(repeat=5)
    sampled = collect(
        lambda k: np.ones(k),
        rule,
        est_ms=50.0,
        now=lambda: next(ticks) / 1e3,
        on_block=lambda n, s: seen.append((n, s)),
    )
    # repeat=N comes in blocks of at most ceil(N / max(2, min_blocks)) samples, so that even a
    # fixed count has blocks to judge drift by: min_blocks is 6, ceil(5 / 6) = 1 sample a block
    assert rule.min_blocks == 6
    assert [n for n, _ in seen] == [1, 2, 3, 4, 5]
    # readings: t0 = 0 ms, then each block reads the clock twice (start, end): 2, 4, ... 10 ms
    assert [s for _, s in seen] == pytest.approx([0.002, 0.004, 0.006, 0.008, 0.010])
    assert sampled.n == 5


def test_sampling_bar_never_runs_past_its_total(fake_tqdm: list[FakeBar]) -> None:
    with sampling_bar(StopRule.parse(budget_s=2.0), enabled=True, desc="x") as bar:
        bar(10, 1.5)
        bar(20, 1.0)  # an earlier reading never moves it back
        bar(30, 7.0)  # the last block ends past the budget: the bar stops at its total
    (made,) = fake_tqdm
    assert (made.total, made.n, made.closed) == (2.0, 2.0, True)
