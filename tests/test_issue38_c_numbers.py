"""Large numbers print in units in every human table, whatever the column is called (issue 38
item 16: an MFU table printed 29025173504.00; a generation summary's prefill MACs 1702400)."""

from __future__ import annotations

import pandas as pd

from modelprof.render.text import to_text
from modelprof.render.views import column_spec


def test_a_count_named_by_its_kind_is_a_count():
    # prefill_macs, decode_flops, total_params: the last word is a declared count column
    assert column_spec("prefill_macs").kind == "count"
    assert column_spec("prefill_macs").header == "prefill MACs"
    assert column_spec("decode_flops").header == "decode FLOPs"
    frame = pd.DataFrame({"prefill_macs": [29025173504, 1702400], "decode_flops": [1.5e9, 3.0]})
    text = to_text(frame, show_totals=False)
    assert "29.03 G" in text and "1.70 M" in text and "1.50 G" in text
    assert "29025173504" not in text and "1702400" not in text


def test_a_large_number_of_no_known_kind_is_in_units():
    frame = pd.DataFrame({"work": [29025173504.0, 12.5], "rate": [3.25, 1.0]})
    text = to_text(frame, show_totals=False)
    assert "29.03 G" in text and "12.50" in text and "3.25" in text
    assert "29025173504.00" not in text
