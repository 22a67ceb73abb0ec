"""One registry of table formats: every exporter is one registered function, and a format
registered once is what Report, Comparison, GenerationReport and the command line write."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from torch import nn

from modelprof import ModelProfError, ViewOptions, compare, profile, profile_generation
from modelprof.cli import main
from modelprof.render import formats, read_json
from modelprof.render.formats import Format, get_format, register_format, table_formats


def test_every_exporter_is_registered_once_by_name_and_suffix():
    names = {f.name: f.suffix for f in table_formats()}
    assert names == {
        "csv": "csv",
        "json": "json",
        "markdown": "md",
        "latex": "tex",
        "html": "html",
        "text": "txt",
    }
    assert get_format("md") is get_format("Markdown") is get_format(".md")
    assert get_format("htm").name == "html"
    with pytest.raises(ModelProfError, match="format 'yaml' is not one of"):
        get_format("yaml")
    with pytest.raises(ModelProfError, match="'csv' names a registered format"):
        register_format("comma", suffix="csv", human=False)(lambda *a, **k: "")


def _yaml(df, totals=None, *, end_to_end=None, env=None, path=None, view=None, **options):
    """A format added in one place: every cell as ``column: value`` lines."""
    lines = [f"{c}: {v}" for row in df.to_dict(orient="records") for c, v in row.items()]
    text = "\n".join(lines + [f"total_{k}: {v}" for k, v in (totals or {}).items()]) + "\n"
    if path is None:
        return text
    Path(path).write_text(text)
    return Path(path)


@pytest.fixture
def yaml_format(monkeypatch):
    monkeypatch.setitem(formats._FORMATS, "yaml", Format("yaml", "yml", _yaml, human=False))


def test_a_registered_format_is_written_by_every_result(yaml_format, tmp_path):
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU())
    report = profile(model, (10,), timing=False)
    text = report.export("yaml")
    assert "macs: 200" in text and "total_macs: 200" in text  # Linear(10, 20): 10*20
    table = compare({"a": model, "b": nn.Linear(10, 40)}, (10,), timing=False)
    assert "macs: 400" in table.render.to_yaml()  # Linear(10, 40): 10*40
    assert table.render.export("yml", tmp_path / "c.yml").read_text().startswith("input_shape")
    with pytest.raises(AttributeError):
        table.render.to_nothing_registered
    # a report reaches it as it reaches the built-in ones: to_<name>, documented by the format
    assert report.to_yaml() == text and report.to_yaml(tmp_path / "r.yml") == tmp_path / "r.yml"
    assert "to_yaml" in dir(report) and "to_csv" in dir(report)
    assert report.to_yaml.__doc__ == _yaml.__doc__
    assert report.to_latex.__doc__ == get_format("latex").doc
    # the formats registered when a result class is defined are its methods, for help()
    assert type(report).to_csv.__doc__ == get_format("csv").doc
    with pytest.raises(
        AttributeError, match="no format 'nothing_registered' is registered.*to_csv"
    ):
        report.to_nothing_registered
    assert not hasattr(report, "to_nothing_registered")  # still an AttributeError for getattr


def _tiny_gpt2():
    """A one-layer GPT-2 of width 16, random weights."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=32,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_a_generation_report_writes_every_registered_format(yaml_format, tmp_path):
    model = _tiny_gpt2()
    report = profile_generation(model, prompt_len=4, new_tokens=2, batch_size=[1, 2], timing=False)
    # the per-layer table of every phase (prefill, then a decode step per context) of both batch
    # sizes (a newcomer's exports held the first alone, with no column saying which it was)
    assert report.to_yaml().count("phase: prefill") == 2 * len(report.prefill().report.rows)
    one, two = (report.to_dataframe(batch_size=b) for b in (1, 2))
    every = report.to_dataframe()
    assert list(every["batch_size"].unique()) == [1, 2] and len(every) == len(one) + len(two)
    pd.testing.assert_frame_equal(every[every["batch_size"] == 2].reset_index(drop=True), two)
    assert two["macs"].sum() == 2 * one["macs"].sum()  # batch 2 counts twice the MACs
    assert report.to_csv(batch_size=1) != report.export("csv")
    assert "<!DOCTYPE html>" in report.to_html()
    # Markdown stays the whole report, written where asked; JSON is the registry's: the table
    # reads back as it was, the rest of the report beside it
    assert report.to_markdown(tmp_path / "g.md").read_text().startswith("# ")
    rows, totals, rest = read_json(report.to_json(tmp_path / "g.json"))
    pd.testing.assert_frame_equal(rows, report.to_dataframe())
    assert totals is None and rest["spec"]["prompt_len"] == 4
    # 2 new tokens: the first from the prefill, the second from one decode step; per batch size
    phases = [(p["phase"], p["batch_size"]) for p in rest["phases"]]
    assert phases == [("prefill", 1), ("decode", 1), ("prefill", 2), ("decode", 2)]


def test_a_generation_report_takes_the_view_options_every_exporter_takes():
    report = profile_generation(_tiny_gpt2(), prompt_len=4, new_tokens=2, timing=False)
    # depth=0: each phase's root row alone, the prefill's and the one decode step's (2 new
    # tokens: the first from the prefill) = 2 rows (a newcomer's to_text(depth=0): TypeError)
    words = [line.split()[:1] for line in report.to_text(depth=0).splitlines()]
    assert [w[0] for w in words if w in (["prefill"], ["decode"])] == ["prefill", "decode"]
    # one object as the others take it, a keyword beside it winning (depth=1 would be 2 x 3
    # rows: the root, transformer and lm_head of each phase)
    assert report.to_text(view=ViewOptions(depth=1), depth=0) == report.to_text(depth=0)
    assert len(report.to_csv(depth=1).splitlines()) == 1 + 2 * 3  # the header + 6 rows
    # the compact columns keep the keys that tell the phases' rows apart (review: they went)
    assert report.to_csv(columns="compact").startswith("phase,context,batch_size,module,call,type,")
    # the caller's columns and caption win over the report's defaults
    tex = str(report.export("tex", columns=["phase", "module", "macs"], caption="Mine"))
    assert "phase & module & MACs" in tex and "\\caption{Mine}" in tex
    # Markdown's bare table takes them too: header, rule, 2 rows; its document refuses them,
    # naming what it was given, rather than drop them
    bare = report.to_markdown(depth=0, standalone=False, caption=None)
    assert len(bare.splitlines()) == 2 + 2
    with pytest.raises(ModelProfError, match="got depth=1: pass standalone=False"):
        report.to_markdown(depth=1)
    with pytest.raises(ModelProfError, match="got units='raw'"):
        report.export("md", view=ViewOptions(units="raw"))
    # one ViewOptions shared by every format: another format's fields (a LaTeX label) are that
    # format's, not a request of the document's
    assert report.to_markdown(view=ViewOptions(label="tab:x")).startswith("# ")
    with pytest.raises(ModelProfError, match="batch_size=2: the Markdown document covers"):
        report.export("markdown", batch_size=2)
    # a Report's other views do not fit the phases' frame: refused, not ignored
    with pytest.raises(ModelProfError, match="style='torchstat' is a Report's view"):
        report.to_latex(style="torchstat")


def test_the_command_line_writes_a_registered_format(yaml_format, tmp_path, capsys):
    nets = tmp_path / "nets.py"
    nets.write_text(
        textwrap.dedent("""
        from torch import nn
        INPUT_SIZE = (10,)
        def narrow():
            return nn.Sequential(nn.Linear(10, 20), nn.ReLU())
    """)
    )
    out = tmp_path / "out"
    assert (
        main(
            ["profile", f"{nets}:narrow", "--no-timing", "--out", str(out), "--format", "yaml,json"]
        )
        == 0
    )
    assert "total_macs: 200" in (out / "nets_narrow.yml").read_text()
    assert json.loads((out / "nets_narrow.json").read_text())
    assert (
        main(
            [
                "compare",
                f"{nets}:narrow",
                f"{nets}:narrow",
                "--no-timing",
                "--out",
                str(out),
                "--format",
                "yml",
            ]
        )
        == 0
    )
    assert (out / "comparison.yml").read_text().count("macs: 200") == 2


def test_export_hands_a_writer_all_four_arguments_none_when_not_given(monkeypatch):
    seen = {}

    def strict(df, totals, *, end_to_end, env, path, view="mine", **options):
        # a writer that gives no defaults, or a default of its own, gets what export passes
        seen.update(end_to_end=end_to_end, env=env, path=path, view=view, **options)
        return "ok"

    monkeypatch.setitem(formats._FORMATS, "strict", Format("strict", "st", strict, human=False))
    assert formats.export("strict", pd.DataFrame({"a": [1]}), digits=3) == "ok"
    assert seen == dict(end_to_end=None, env=None, path=None, view=None, digits=3)


def test_an_option_only_other_formats_read_is_refused_not_dropped(yaml_format):
    # to_csv(caption=...) wrote a CSV without a caption (CSV has none) and said nothing
    r = profile(nn.Linear(4, 2), (4,), timing=False)
    with pytest.raises(ModelProfError, match=r"^csv does not read caption: caption= is read by"):
        r.to_csv(caption="mine")
    with pytest.raises(
        ModelProfError, match=r"latex does not read indent: indent= is read by json"
    ):
        r.export("latex", indent=2)
    table = compare([nn.Linear(4, 2), nn.Linear(4, 3)], (4,), timing=False)
    with pytest.raises(ModelProfError, match=r"text does not read label: label= is read by latex"):
        table.render.to_text(label="t")
    with pytest.raises(ModelProfError, match=r"json does not read caption"):
        formats.export("json", r.to_dataframe(), caption="x")
    # units too: a raw format writes numbers as they are (to_csv(units="human") wrote raw ones)
    with pytest.raises(ModelProfError, match=r"^csv does not read units: units= is read by latex"):
        r.to_csv(units="human")
    with pytest.raises(ModelProfError, match=r"json does not read units"):
        table.render.to_json(units="fixed")
    assert "|       10 |      8 |      18 |" in r.to_markdown(units="raw", standalone=False)
    # the writers called directly too (modelprof.render.to_csv and its siblings)
    from modelprof import render

    with pytest.raises(ModelProfError, match=r"csv does not read caption"):
        render.to_csv(r.to_dataframe(), caption="x")
    with pytest.raises(ModelProfError, match=r"text does not read label"):
        render.to_text(r.to_dataframe(), label="t")
    # the options every format reads, each format's own, and a format registered elsewhere
    # (which reads what it reads) pass
    assert r.to_csv(columns=["module", "params"], depth=0).splitlines()[0] == "module,params"
    r.to_latex(caption="mine", label="tab:x")
    r.export("yaml", caption="anything")
