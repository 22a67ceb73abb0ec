"""``Report.to_trace``: the per-layer timeline in the Trace Event Format (Perfetto,
chrome://tracing), validated as the viewers read it: every slice has ph/ts/dur/pid/tid, one
track per pass, children nested in their parents."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.errors import ModelProfError
from modelprof.render.trace import PassTimeline, trace_document, validate_trace


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) + x


def _model() -> nn.Module:
    return nn.Sequential(Block(), Block(), nn.Linear(8, 2))


def test_forward_trace_one_track_per_pass_nested_with_costs() -> None:
    r = profile(_model(), (8,), repeat=4, warmup=1, roofline=False)
    doc = json.loads(r.to_trace())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for e in slices:
        assert {"ph", "ts", "dur", "pid", "tid", "name"} <= set(e)
    # 4 passes, each: the pass slice + 8 calls (root, 2 x (block, fc, act), final linear)
    assert validate_trace(doc) == 4 * (1 + 8)
    assert {e["tid"] for e in slices} == {1, 2, 3, 4}
    threads = [e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"]
    assert threads == [f"forward pass {p}" for p in range(1, 5)]
    fc = next(e for e in slices if e["name"] == "0.fc")
    assert fc["args"]["macs"] == 64 and fc["args"]["params"] == 72  # 8*8, 8*8 + 8
    block = next(e for e in slices if e["name"] == "0" and e["tid"] == fc["tid"])
    assert block["ts"] <= fc["ts"] and fc["ts"] + fc["dur"] <= block["ts"] + block["dur"]
    assert json.loads(r.to_trace(max_passes=2))["traceEvents"][-1]["tid"] == 2


def test_validator_reads_a_trace_file_by_its_path(tmp_path) -> None:
    r = profile(_model(), (8,), repeat=2, warmup=1, roofline=False)
    path = r.to_trace(tmp_path / "t.json")
    assert validate_trace(path) == validate_trace(str(path)) == 2 * (1 + 8)  # as above
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ModelProfError, match="bad.json' cannot be read as JSON"):
        validate_trace(tmp_path / "bad.json")
    with pytest.raises(ModelProfError, match="in the list given"):
        validate_trace([])


def test_training_step_trace_has_a_backward_process() -> None:
    r = profile(_model(), (8,), batch_size=2, repeat=3, warmup=1, roofline=False, backward=True)
    doc = json.loads(r.to_trace())
    validate_trace(doc)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"forward", "backward"}
    backward = [
        e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 2 and e["cat"] == "backward"
    ]
    assert backward[0]["name"] == "(loss)"  # autograd starts at the loss
    assert {"2", "0.fc", "1.fc"} <= {e["name"] for e in backward}
    assert next(e for e in backward if e["name"] == "2")["args"]["backward_macs"] == 64
    # Linear(8, 2) at batch 2: input grad 2*2*8 + weight grad 2*8*2 = 32 + 32


def test_validator_catches_what_viewers_reject() -> None:
    t = PassTimeline("pass 1", 10.0)
    t.add("parent", 1.0, 5.0, {})
    t.add("child", 2.0, 6.0, {})  # ends at 8, after its parent's 6
    with pytest.raises(ModelProfError, match="crosses the end of 'parent'"):
        validate_trace(trace_document({"forward": [t]}))
    with pytest.raises(ModelProfError, match="lacks"):
        validate_trace({"traceEvents": [{"ph": "X", "name": "x", "ts": 0, "pid": 1}]})


def test_untimed_report_has_no_trace() -> None:
    with pytest.raises(ModelProfError, match="timing=True"):
        profile(_model(), (8,), timing=False).to_trace()


def test_local_html_view_draws_every_slice_by_track() -> None:
    from modelprof.render.trace import trace_html

    parent = PassTimeline("forward pass 1", 10.0)
    parent.add("(root)", 0.5, 9.0, {"type": "Net"})
    parent.add("fc", 1.0, 4.0, {"type": "Linear"})
    page = trace_html(trace_document({"forward": [parent]}), width_px=1020)
    assert page.count('class="s"') == 3  # pass, (root), fc
    assert "forward / forward pass 1" in page
    # 1000 px for the 10 ms pass: fc starts at 10 + 1 ms * 100 px/ms, 400 px wide, depth 2
    assert "left:110.0px;top:60px;width:400.0px" in page
