"""Every example in README.md runs, at small sizes.

The README's ```python and ```bash blocks are taken as they are, with only these changes so the
suite stays fast on a small CPU (each is asserted to have applied, so a README edit cannot
silently make a test run at full size or skip an example):

- image sizes 224 x 224 become 64 x 64 (in Python code; for CLI commands an ``--input-size
  3,64,64`` is added unless the command gives one or profiles a ViT, whose size is fixed);
- timing budgets shrink: ``budget_s=0.3`` for ``profile``/``compare``/``measure_latency`` in
  Python, ``--budget 0.3`` for timed CLI commands, and throughput searches stop at batch 2;
- ``pip install`` lines are not run (the extras they name are checked against pyproject.toml;
  a fresh virtual environment runs them for real, see reports/first_run/).

A Python block whose first line is ``# name.py`` is a file the next commands use: it is written
into the working directory instead of being run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

# Run before each Python block: smaller budgets as defaults the block can still override.
PRELUDE = textwrap.dedent("""
    import functools
    import matplotlib
    matplotlib.use("Agg")
    import modelprof

    def _small(fn, **defaults):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for key, value in defaults.items():
                kwargs.setdefault(key, value)
            return fn(*args, **kwargs)
        return wrapper

    modelprof.profile = _small(modelprof.profile, budget_s=0.3)
    modelprof.compare = _small(modelprof.compare, budget_s=0.3)
    modelprof.measure_latency = _small(modelprof.measure_latency, budget_s=0.3)
    modelprof.measure_throughput = _small(modelprof.measure_throughput, budget_s=0.2)
""")

PY_SIZES = (
    ("(3, 224, 224)", "(3, 64, 64)"),
    ("(1, 3, 224, 224)", "(1, 3, 64, 64)"),
    ("max_batch=16", "max_batch=2"),
)


def _blocks() -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in BLOCK.findall(README.read_text(encoding="utf-8"))]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["MPLBACKEND"] = "Agg"
    return env


def _shrink_python(code: str) -> str:
    small = code
    for old, new in PY_SIZES:
        small = small.replace(old, new)
    if "224" in small:
        raise AssertionError(f"a README block keeps a 224 size the test cannot shrink:\n{code}")
    return small


def _shrink_cli(args: list[str]) -> list[str]:
    args = list(args)
    if "--max-batch" in args:
        args[args.index("--max-batch") + 1] = "2"
    command = args[0] if args else ""
    if command in ("profile", "compare", "throughput") and "--no-timing" not in args:
        args += ["--budget", "0.3"]
    given_inputs = any(a in ("--input-size", "--tokens", "--input") for a in args)
    if (
        command in ("profile", "compare", "throughput")
        and not given_inputs
        and not any(a.startswith("vit") for a in args)
    ):
        args += ["--input-size", "3,64,64"]
    return args


def _commands(body: str) -> list[list[str]]:
    """Shell lines of a bash block, split at ``&&``, comments dropped."""
    out = []
    for line in body.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in line.split("&&"):
            out.append(shlex.split(part.strip()))
    return out


def test_the_readme_has_the_examples_this_test_expects() -> None:
    langs = [lang for lang, _ in _blocks()]
    assert set(langs) <= {"python", "bash"}, langs
    assert langs.count("python") >= 3 and langs.count("bash") >= 3
    text = README.read_text(encoding="utf-8")
    for title in ("## How precise are the timings?", "## What does a training step cost?"):
        assert title in text


def test_the_readme_starts_with_the_two_commands_a_new_user_runs() -> None:
    """The first block installs and profiles a real model; the second installs the test extras
    and runs the tests, the same command as CI's script (.ci/run)."""
    blocks = [body for lang, body in _blocks() if lang == "bash"]
    assert _commands(blocks[0]) == [
        ["pip", "install", "-e", ".[all]"],
        ["modelprof", "profile", "resnet18"],
    ]
    test_command = _commands(blocks[1])
    assert test_command == [
        ["pip", "install", "-c", "constraints.txt", "-e", ".[test]"],
        ["python", "-m", "pytest", "-q"],
    ]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # CI runs the same two steps (as python3, quietly)
    assert 'pip install -q -c constraints.txt -e ".[test]"' in ci
    assert "python3 -m pytest -q" in ci
    text = README.read_text(encoding="utf-8")
    assert text.index(blocks[1]) < text.index("## A 30-second tour")
    assert "nbconvert" in text


def test_the_install_command_installs_what_the_readme_uses() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    installs = [c for _, body in _blocks() for c in _commands(body) if c[:2] == ["pip", "install"]]
    assert installs, "the README has no install command"
    first = installs[0]
    spec = next(a for a in first if a.startswith(".["))
    names = spec[2:-1].split(",")
    wanted = {re.split(r"[<>=]", d)[0] for n in names for d in extras[n]}
    # the tour plots (matplotlib), prints Markdown (tabulate), builds torchvision models and the
    # CLI shows progress bars (tqdm)
    assert {"matplotlib", "tabulate", "torchvision", "tqdm"} <= wanted


@pytest.mark.slow
def test_every_readme_example_runs(tmp_path: Path) -> None:
    env = _env()
    ran = 0
    for lang, body in _blocks():
        if lang == "python":
            first = body.splitlines()[0]
            match = re.fullmatch(r"# ([\w./-]+\.py)", first.strip())
            if match:  # a file the following commands use
                (tmp_path / match.group(1)).write_text(body, encoding="utf-8")
                continue
            code = PRELUDE + _shrink_python(body)
            run = subprocess.run(
                [sys.executable, "-c", code],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert run.returncode == 0, f"README block failed:\n{body}\n{run.stderr[-4000:]}"
            ran += 1
            continue
        for command in _commands(body):
            if command[:2] == ["pip", "install"]:
                continue  # see test_the_install_command_installs_what_the_readme_uses
            if command[:3] == ["python", "-m", "pytest"]:
                continue  # the suite itself: see test_the_readme_test_command_is_what_ci_runs
            assert command[0] == "modelprof", command
            args = _shrink_cli(command[1:])
            run = subprocess.run(
                [sys.executable, "-m", "modelprof", *args],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert run.returncode == 0, f"{shlex.join(command)} failed:\n{run.stderr[-4000:]}"
            assert run.stdout.strip(), f"{shlex.join(command)} printed nothing"
            assert "Traceback" not in run.stderr
            ran += 1
    assert ran >= 9  # the Python blocks, modelprof profile resnet18 and the CLI examples
    # what the examples promise to write
    for name in (
        "resnet18.csv",
        "resnet18.tex",
        "resnet18.html",
        "resnet18_latency.png",
        "resnet18_roofline.png",
        "comparison.tex",
    ):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
    written = {p.name for p in (tmp_path / "out").iterdir()}
    # --format csv,md,tex,html,json,png on resnet18 (ResNet's files are named after the spec)
    assert {"resnet18.md", "resnet18.json", "resnet18_flops.png"} <= written


def test_every_view_option_is_documented() -> None:
    """Each keyword a user can pass to an exporter has a line in the README's options table."""
    import dataclasses

    from modelprof import ViewOptions

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Views and exporters") : text.index("## How precise")]
    # every exporter reads its options from ViewOptions (view= or the same keywords); the
    # page's title and summary lines are filled in by the Report from the model
    internal = {"title", "summary"}
    options = {f.name for f in dataclasses.fields(ViewOptions)} - internal | {"view"}
    assert {"columns", "depth", "top_k", "caption", "label", "units", "group_by"} <= options
    missing = sorted(o for o in options if f"`{o}=" not in section)
    assert not missing, f"view options not in the README's table: {missing}"


def test_every_column_of_a_timed_frame_has_a_row_in_the_readme_table() -> None:
    """Each column ``to_dataframe()`` gives a timed CPU profile, against roofs a busy probe
    measured (so the loaded flags are there too), is named in the first cell of a row of the
    README's column table (a trial found output_shape defined nowhere, mfu and
    efficiency_loaded only in docs/)."""
    from torch import nn

    from modelprof import Peaks, profile

    # wall 3x the CPU time: a probe on a busy machine (Peaks.loaded), as the trial's was
    busy = Peaks(peak_flops=1e9, peak_bytes=1e9, source="probe", wall_over_cpu=3.0)
    assert busy.loaded
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    df = profile(model, (8,), repeat=3, warmup=1, roofline=busy, warn=False).to_dataframe()
    assert {"output_shape", "latency_passes", "mfu_rough", "efficiency_loaded"} <= set(df)
    text = README.read_text(encoding="utf-8")
    section = text[
        text.index("## What the columns mean") : text.index("\n## ", text.index("## What"))
    ]
    firsts = [ln.split("|")[1] for ln in section.splitlines() if ln.startswith("| `")]
    named = set(re.findall(r"`(\w+)`", " ".join(firsts)))
    missing = [c for c in df.columns if c not in named]
    assert not missing, f"columns without a row in the README's column table: {missing}"


def test_the_readme_tour_imports_only_what_its_install_gives() -> None:
    """Every module a README Python block imports comes with the first install command."""
    import ast

    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    first = next(c for _, body in _blocks() for c in _commands(body) if c[:2] == ["pip", "install"])
    extras = next(a for a in first if a.startswith(".["))[2:-1].split(",")
    given = {re.split(r"[<>=\[ ]", d)[0] for d in project["dependencies"]}
    given |= {
        re.split(r"[<>=\[ ]", d)[0] for e in extras for d in project["optional-dependencies"][e]
    }
    imported = set()
    for lang, body in _blocks():
        if lang != "python":
            continue
        for node in ast.walk(ast.parse(body)):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
    stdlib = {m for m in imported if m in sys.stdlib_module_names}
    third_party = imported - stdlib - {"modelprof"}
    assert {"torch", "torchvision"} <= third_party  # what the tour imports today
    assert third_party <= given, (
        f"imported by the README, not installed by {first}: {sorted(third_party - given)}"
    )


def test_the_readme_imports_what_its_recipes_call() -> None:
    """The training-throughput recipe's step_measure and StepSpec are imported in a Python
    block (they live in modelprof.step.throughput and modelprof.step.spec, not modelprof.step,
    which a reader guessed), and every name the blocks import from modelprof is there."""
    import ast
    import importlib

    imported: dict[str, str] = {}
    for lang, body in _blocks():
        if lang != "python":
            continue
        for node in ast.walk(ast.parse(body)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("modelprof"):
                imported |= {a.name: node.module for a in node.names}
    assert {"step_measure", "StepSpec"} <= imported.keys(), sorted(imported)
    for name, module in imported.items():
        assert hasattr(importlib.import_module(module), name), f"from {module} import {name}"
