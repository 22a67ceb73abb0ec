"""Every file of the package that the notebooks, the docs and the README cite by path exists
(quickstart.ipynb cited ``modelprof/formulas/optim.py`` after it moved under ``counting/``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CITING = sorted(
    [*ROOT.glob("notebooks/*.ipynb"), ROOT / "notebooks" / "build_notebooks.py"]
    + [*ROOT.glob("docs/*.md"), ROOT / "README.md"]
)
PATH = re.compile(r"(?<![\w./-])modelprof/[\w/]+\.py\b")


@pytest.mark.parametrize("doc", CITING, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_package_files_exist(doc):
    cited = set(PATH.findall(doc.read_text()))
    missing = sorted(p for p in cited if not (ROOT / p).is_file())
    assert not missing, f"{doc.relative_to(ROOT)} cites {missing}, which do not exist"


def test_the_check_sees_the_notebook_citation():
    text = (ROOT / "notebooks" / "quickstart.ipynb").read_text()
    assert "modelprof/counting/formulas/optim.py" in PATH.findall(text)
