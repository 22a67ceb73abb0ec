"""Execute the example notebooks end to end (kernel ``python3``, as installed by ipykernel)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["quickstart.ipynb", "compare_architectures.ipynb", "generation.ipynb"]
)
def test_notebook_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel is a fresh process: let it import this checkout even when not pip-installed.
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + (os.pathsep + path if path else ""))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{name} is committed with outputs; rebuild it with notebooks/build_notebooks.py"
    )
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on failure
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
    # every notebook writes its exports into out/ (next to the notebook, here tmp_path)
    assert any((tmp_path / "out").iterdir())


def test_notebooks_match_their_generator() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "build_notebooks", NOTEBOOKS / "build_notebooks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in module.NOTEBOOKS:
        built = module.build(name)
        committed = nbformat.read(NOTEBOOKS / name, as_version=4)
        assert [c.source for c in committed.cells] == [c.source for c in built.cells], (
            f"{name} differs from notebooks/build_notebooks.py; run it to regenerate"
        )
