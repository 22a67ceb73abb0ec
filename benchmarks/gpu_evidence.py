"""The GPU evidence of issues 22, 31 and 36 in one command: everything modelprof claims about CUDA, run
on the GPU at hand, in 6 minutes, into files ready to commit.

    PYTHONPATH=. python3 benchmarks/gpu_evidence.py --out $OUT      # on a machine with a GPU
    PYTHONPATH=. python3 benchmarks/gpu_evidence.py --dry-run --out /tmp/ev   # CPU, CUDA faked

Sections, in the order they run: first the GPU timing issue's (``gpu_kernels.py``): K1 kernel
time of ``_sleep`` and tiny-add oracle layers, K2 kernel time per layer on resnet50 and vit_b_16
(exact sums, against a profiler-only pass mapped by op order and the first run's CUPTI column),
K3 the latency mode against the seed's loop in short paired rounds, the pipelined mode and the
stop rule's wall time, K4 ``what_helps`` with ``torch.compile``; then (``gpu_sections.py``) the
seed's recipes: 2 the timer against ``torch.cuda._sleep`` layers, 4 the seed's fixed recipe vs
the adaptive one (and a throughput search up to OOM), 5 a raw CuPy kernel with transfers, 3
events vs CUPTI kernel times and a per-module-synchronize timer; then 6 the CUDA-only formulas
vs the CPU count, 8 the training step, 9 generation, 7 tables and plots with the roofline, 1a the
``cuda``-marked tests, 1b the rest of the suite in the time left, 10 the README's GPU statements. Each section has a
time budget and a hard limit; one that fails or overruns is recorded with its traceback and the
next one runs. ``--only 2,5`` reruns some sections.

A lent GPU machine has no network: pytest and tabulate, where its Python lacks them, are
installed at the start from ``wheelhouse/`` (pure-Python wheels copied with the working tree;
``--make-wheelhouse`` fills it on a machine with network) into a temporary folder put behind
everything installed; ``evidence.json`` records what was done (``env.bootstrap``).

``--out`` receives: ``summary.md`` (PASS/FAIL per check with figures), ``evidence.json`` (all of
it), ``pytest.log``, and ``evidence-<slug>.tar.gz`` holding ``reports/validation/cuda-<slug>/``
and ``reports/<slug>/`` (extract it at the repository root: ``tar xzf ... -C .``).
``--dry-run`` runs every section on the CPU with the CUDA calls faked (``gpu_fakes.py``), tiny
models and tiny budgets, so CI can run the whole script (``tests/test_gpu_evidence.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_T0 = time.perf_counter()  # the run's clock starts before torch is imported
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
import validate_timer  # noqa: E402

from modelprof.runtime.env import collect_env  # noqa: E402

__all__ = ["Check", "Ctx", "Outcome", "Skip", "main", "run_sections"]

#: the whole run, from the start of the process, must end within this (the device call gets
#: 420 s: what is left covers the transfers and a run that overruns its last section)
TOTAL_S = 360.0
#: what the run needs and a lent GPU machine may lack (import name: pip requirement), and the
#: wheels for them (the requirements with their dependencies on Python 3.12)
BOOTSTRAP = {"pytest": "pytest", "tabulate": "tabulate"}
WHEELHOUSE = ROOT / "wheelhouse"
WHEELS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments", "tabulate")


@dataclasses.dataclass
class Check(validate_timer.Check):
    """A PASS/FAIL line; ``exact``: a count or an identity that holds on any machine (the dry
    run's test asserts those)."""

    exact: bool = False


class Skip(Exception):
    """A section (or part) that cannot run here, with the reason."""


class SectionTimeout(BaseException):
    """Raised by the alarm when a section overruns its hard limit (a BaseException, so that no
    ``except Exception`` on the way swallows it)."""


@dataclasses.dataclass
class Outcome:
    """What a section leaves behind; filled as it goes, so a failure keeps what came before."""

    checks: list[Any] = dataclasses.field(default_factory=list)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def check(
        self, name: str, passed: bool, criterion: str, /, *, exact: bool = False, **figures: Any
    ) -> None:
        self.checks.append(Check(name, bool(passed), criterion, figures, exact))


@dataclasses.dataclass
class Ctx:
    """The run: the device, dry or not, where files go, the clock of the whole run."""

    dev: torch.device
    dry: bool
    out: Path
    tree: Path
    slug: str
    env: dict[str, Any]
    deadline: float
    budget_s: float = 0.0
    section_end: float = 0.0
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: work a section started for a later one (the suite's shards, started beside 1a)
    background: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def val_dir(self) -> Path:
        name = f"cuda-{self.slug}" if not self.dry else self.slug
        return self._mk(self.tree / "reports" / "validation" / name)

    @property
    def rep_dir(self) -> Path:
        return self._mk(self.tree / "reports" / self.slug)

    @staticmethod
    def _mk(p: Path) -> Path:
        p.mkdir(parents=True, exist_ok=True)
        return p

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def section_left(self) -> float:
        """Seconds left of the running section's budget (a section with parts skips the rest
        when this is gone, so that what it did is written rather than cut off)."""
        return self.section_end - time.perf_counter()

    def timing(self, budget_s: float, **kw: Any) -> dict[str, Any]:
        """Timing options: ``budget_s`` of adaptive sampling on a GPU; five runs in a dry run."""
        if self.dry:
            return {"repeat": 5, "warmup": 1, **kw}
        return {"budget_s": budget_s, "warmup_s": 0.2, **kw}


@dataclasses.dataclass
class Section:
    key: str
    title: str
    budget_s: float
    dry_budget_s: float
    fn: Callable[[Ctx, Outcome], None]


# -- environment ---------------------------------------------------------------------------------
def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, IndexError, subprocess.SubprocessError):
        return None


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in (
        "torch",
        "torchvision",
        "transformers",
        "timm",
        "cupy-cuda12x",
        "cupy-cuda13x",
        "cupy",
        "triton",
        "onnxruntime-gpu",
        "onnxruntime",
        "numpy",
        "pandas",
        "matplotlib",
        "tabulate",
        "pytest",
        "pluggy",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def environment(dev: torch.device, dry: bool) -> dict[str, Any]:
    """modelprof's own environment record plus the driver, the packages and the command."""
    env = collect_env(dev)
    env["driver_version"] = _driver_version() if not dry else None
    env["packages"] = _versions()
    env["python_executable"] = sys.executable
    env["dry_run"] = dry
    env["command"] = " ".join(["python3", "benchmarks/gpu_evidence.py", *sys.argv[1:]])
    if dry:
        env["device_name"] = "dry run on " + str(env.get("device_name") or "CPU")
    return env


# -- what the run needs, from the wheelhouse ---------------------------------------------------
def bootstrap(
    wanted: dict[str, str] | None = None, wheelhouse: Path = WHEELHOUSE, target: Path | None = None
) -> dict[str, Any]:
    """Install the modules of ``wanted`` (import name: requirement) that this Python lacks from
    ``wheelhouse`` (no index) into ``target`` (a temporary folder by default), put behind
    everything on ``sys.path`` and on ``PYTHONPATH`` (so the pytest processes see it too);
    what was done, for the record. Never raises: a section that needs a module still missing
    says so itself."""
    wanted = BOOTSTRAP if wanted is None else wanted
    missing = [name for name in wanted if importlib.util.find_spec(name) is None]
    rec: dict[str, Any] = {"missing": missing, "wheelhouse": str(wheelhouse)}
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not missing or not wheels:
        return rec | {"action": "nothing to install" if not missing else "no wheelhouse"}
    target = target or Path(tempfile.mkdtemp(prefix="gpu-evidence-site-"))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--target",
        str(target),
        "--disable-pip-version-check",
        "-q",
        *[wanted[name] for name in missing],
    ]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        rec.update(
            command=" ".join(cmd[1:]),
            exit_code=done.returncode,
            output=(done.stdout + done.stderr)[-2000:],
        )
    except (OSError, subprocess.SubprocessError) as e:
        rec.update(command=" ".join(cmd[1:]), exit_code=None, output=f"{type(e).__name__}: {e}")
    if rec["exit_code"] != 0:  # no pip here: pure-Python wheels unpack as they install
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(target)
        rec["fallback"] = f"unzipped {len(wheels)} wheels"
    sys.path.append(str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [os.environ.get("PYTHONPATH"), str(target)])
    )
    importlib.invalidate_caches()
    rec.update(
        action="installed",
        target=str(target),
        seconds=time.perf_counter() - t0,
        importable={n: importlib.util.find_spec(n) is not None for n in missing},
    )
    return rec


def make_wheelhouse(wheelhouse: Path = WHEELHOUSE) -> int:
    """Download the wheels of ``WHEELS`` for a Python 3.12 Linux machine (no dependencies
    resolved: the list is complete for pytest and tabulate on 3.12)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
        "-d",
        str(wheelhouse),
        *WHEELS,
    ]
    return subprocess.run(cmd, check=False).returncode


# -- running sections ----------------------------------------------------------------------------
@contextlib.contextmanager
def hard_limit(seconds: float) -> Iterator[None]:
    """Raise ``SectionTimeout`` in this thread after ``seconds`` (SIGALRM; main thread only)."""
    usable = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")
    if not usable:
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise SectionTimeout(f"section over its hard limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_section(ctx: Ctx, sec: Section) -> dict[str, Any]:
    """One section under its budget; never raises (the traceback goes into the record)."""
    budget = sec.dry_budget_s if ctx.dry else sec.budget_s
    ctx.budget_s = min(budget, max(ctx.remaining(), 0.0))
    ctx.section_end = time.perf_counter() + ctx.budget_s
    outcome = Outcome()
    rec: dict[str, Any] = {"key": sec.key, "title": sec.title, "budget_s": budget}
    t0 = time.perf_counter()
    if ctx.remaining() < 5:
        rec.update(status="skipped", reason="no time left in the run")
    else:
        limit = min(1.5 * budget + 10, ctx.remaining())
        try:
            with hard_limit(limit):
                sec.fn(ctx, outcome)
            rec["status"] = "ok"
        except Skip as e:
            rec.update(status="skipped", reason=str(e))
        except SectionTimeout as e:
            rec.update(status="timeout", reason=str(e), traceback=traceback.format_exc())
        except Exception as e:  # noqa: BLE001 - one section's failure must not stop the others
            rec.update(
                status="error", reason=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()
            )
        finally:
            if torch.cuda.is_available():
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
    rec["wall_s"] = time.perf_counter() - t0
    rec["checks"] = [dataclasses.asdict(c) for c in outcome.checks]
    rec["info"] = outcome.info
    rec["notes"] = outcome.notes
    return rec


def verdict(rec: dict[str, Any]) -> str:
    """PASS (ran, every check passed), FAIL (a check failed), ERROR/TIMEOUT, SKIP, INFO."""
    st = rec["status"]
    if st in ("error", "timeout"):
        return st.upper()
    if st == "skipped":
        return "SKIP"
    if not rec["checks"]:
        return "INFO"
    return "PASS" if all(c["passed"] for c in rec["checks"]) else "FAIL"


# -- output --------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summary_md(ctx: Ctx, records: list[dict[str, Any]], wall_s: float) -> str:
    env = ctx.env
    versions = (
        f"- device `{env.get('device')}` ({env.get('device_name')}), driver "
        f"{env.get('driver_version')}, CUDA {env.get('cuda_version')}, cuDNN "
        f"{env.get('cudnn_version')}, torch {env.get('torch_version')}, Python "
        f"{env.get('python_version')}, modelprof {env.get('modelprof_version')}"
    )
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
    boot = env.get("bootstrap") or {}
    dry = " — DRY RUN: CUDA faked on the CPU, tiny models; no figure here is a GPU's"
    head = [
        f"# GPU evidence — {env.get('device_name')}",
        "",
        versions,
        f"- packages: {packages}",
        f"- from the wheelhouse: {boot.get('action')} (missing before: "
        f"{', '.join(boot.get('missing', [])) or 'none'})",
        f"- command: `{env.get('command')}`; wall time {wall_s:.0f} s{dry if ctx.dry else ''}",
        "",
        "| section | verdict | checks passed | wall s (budget) |",
        "| --- | --- | ---: | ---: |",
    ]
    for r in records:
        n_ok = sum(c["passed"] for c in r["checks"])
        head.append(
            f"| {r['key']}. {r['title']} | {verdict(r)} | {n_ok}/{len(r['checks'])} | "
            f"{r['wall_s']:.1f} ({r['budget_s']:g}) |"
        )
    body: list[str] = []
    for r in records:
        body += ["", f"## {r['key']}. {r['title']}: {verdict(r)}", ""]
        if r.get("reason"):
            body.append(f"{r['status']}: {r['reason']}")
            body.append("")
        for c in r["checks"]:
            figs = ", ".join(f"{k} {_fmt(v)}" for k, v in c["figures"].items())
            body.append(
                f"- {'PASS' if c['passed'] else '**FAIL**'} {c['name']}: {figs} [{c['criterion']}]"
            )
        body += [f"- note: {n}" for n in r["notes"]]
        if r.get("traceback"):
            body += ["", "```", r["traceback"].rstrip()[-3000:], "```"]
    return "\n".join(head + body) + "\n"


def write_outputs(ctx: Ctx, records: list[dict[str, Any]], wall_s: float) -> None:
    """summary.md + evidence.json (in --out and in the validation folder) and the tarball."""
    result = {"env": ctx.env, "wall_s": wall_s, "sections": records}
    text = json.dumps(result, indent=1, default=str)
    md = summary_md(ctx, records, wall_s)
    for d in (ctx.out, ctx.val_dir):
        (d / "evidence.json").write_text(text)
        (d / ("summary.md" if d == ctx.out else "README.md")).write_text(md)
    log = ctx.val_dir / "pytest.log"
    if log.exists():
        shutil.copyfile(log, ctx.out / "pytest.log")
    tmp = ctx.out / f".evidence-{ctx.slug}.tar.gz"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(ctx.tree / "reports", arcname="reports")
    tmp.replace(ctx.out / f"evidence-{ctx.slug}.tar.gz")


def run_sections(
    ctx: Ctx,
    sections: list[Section],
    only: set[str] | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every section in turn (or those of ``only``), outputs rewritten after each."""
    t0 = _T0  # the log's times are the process's
    records = ctx.records
    chosen = [sec for sec in sections if not only or sec.key in only]
    ctx.background["run_suite"] = any(sec.key == "1b" for sec in chosen)
    try:
        for sec in chosen:
            _run_one(ctx, sec, t0, log)
    finally:
        _stop_background(ctx)
    return records


def _run_one(ctx: Ctx, sec: Section, t0: float, log: Callable[[str], None]) -> None:
    """One section, logged, and the files rewritten after it (a killed run keeps what it has)."""
    log(f"[{time.perf_counter() - t0:6.1f} s] section {sec.key}: {sec.title}")
    rec = run_section(ctx, sec)
    ctx.records.append(rec)
    n_ok = sum(c["passed"] for c in rec["checks"])
    log(
        f"[{time.perf_counter() - t0:6.1f} s]   {verdict(rec)} ({n_ok}/{len(rec['checks'])}"
        f" checks, {rec['wall_s']:.1f} s){': ' + rec['reason'] if rec.get('reason') else ''}"
    )
    write_outputs(ctx, ctx.records, time.perf_counter() - t0)


def _stop_background(ctx: Ctx) -> None:
    """Kill what a section started for a later one that did not run (the suite's shards)."""
    procs = (ctx.background.pop("suite", None) or ([],))[0]
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def make_ctx(
    dry: bool, out: Path, device: str | None, total_s: float, boot: dict[str, Any] | None = None
) -> Ctx:
    if dry:
        dev = torch.device("cpu")
    else:
        dev = torch.device(device or "cuda")
        if dev.type != "cuda" or not torch.cuda.is_available():
            raise SystemExit(f"no CUDA device here (device={dev}); use --dry-run on a CPU")
    env = environment(dev, dry)
    env["bootstrap"] = boot
    slug = "dry-run-cpu" if dry else _slug(torch.cuda.get_device_name(dev))
    out.mkdir(parents=True, exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="gpu-evidence-"))
    return Ctx(dev=dev, dry=dry, out=out, tree=tree, slug=slug, env=env, deadline=_T0 + total_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default: $OUT)")
    ap.add_argument(
        "--dry-run", action="store_true", help="CPU only, CUDA faked, tiny models and budgets"
    )
    ap.add_argument("--device", default=None, help="cuda[:i] (default cuda)")
    ap.add_argument("--only", default="", help="comma-separated section keys, e.g. 2,5")
    ap.add_argument(
        "--total-s",
        type=float,
        default=None,
        help=f"time for the whole run (default {TOTAL_S:g} s; dry run 240 s)",
    )
    ap.add_argument(
        "--make-wheelhouse",
        action="store_true",
        help=f"download the wheels the run may need into {WHEELHOUSE} and stop",
    )
    args = ap.parse_args(argv)
    if args.make_wheelhouse:
        return make_wheelhouse()
    if not args.out:
        ap.error("--out (or $OUT) is required")
    boot = bootstrap()
    from gpu_kernels import KERNEL_SECTIONS
    from gpu_sections import SECTIONS

    SECTIONS = KERNEL_SECTIONS + SECTIONS  # the GPU timing issue's sections first
    total = args.total_s or (240.0 if args.dry_run else TOTAL_S)
    ctx = make_ctx(args.dry_run, Path(args.out), args.device, total, boot)
    only = set(filter(None, args.only.split(","))) or None
    print(
        f"GPU evidence on {ctx.env.get('device_name')} ({ctx.dev}), torch "
        f"{torch.__version__}, into {ctx.out}; wheelhouse: {boot['action']}",
        flush=True,
    )
    try:
        if ctx.dry:
            from gpu_fakes import fake_cuda

            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # intra-op threads stall badly on a loaded CI machine
            try:
                with fake_cuda():
                    records = run_sections(ctx, SECTIONS, only)
            finally:
                torch.set_num_threads(threads)
        else:
            records = run_sections(ctx, SECTIONS, only)
    finally:
        shutil.rmtree(ctx.tree, ignore_errors=True)
    bad = [r["key"] for r in records if verdict(r) in ("FAIL", "ERROR", "TIMEOUT")]
    print(
        f"wrote {ctx.out}/summary.md, evidence.json, evidence-{ctx.slug}.tar.gz; "
        f"not passed: {bad or 'none'}",
        flush=True,
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.modules.setdefault("gpu_evidence", sys.modules["__main__"])  # one copy of its classes
    raise SystemExit(main())
