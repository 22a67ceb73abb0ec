"""The suite's timing tests with both cores kept busy: pass counts per run.

    python3 benchmarks/timing_under_load.py               # 5 runs, 2 spinning processes
    python3 benchmarks/timing_under_load.py --runs 2 --spinners 2 -k layers

Starts ``--spinners`` processes that spin in pure Python (no tensor op, so they compete for the
cores only), then runs pytest on the timing test files ``--runs`` times in a row and prints, per
run, the passed/failed counts, the failing tests' names and each one's failed assertion; the
spinners are stopped at the end (and on Ctrl-C). The timing tests must hold on any 2-core machine, quiet or loaded: every run of
this script should print 0 failed.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the test files whose checks read a clock
TIMING_TESTS = (
    "tests/test_timing_*.py",
    "tests/test_step_timing.py",
    "tests/test_generation_timing.py",
    "tests/test_compare_honesty.py",
    "tests/test_cpu_clock.py",
    "tests/test_profile_timing.py",
    "tests/test_attribution.py",
    "tests/test_machine_load.py",
)


def _spin(stop: mp.Event) -> None:  # type: ignore[valid-type]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


@contextlib.contextmanager
def spinning(n: int) -> Iterator[None]:
    """``n`` processes spinning in pure Python (no tensor op: they compete for the cores only)
    while the block runs, stopped at its end (and on an error or Ctrl-C)."""
    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=5)


def _files() -> list[str]:
    out: list[str] = []
    for pattern in TIMING_TESTS:
        out += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--spinners", type=int, default=2)
    ap.add_argument("-k", default=None, help="pytest -k expression")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "pytest", "-q", "--tb=line", "-p", "no:cacheprovider", *_files()]
    if args.k:
        cmd += ["-k", args.k]
    totals = {"passed": 0, "failed": 0}
    with spinning(args.spinners):
        for run in range(1, args.runs + 1):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout
            counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error)", out)}
            failed = re.findall(r"^FAILED (\S+)", out, flags=re.M)
            why = re.findall(r"^(\S+\.py:\d+: .*)$", out, flags=re.M)  # --tb=line: the assert
            for k in totals:
                totals[k] += counts.get(k, 0)
            print(
                f"run {run}: {counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed "
                f"in {time.perf_counter() - t0:.0f} s with {args.spinners} spinning processes"
                + (": " + ", ".join(failed) if failed else ""),
                flush=True,
            )
            for line in why:
                print(f"    {line.replace(str(ROOT) + '/', '')[:300]}", flush=True)
    print(f"{totals['passed']} passed, {totals['failed']} failed")
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
