"""The sweep proof: 48 configurations on two torchrun ranks against one process, and a sweep
whose rank is killed midway, resumed.

    python benchmarks/sweep.py [--rounds 3] [--workdir /tmp/modelprof_sweep_bench]

The sweep: 12 torchvision models × batch {1, 8} × {float32, bfloat16}, counting only (built and
counted on meta), forward. Each round runs, in alternating order,

- ``python -m modelprof sweep vision.toml`` (one process), and
- ``torchrun --standalone --nproc_per_node=2 -m modelprof sweep vision.toml --progress``,

each into a fresh folder, and prints the wall time of both commands (process start, imports and
the gloo group included) and of the sweep itself (first configuration started to last one
finished, from the rows' ``start_time`` and ``wall_s``), with their ratios (2 ranks / 1).
It checks that the two frames agree on every configuration and counted column, that there is
one set of files and one progress bar. Then it starts the 2-rank sweep again, SIGKILLs rank 1
once a quarter of the result files exist, reruns the command, and checks that the rerun
completes, leaves the files written before the kill untouched and gives the same frame.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
MODELS = [
    "resnet50",
    "resnet152",
    "densenet201",
    "efficientnet_b4",
    "mobilenet_v3_large",
    "regnet_y_16gf",
    "convnext_base",
    "vit_b_16",
    "swin_t",
    "maxvit_t",
    "inception_v3",
    "shufflenet_v2_x1_0",
]
CONFIG = (
    f'models = {MODELS!r}\nbatch_sizes = [1, 8]\ndtypes = ["float32", "bfloat16"]\n'
    'modes = ["forward"]\ntiming = false\n'
).replace("'", '"')
SAME = [
    "model",
    "batch_size",
    "dtype",
    "mode",
    "timing",
    "device",
    "input_shape",
    "status",
    "params",
    "macs",
    "flops",
    "madd",
    "output_bytes",
    "read_bytes",
    "write_bytes",
]
N = 48  # 12 models * 2 batch sizes * 2 dtypes


def _command(config: Path, out: Path, ranks: int) -> list[str]:
    sweep = ["-m", "modelprof", "sweep", str(config), "--out", str(out), "--progress"]
    if ranks == 1:
        return [sys.executable, *sweep]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        *sweep,
    ]


def _env() -> dict[str, str]:
    # the same threads in both: torchrun would set OMP_NUM_THREADS=1 for its workers only
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def run(config: Path, out: Path, ranks: int) -> tuple[float, str]:
    """Run the sweep command; return its wall time and its stderr."""
    shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()[0]
    launched = time.time()
    start = time.perf_counter()
    done = subprocess.run(
        _command(config, out, ranks),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{ranks} rank(s) failed:\n{done.stderr[-4000:]}")
    df = frame(out)
    first, last = df["start_time"].min(), (df["start_time"] + df["wall_s"]).max()
    print(
        f"  (start-up to the first configuration {first - launched:.1f} s, last configuration "
        f"to exit {launched + wall - last:.1f} s; load average of the machine: {load:.1f} "
        f"before, {os.getloadavg()[0]:.1f} after; {os.cpu_count()} CPUs)",
        flush=True,
    )
    return wall, done.stderr


def frame(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "sweep.csv")


def span(df: pd.DataFrame) -> float:
    """First configuration started to last finished (the sweep without process start-up)."""
    return float((df["start_time"] + df["wall_s"]).max() - df["start_time"].min())


def same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    return a[SAME].reset_index(drop=True).equals(b[SAME].reset_index(drop=True))


def check_one_voice(out: Path, stderr: str) -> None:
    names = sorted(p.name for p in out.iterdir())
    files = len(list((out / "configs").iterdir()))
    bars = stderr.count("sweep:   0%")
    print(f"  files: {names}, configs/ holds {files}; progress bars started: {bars}")
    assert names == ["configs", "sweep.csv", "sweep.json"] and files == N and bars == 1


def timing_rounds(config: Path, work: Path, rounds: int) -> None:
    walls: dict[int, list[float]] = {1: [], 2: []}
    spans: dict[int, list[float]] = {1: [], 2: []}
    stderrs: dict[int, str] = {}
    for r in range(rounds):
        for ranks in (1, 2) if r % 2 == 0 else (2, 1):
            out = work / f"out{ranks}"
            wall, stderrs[ranks] = run(config, out, ranks)
            df = frame(out)
            walls[ranks].append(wall)
            spans[ranks].append(span(df))
            ok = int((df["status"] == "ok").sum())
            print(
                f"round {r + 1}, {ranks} rank(s): command {wall:.1f} s, sweep {span(df):.1f} s, "
                f"{ok}/{len(df)} ok, ranks in frame {sorted(set(df['rank']))}",
                flush=True,
            )
        print(
            f"round {r + 1} ratio, 2 ranks / 1 rank: command {walls[2][-1] / walls[1][-1]:.2f}, "
            f"sweep {spans[2][-1] / spans[1][-1]:.2f}",
            flush=True,
        )
        one, two = frame(work / "out1"), frame(work / "out2")
        assert len(one) == len(two) == N and same(one, two), "2 ranks differ from 1"
        check_one_voice(work / "out2", stderrs[2])
    for label, data in (("command", walls), ("sweep", spans)):
        ratios = [b / a for a, b in zip(data[1], data[2])]
        print(
            f"{label} wall time, 2 ranks / 1 rank: "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + f" (median {statistics.median(ratios):.2f}; 1 rank median "
            f"{statistics.median(data[1]):.1f} s, 2 ranks {statistics.median(data[2]):.1f} s)"
        )
    print("frames equal on every configuration and counted column: yes")


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of torchrun's worker of ``rank`` (a child whose environment says RANK=rank)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and f"RANK={rank}".encode() in env:
            return int(entry.name)
    return None


def killed_and_resumed(config: Path, work: Path, expected: pd.DataFrame) -> None:
    out = work / "killed"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.Popen(
        _command(config, out, 2),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = out / "configs"
    while proc.poll() is None:
        if folder.is_dir() and len(list(folder.glob("*.json"))) >= N // 4:
            pid = _rank_pid(proc.pid, 1)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                print(
                    f"killed rank 1 (pid {pid}) after "
                    f"{len(list(folder.glob('*.json')))} result files"
                )
                break
        time.sleep(0.05)
    proc.communicate(timeout=600)
    kept = {p.name: (p.stat().st_mtime_ns, p.read_text()) for p in folder.glob("*.json")}
    print(
        f"torchrun exit status {proc.returncode}; {len(kept)}/{N} result files kept; "
        f"sweep.csv written: {(out / 'sweep.csv').exists()}"
    )
    assert proc.returncode != 0 and 0 < len(kept) < N
    start = time.perf_counter()
    done = subprocess.run(
        _command(config, out, 2),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-4000:]
    untouched = sum(
        (folder / n).stat().st_mtime_ns == m and (folder / n).read_text() == t
        for n, (m, t) in kept.items()
    )
    resumed = frame(out)
    print(
        f"rerun: exit 0 in {wall:.1f} s, {len(resumed)} rows, {untouched}/{len(kept)} earlier "
        f"files untouched, equal to the 1-rank frame: {same(resumed, expected)}"
    )
    assert untouched == len(kept) and len(resumed) == N and same(resumed, expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/modelprof_sweep_bench"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    config = args.workdir / "vision.toml"
    config.write_text(CONFIG)
    print(
        f"{N} configurations: {len(MODELS)} models x batch {{1, 8}} x {{float32, bfloat16}}, "
        f"counting only; {os.cpu_count()} CPUs"
    )
    timing_rounds(config, args.workdir, args.rounds)
    killed_and_resumed(config, args.workdir, frame(args.workdir / "out1"))


if __name__ == "__main__":
    main()
