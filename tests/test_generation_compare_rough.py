"""A generation comparison marks a model's own TTFT, TPOT and end to end where its report's
summary would (``ttft_rough``...: read on a loaded machine or from too few runs), as compare()
marks ``latency_rough``: its Markdown printed a loaded model's wall figures bare, ``~`` on its
ratios alone. The load is a made-up Measurement's (another core's worth of work beside it),
not the machine's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from modelprof.generation.compare import _table
from modelprof.render import read_csv
from modelprof.report.comparison import Comparison
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions

FLAGS = ["ttft_rough", "tpot_rough", "end_to_end_rough"]


def _read(wall: float, competing: float) -> Measurement:
    # 10 runs in 5 blocks of 2, wall +-5 % about ``wall``, CPU work = wall
    return Measurement(
        np.linspace(0.95, 1.05, 10) * wall,
        cpu_ms=np.linspace(0.95, 1.05, 10) * wall,
        cpu_clock="thread_time",
        competing_cores=competing,
        blocks=np.repeat(np.arange(5), 2),
    )


def _timing(ttft: Measurement, tpot: Measurement) -> SimpleNamespace:
    summary = {"ttft_ms": ttft.median_ms, "tpot_ms": tpot.median_ms, "end_to_end_ms": 3.0}
    return SimpleNamespace(end_to_end=ttft, ttft=ttft, tpot=tpot, summary=lambda: summary)


def _row(text: str, model: str) -> str:
    (line,) = [line for line in text.splitlines() if line.lstrip("| ").startswith(f"{model} ")]
    return line


def test_a_loaded_models_ttft_and_tpot_are_marked_in_every_export(tmp_path):
    quiet, busy = _read(2.0, 0.0), _read(2.0, 1.0)  # busy: another core's worth of work beside
    assert busy.loaded and not quiet.loaded and not busy.undersampled
    lms = [("spared", None, None, 0), ("hit", None, None, 0)]
    df = _table(lms, [_timing(quiet, quiet), _timing(quiet, busy)], TimingOptions())
    # hit's TPOT loaded: no figure to quote, as its report's summary says (tpot_rough); its
    # TTFT and end to end were quiet; spared's none
    assert df[FLAGS].astype(bool).values.tolist() == [[False, False, False], [False, True, False]]
    # (the words a report's end-to-end row gives: measurement.unquotable)
    loaded = "the machine was loaded (quote the CPU work)"
    assert df.attrs["unquotable_generation"] == {"hit TPOT": loaded}
    table = Comparison(df)
    table.attrs = dict(df.attrs, baseline="spared")
    columns = ["model", "ttft_ms", "tpot_ms"]
    legend = f"marked ~ are no figure to quote: hit TPOT ({loaded})"
    for fmt in ("text", "markdown"):
        out = str(table.render.export(fmt, columns=columns)).replace("\\~", "~")
        # hit's TPOT alone marked (its TTFT and spared's figures bare)
        assert _row(out, "hit").count("~") == 1 and "~" not in _row(out, "spared"), out
        assert legend in out, fmt
    tex = str(table.render.to_latex(columns=columns, width=None))
    assert _row(tex, "hit").count("\\textcolor{gray}{\\textasciitilde{}") == 1
    assert "textcolor" not in _row(tex, "spared") and "no figure to quote: hit TPOT" in tex
    assert str(table.render.to_html(columns=columns)).count('class="r rough"') == 1
    # the flags go to a file and read back as they were
    back = read_csv(table.render.to_csv(tmp_path / "g.csv")).set_index("model")
    got, want = back[FLAGS].astype(bool), pd.DataFrame(df)[FLAGS].astype(bool)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert back["tpot_rough"].dtype == bool
