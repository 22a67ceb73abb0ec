"""progress_bar: tqdm only when asked for; a total (so an ETA); a no-op without tqdm."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest

from modelprof.progress import NoProgress, progress_bar


def test_progress_never_imports_tqdm_auto_or_notebook() -> None:
    # a fresh interpreter: tqdm.auto (whose import alone prints "IProgress not found" in a
    # notebook without ipywidgets) and tqdm.notebook stay unimported by compare() with progress
    # off or on (outside a notebook). torch itself imports plain tqdm (torch.hub).
    code = ("import sys, torch\nfrom modelprof import compare\n"
            "compare({'a': torch.nn.Linear(4, 4)}, (4,), timing=False)\n"
            "compare({'a': torch.nn.Linear(4, 4)}, (4,), timing=False, progress=True)\n"
            "print(sorted(m for m in sys.modules if m in ('tqdm.auto', 'tqdm.notebook',"
            " 'tqdm.autonotebook')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
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


def test_missing_tqdm_gives_a_quiet_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    bar = progress_bar(3, enabled=True)
    assert isinstance(bar, NoProgress)
    with bar:
        bar.update(2)
        bar.set_description("x")
        bar.set_postfix(batch=4)
    assert bar.n == 2
