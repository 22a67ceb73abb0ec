"""Sweeps on two torchrun ranks (gloo, CPU): the same frame as one process, one voice, timed
configurations one at a time, and a killed rank's sweep resumed. Every run has a time limit, so
a deadlock fails the test instead of hanging it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from modelprof import sweep
from modelprof.distributed.sweep import COUNTED_COLUMNS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NETS = """
    import os, signal
    import torch.distributed as dist
    from torch import nn
    INPUT_SIZE = (10,)
    def narrow():
        # a sweep's configurations run as in one process: no process group around them
        assert not dist.is_initialized(), "a process group is active"
        return nn.Sequential(nn.Linear(10, 20), nn.ReLU())
    def wide():
        return nn.Sequential(nn.Linear(10, 40), nn.ReLU())
    def broken():
        return nn.Sequential(nn.Linear(11, 40))
    def killer():  # rank 1 dies here when the test asks for it, as under an OOM killer
        if os.environ.get("RANK") == "1" and os.environ.get("SWEEP_TEST_KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        return narrow()
"""
# what must not depend on how the sweep was dealt
_SAME = [
    "model",
    "batch_size",
    "dtype",
    "mode",
    "timing",
    "device",
    "input_shape",
    "status",
    *COUNTED_COLUMNS,
]


def _torchrun(
    args: list[str], cwd: Path, *, env: dict[str, str] | None = None, timeout_s: float = 150
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc_per_node=2 -m modelprof sweep ARGS``, killed (all of its
    processes) after ``timeout_s``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        f"--log-dir={cwd / 'torchelastic'}",  # not a torchelastic_* folder left in /tmp
        "-m",
        "modelprof",
        "sweep",
        *args,
        "--timeout",
        "60",
    ]
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout_s} s (deadlock?)\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _config(tmp_path: Path, grids: str) -> Path:
    (tmp_path / "nets.py").write_text(textwrap.dedent(NETS))
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(grids).replace("NETS", str(tmp_path / "nets.py")))
    return path


def _same(frame: pd.DataFrame) -> pd.DataFrame:
    """The columns that must agree, as text (sweep.csv reads whole numbers with gaps as floats)."""
    same = frame[[c for c in _SAME if c in frame.columns]].reset_index(drop=True)
    counted = [c for c in COUNTED_COLUMNS if c in same.columns]
    return same.astype({c: "Int64" for c in counted}).astype(str)


def test_two_ranks_give_the_sequential_frame_with_one_voice(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        """
        [[grid]]
        models = ["NETS:narrow", "NETS:wide", "NETS:broken"]
        batch_sizes = [1, 4]
        dtypes = ["float32", "bfloat16"]
        [[grid]]
        models = ["NETS:narrow", "NETS:wide"]
        timing = true
        options = {repeat = 30, warmup = 2, roofline = false}
    """,
    )
    run = _torchrun([str(config), "--out", "out", "--progress"], tmp_path)
    # the broken configurations failed: the run fails (1), after writing everything
    assert run.returncode == 1, run.stderr[-3000:]
    got = pd.read_csv(tmp_path / "out" / "sweep.csv")
    assert len(got) == 14  # 3 models * 2 batch sizes * 2 dtypes + 2 timed
    assert set(got["rank"]) == {0, 1}
    sequential = sweep(config)  # this process: no torchrun, one rank
    assert _same(got).equals(_same(sequential))
    assert (got["status"] == "error").sum() == 4  # broken: 2 batch sizes * 2 dtypes, recorded
    # one voice: one table on stdout, one bar on stderr, one set of files
    assert run.stdout.count("14 configurations: 10 ok, 4 failed") == 1
    assert run.stderr.count("sweep:   0%") == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "configs",
        "sweep.csv",
        "sweep.json",
    ]
    assert len(list((tmp_path / "out" / "configs").iterdir())) == 14  # no temporary files
    # timed configurations: one per rank, never at once, and after every rank stopped counting
    timed = got[got["timing"]].sort_values("start_time")
    assert list(timed["rank"].sort_values()) == [0, 1]
    first, second = timed.to_dict(orient="records")
    assert first["start_time"] + first["wall_s"] <= second["start_time"]
    counting = got[~got["timing"]]
    assert (counting["start_time"] + counting["wall_s"]).max() <= first["start_time"]


def test_a_killed_rank_resumes_from_its_files(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        """
        models = ["NETS:narrow", "NETS:killer", "NETS:wide"]
        batch_sizes = [1, 4]
    """,
    )
    # deal: rank 0 gets narrow b1, killer b1, wide b1; rank 1 narrow b4, then dies on killer b4
    killed = _torchrun([str(config), "--out", "out"], tmp_path, env={"SWEEP_TEST_KILL": "1"})
    assert killed.returncode != 0
    folder = tmp_path / "out" / "configs"
    kept = {p.name: (p.stat().st_mtime_ns, p.read_text()) for p in folder.iterdir()}
    assert any(name.startswith("nets.py_narrow_b4_") for name in kept)  # rank 1's, before dying
    assert not any(name.startswith("nets.py_killer_b4_") for name in kept)
    assert not (tmp_path / "out" / "sweep.csv").exists()  # no table from a broken sweep
    # whole result files only; a rank SIGKILLed between its temporary file and the rename may
    # leave that hidden file, which the finished rerun removes
    kept = {k: v for k, v in kept.items() if not (k.startswith(".") and k.endswith(".tmp"))}
    assert all(name.endswith(".json") and not name.startswith(".") for name in kept)
    (folder / ".nets.py_wide_b4_stray.json.abc123.tmp").write_text('{"row": ')  # as if killed

    resumed = _torchrun([str(config), "--out", "out"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []
    got = pd.read_csv(tmp_path / "out" / "sweep.csv")
    assert len(got) == 6 and (got["status"] == "ok").all()
    # no terminal: one line per configuration, each from the rank that ran or read it (3 each)
    said = [ln for ln in resumed.stderr.splitlines() if ln.startswith("modelprof: sweep: rank ")]
    assert len(said) == 6, resumed.stderr[-3000:]
    assert sum("sweep: rank 0: " in ln for ln in said) == sum("rank 1: " in ln for ln in said)
    for name, (mtime, text) in kept.items():  # skipped, not run again
        assert (folder / name).stat().st_mtime_ns == mtime and (folder / name).read_text() == text
    # the footer counts every rank's rows read back (a trial's said "rank 0: 7" of 12: rank
    # 0's only), in the one-process run's words: every kept file is one (rank 1's narrow b4)
    said = f"; {len(kept)} read back from an earlier run in out (--no-resume runs them again)"
    assert resumed.stdout.count(said) == 1, resumed.stdout
    assert _same(got).equals(_same(sweep(config)))


def test_a_callers_process_group_deals_a_counting_sweep(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        """
        models = ["NETS:wide", "NETS:broken"]
        batch_sizes = [1, 4]
    """,
    )
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, sys
        import torch.distributed as dist
        import modelprof
        dist.init_process_group("gloo")
        df = modelprof.sweep({str(config)!r})
        if dist.get_rank() == 0:
            df.to_csv("frame.csv", index=False)
        try:  # timing under the caller's group is refused, with the reason
            modelprof.sweep({{"models": ["{tmp_path / "nets.py"}:wide"], "timing": True}})
        except modelprof.ModelProfError as e:  # a file per rank: their prints interleave
            with open(f"refused_{{dist.get_rank()}}.txt", "w") as f:
                f.write(str(e))
        dist.destroy_process_group()
    """)
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        f"--log-dir={tmp_path / 'torchelastic'}",
        str(script),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("torchrun did not finish in 150 s (deadlock?)")
    assert proc.returncode == 0, err[-3000:]
    got = pd.read_csv(tmp_path / "frame.csv")
    assert list(got["rank"]) == [0, 1, 0, 1]  # configuration i on rank i % 2
    assert _same(got).equals(_same(sweep(config)))
    for rank in (0, 1):
        assert (
            (tmp_path / f"refused_{rank}.txt")
            .read_text()
            .startswith(
                "sweep: timed configurations cannot run under an initialised process group "
                "(world size 2)"
            )
        )
