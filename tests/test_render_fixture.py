"""A small synthetic report table following the Report.to_dataframe() contract, shared by the
render, roofline and plot tests (imported as ``test_render_fixture``), and checks of its invariants.

The model it describes (input 1x3x8x8, float32):
    conv1  Conv2d(3, 4, 3, padding=1, bias=False) -> 1x4x8x8
    bn1    BatchNorm2d(4)
    relu   ReLU, called twice (call 1 after bn1, call 2 at the end)
    layer1 Sequential(Conv2d(4, 2, 1), ReLU) plus an add it runs itself (the "layer1.(self)" row)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = [
    "module",
    "type",
    "call",
    "depth",
    "leaf",
    "input_shape",
    "output_shape",
    "params",
    "macs",
    "flops",
    "madd",
    "output_bytes",
    "read_bytes",
    "write_bytes",
    "latency_ms",
    "latency_std_ms",
    "latency_pct",
    "peak_memory_bytes",
]
ADDITIVE = ["params", "macs", "flops", "madd", "output_bytes", "read_bytes", "write_bytes"]
END_TO_END_MS = 1.0

# Leaf rows: (module, type, call, depth, input, output, params, macs, flops, madd, out, read, write,
#             latency_ms, std_ms)
_LEAVES = {
    # conv1: params 3*4*3*3 = 108; macs 4*8*8 * 3*3*3 = 6912; flops 2*6912 = 13824;
    # madd (2*27-1)*256 = 13568; out 256*4 = 1024 B; read (192 + 108)*4 = 1200 B
    "conv1": (
        "Conv2d",
        1,
        1,
        "1x3x8x8",
        "1x4x8x8",
        108,
        6912,
        13824,
        13568,
        1024,
        1200,
        1024,
        0.3,
        0.01,
    ),
    # bn1: params 2*4 = 8; read (256 + 8)*4 = 1056
    "bn1": (
        "BatchNorm2d",
        1,
        1,
        "1x4x8x8",
        "1x4x8x8",
        8,
        0,
        1024,
        1024,
        1024,
        1056,
        1024,
        0.1,
        0.005,
    ),
    "relu#1": ("ReLU", 1, 1, "1x4x8x8", "1x4x8x8", 0, 0, 256, 256, 1024, 1024, 1024, 0.05, 0.002),
    # layer1.0: params 4*2 + 2 = 10; macs 2*64*4 = 512; flops 2*512 + 128 (bias) = 1152
    "layer1.0": (
        "Conv2d",
        1,
        2,
        "1x4x8x8",
        "1x2x8x8",
        10,
        512,
        1152,
        1024,
        512,
        1064,
        512,
        0.2,
        0.008,
    ),
    "layer1.1": ("ReLU", 1, 2, "1x2x8x8", "1x2x8x8", 0, 0, 128, 128, 512, 512, 512, 0.05, 0.001),
    "layer1.(self)": (
        "(self)",
        1,
        2,
        "1x2x8x8, 1x2x8x8",
        "1x2x8x8",
        0,
        0,
        128,
        128,
        512,
        1024,
        512,
        0.1,
        0.004,
    ),
    "relu#2": ("ReLU", 2, 1, "1x2x8x8", "1x2x8x8", 0, 0, 128, 128, 512, 512, 512, 0.05, 0.001),
}


def _leaf_row(key: str) -> dict:
    t, call, depth, i, o, p, macs, flops, madd, ob, rb, wb, lat, std = _LEAVES[key]
    name = key.split("#")[0]
    return dict(
        module=name,
        type=t,
        call=call,
        depth=depth,
        leaf=True,
        input_shape=i,
        output_shape=o,
        params=p,
        macs=macs,
        flops=flops,
        madd=madd,
        output_bytes=ob,
        read_bytes=rb,
        write_bytes=wb,
        latency_ms=lat,
        latency_std_ms=std,
    )


def _parent_row(
    name: str,
    type_: str,
    depth: int,
    children: list[dict],
    i: str,
    o: str,
    latency: float,
    std: float,
) -> dict:
    row = dict(
        module=name,
        type=type_,
        call=1,
        depth=depth,
        leaf=False,
        input_shape=i,
        output_shape=o,
        latency_ms=latency,
        latency_std_ms=std,
    )
    for c in ADDITIVE:
        row[c] = sum(ch[c] for ch in children)
    return row


def report_frame(*, timed: bool = True) -> pd.DataFrame:
    """The modelprof-style table in execution order (parents before their children)."""
    leaves = {k: _leaf_row(k) for k in _LEAVES}
    layer1_children = [leaves["layer1.0"], leaves["layer1.1"], leaves["layer1.(self)"]]
    layer1 = _parent_row(
        "layer1", "Sequential", 1, layer1_children, "1x4x8x8", "1x2x8x8", 0.4, 0.01
    )
    root = _parent_row(
        "", "Net", 0, list(leaves.values()), "1x3x8x8", "1x2x8x8", END_TO_END_MS, 0.02
    )
    order = [
        root,
        leaves["conv1"],
        leaves["bn1"],
        leaves["relu#1"],
        layer1,
        *layer1_children,
        leaves["relu#2"],
    ]
    df = pd.DataFrame(order)
    df["latency_pct"] = df["latency_ms"] / END_TO_END_MS * 100.0
    df["peak_memory_bytes"] = np.nan
    df = df[COLUMNS]
    if not timed:
        df = df.drop(columns=["latency_ms", "latency_std_ms", "latency_pct", "peak_memory_bytes"])
    return df


def report_totals() -> dict[str, int]:
    """Report.totals of the fixture model."""
    # params 108 + 8 + 10 = 126; macs 6912 + 512 = 7424; flops 13824+1024+256+1152+128+128+128 = 16640
    return {
        "params": 126,
        "macs": 7424,
        "flops": 16640,
        "madd": 16256,
        "output_bytes": 5120,
        "read_bytes": 6392,
        "write_bytes": 5120,
    }


def test_fixture_leaf_rows_add_up_to_totals() -> None:
    df = report_frame()
    leaves = df[df["leaf"]]
    for column, total in report_totals().items():
        assert leaves[column].sum() == total, column
    assert (df.loc[df["module"] == "", ADDITIVE].iloc[0] == pd.Series(report_totals())).all()


def test_fixture_follows_the_contract_columns_and_dtypes() -> None:
    df = report_frame()
    assert list(df.columns) == COLUMNS
    assert df["leaf"].dtype == bool
    assert df["params"].dtype == np.int64 and df["latency_ms"].dtype == np.float64
    assert df["module"].iloc[0] == ""
    # relu runs twice: call indices 1 and 2
    assert df.loc[df["module"] == "relu", "call"].tolist() == [1, 2]
