"""Every generation figure that is no figure to quote carries its ``~`` wherever it is shown,
and so does every figure computed from one. A trial's printed report read ``TTFT 2.031 ms
(1.709-3.521)`` under a note saying its wall time "is marked ~"; its tokens/s (1000 / TPOT,
batch x new tokens / the end to end) were never marked beside a rough TPOT. The load is made
up (Measurements built with it), never made."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from helpers import blocked, counted_step_generation

from modelprof import profile_generation
from modelprof.errors import ModelProfError
from modelprof.generation.compare import _table
from modelprof.generation.timing import GenerationTiming
from modelprof.render import read_csv
from modelprof.report.comparison import Comparison
from modelprof.timing.options import TimingOptions
from modelprof.timing.peaks import Peaks

LOAD = dict(cpu_clock="thread_time", competing_cores=1.5)  # 1.5 cores of other work: loaded


def _report(ttft_loaded: bool = True, tpot_loaded: bool = True, whole_loaded: bool = False):
    """A batch-1 generation of 3 new tokens: TTFT 9 ms, TPOT 3 ms, end to end 15 ms, each read
    on a loaded machine where asked (its CPU work 2/3 of its wall time), else quietly (no CPU
    clock read)."""
    report = counted_step_generation()

    def read(ms: float, loaded: bool):
        if not loaded:  # no CPU clock read: nothing says a load
            return blocked([ms] * 3)
        return blocked([ms] * 3, cpu_ms=np.full(60, ms * 2 / 3), **LOAD)

    ttft, tpot = read(9.0, ttft_loaded), read(3.0, tpot_loaded)
    whole = read(15.0, whole_loaded)
    steps = np.full((60, 2), 3.0)
    report.timings = {1: GenerationTiming(1, 4, 3, whole, ttft, tpot, steps, np.array([4, 5]))}
    return report


def _batch_line(report) -> str:
    return next(line for line in repr(report).splitlines() if line.startswith("  batch 1:"))


def test_the_printed_report_marks_a_rough_ttft_and_tpot_as_its_notes_say():
    report = _report(ttft_loaded=True, tpot_loaded=False)
    row = report.summary().iloc[0]
    assert bool(row["ttft_rough"]) and not bool(row["tpot_rough"])
    assert any("TTFT at batch 1" in n and "marked ~" in n for n in report.timing_notes)
    line = _batch_line(report)
    # TTFT 9 ms, its interval 9-9 (every sample 9.0); TPOT 3 ms, quiet: unmarked
    assert "TTFT ~9.000 ms (9.000-9.000)" in line
    assert "TPOT 3.000 ms (3.000-3.000)" in line
    quiet = _batch_line(_report(ttft_loaded=False, tpot_loaded=False))
    assert "TTFT 9.000 ms" in quiet and "~" not in quiet


def test_a_tokens_rate_over_a_rough_figure_is_rough_in_the_frame_and_every_view():
    # TPOT loaded, end to end quiet: 1000 / 3 ms = 333.3 tokens/s rough (per sequence and, at
    # batch 1, over the batch), 1 x 3 tokens / 15 ms = 200 tokens/s end to end not
    report = _report(ttft_loaded=False, tpot_loaded=True, whole_loaded=False)
    row = report.summary().iloc[0]
    assert bool(row["tpot_rough"]) and not bool(row["end_to_end_rough"])
    assert bool(row["tokens_per_s_rough"]) and bool(row["batch_tokens_per_s_rough"])
    assert not bool(row["end_to_end_tokens_per_s_rough"])
    assert "~333.3 tokens/s (200.0 end to end)" in _batch_line(report)
    md = str(report.to_markdown()).split("## Summary\n\n")[1].split("\n\n")[0]
    header, _, cells = md.splitlines()[:3]
    at = {c.strip(): i for i, c in enumerate(header.split("|"))}
    cell = [c.strip() for c in cells.split("|")]
    assert cell[at["tokens per s"]] == "~333.33" and cell[at["batch tokens per s"]] == "~333.33"
    assert cell[at["end to end tokens per s"]] == "200.00"
    # the end to end loaded instead: its rate marked, the TPOT's not
    row = _report(ttft_loaded=False, tpot_loaded=False, whole_loaded=True).summary().iloc[0]
    assert bool(row["end_to_end_tokens_per_s_rough"]) and not bool(row["tokens_per_s_rough"])


def test_a_generation_comparison_marks_a_rough_tokens_rate_and_reads_its_flag_back(tmp_path):
    quiet = blocked([3.0] * 3)
    busy = blocked([3.0] * 3, cpu_ms=np.full(60, 2.0), **LOAD)  # wall/CPU 1.5: loaded
    assert busy.loaded and not quiet.loaded

    def timing(tpot):
        # tokens/s 1000 / 3 ms; end to end 1 x 3 tokens / 3 ms (the TTFT's Measurement)
        summary = {"ttft_ms": 3.0, "tpot_ms": tpot.median_ms, "end_to_end_ms": 3.0}
        summary.update(tokens_per_s=1e3 / 3, end_to_end_tokens_per_s=1e3)
        return SimpleNamespace(end_to_end=quiet, ttft=quiet, tpot=tpot, summary=lambda: summary)

    lms = [("spared", None, None, 0), ("hit", None, None, 0)]
    df = _table(lms, [timing(quiet), timing(busy)], TimingOptions())
    flags = ["tokens_per_s_rough", "end_to_end_tokens_per_s_rough"]
    assert df[flags].astype(bool).values.tolist() == [[False, False], [True, False]]
    table = Comparison(df)
    table.attrs = dict(df.attrs, baseline="spared")
    out = str(table.render.export("markdown", columns=["model", "tokens_per_s"]))
    hit = next(line for line in out.splitlines() if line.startswith("| hit "))
    assert "~333.33" in hit.replace("\\~", "~")
    assert "nor is a tokens/s over one of them" in out
    back = read_csv(table.render.to_csv(tmp_path / "g.csv")).set_index("model")
    assert back["tokens_per_s_rough"].dtype == bool
    assert back["tokens_per_s_rough"].tolist() == [False, True]


def test_utilization_over_a_rough_generation_time_is_flagged_and_marked():
    # TTFT loaded: the prefill's generation time (the TTFT, 9 ms) and the MFU and MBU over it
    # rough; TPOT quiet: the decode steps' (their median step, 3 ms) not
    report = _report(ttft_loaded=True, tpot_loaded=False)
    u = report.utilization(peak=Peaks(peak_flops=1e12, peak_bytes=1e11))
    table = u.phases
    assert table["phase"].tolist() == ["prefill", "decode", "decode"]
    assert table["generation_ms"].tolist() == [9.0, 3.0, 3.0]
    for flag in ("generation_rough", "mfu_generation_rough", "mbu_generation_rough"):
        assert table[flag].tolist() == [True, False, False], flag
    lines = repr(u).splitlines()
    prefill = next(line for line in lines if line.startswith("prefill"))
    assert "~9.00 ms" in prefill and prefill.count("~") == 3  # the time and its two ratios
    assert not any("~" in line for line in lines if line.startswith("decode"))
    # the TPOT loaded instead: the decode steps' generation time and ratios
    table = _report(ttft_loaded=False, tpot_loaded=True).utilization(peak=u.convention.peaks)
    assert table.phases["mbu_generation_rough"].tolist() == [False, True, True]


def test_a_table_exports_caption_counts_and_names_only_what_the_file_holds():
    # TTFT, TPOT and end to end loaded, no per-layer timing: the text and LaTeX tables hold the
    # phases' counted rows alone, no timed figure and no notes, so their captions say no ~
    # (a trial's read "~ rough: 3 timed figure(s) ... (the notes say which)")
    report = _report(ttft_loaded=True, tpot_loaded=True, whole_loaded=True)
    assert len(report.timing_notes) == 3
    for text in (str(report.to_text()), str(report.to_latex())):
        assert "rough" not in text and "notes" not in text and "~" not in text
        assert "textasciitilde" not in text
    head = str(report.to_text()).splitlines()[0]
    assert head.endswith(": generation (4 prompt + 3 new tokens, cpu, float32)")
    # an HTML page writes the notes under its caption: they say which figures are rough
    page = str(report.to_html())
    assert all(note.split(",")[0] in page for note in report.timing_notes)


def test_a_phases_repr_puts_its_cache_on_a_line_of_its_own():
    from helpers import tiny_llama

    report = profile_generation(tiny_llama(2), prompt_len=8, new_tokens=3, timing=False)
    phase = report.prefill()
    lines = repr(phase).splitlines()
    # the phase in a line, its report's table whole (its last line as the report prints it),
    # the cache after it on its own line: the dataclass's repr tacked ", kv=..." onto the
    # table's last line
    assert lines[0] == "Phase(prefill: 8 token(s) at context 0, batch 1)"
    table = repr(phase.report).splitlines()
    assert lines[1:-1] == table
    assert phase.kv is not None and lines[-1] == f"kv={phase.kv!r}"


def test_the_markdown_document_holds_the_memory_plan_and_what_fits(tmp_path, capsys):
    # README: to_markdown is "the whole report"; it left out report.memory, and the command
    # line's --memory answer was printed alone, in no file written
    from helpers import tiny_llama

    from modelprof.cli import main

    report = profile_generation(tiny_llama(2), prompt_len=8, new_tokens=3, timing=False)
    mem = report.memory
    md = str(report.to_markdown())
    plan = md.split("## Memory plan\n\n")[1]
    # one row per phase of the plan (prefill, decode), at its batch and context
    assert plan.startswith(f"At batch {mem.batch_size} and {mem.context} tokens of context")
    rows = [line for line in plan.splitlines() if line.startswith("| ")][1:]
    assert [r.split("|")[1].strip() for r in rows] == list(mem.activation_per_seq_bytes)
    assert "fits" not in plan
    said = mem.fit_text(1e9).splitlines()[0].replace("<", "\\<")  # (Markdown escapes "<")
    assert said in str(report.to_markdown(memory_bytes=1e9))
    assert said.startswith("fits 1,000,000,000 bytes")
    spec = (
        "LlamaConfig:hidden_size=64,intermediate_size=96,num_hidden_layers=2,"
        "num_attention_heads=4,num_key_value_heads=2,vocab_size=128"
    )
    argv = ["generate", spec, "--prompt-len", "8", "--new-tokens", "2", "--no-timing"]
    assert main([*argv, "--memory", "1GB", "--out", str(tmp_path), "--format", "md"]) == 0
    printed = next(line for line in capsys.readouterr().out.splitlines() if "fits " in line)
    (written,) = tmp_path.glob("*.md")
    assert printed.replace("<", "\\<") in written.read_text()
    # a table export holds no plan: memory_bytes there is refused, not dropped
    for fmt in ("text", "csv"):
        with pytest.raises(ModelProfError, match="Markdown document alone"):
            report.export(fmt, memory_bytes=1e9)


def test_what_fits_takes_a_memory_size_as_text_as_max_batch_does():
    # max_batch and max_context take "24GB" (memory_bytes_arg); fit_text, which calls them,
    # formatted the text itself as a number and raised ValueError ("Unknown format code 'f'"),
    # and so did to_markdown(memory_bytes="1GB"). "1GB" is 10**9 bytes (decimal units).
    from helpers import tiny_llama

    report = profile_generation(tiny_llama(2), prompt_len=8, new_tokens=3, timing=False)
    mem = report.memory
    assert mem.fit_text("1GB") == mem.fit_text(10**9)
    assert mem.fit_text("1GB").startswith("fits 1,000,000,000 bytes")
    said = mem.fit_text(10**9).splitlines()[0].replace("<", "\\<")  # (Markdown escapes "<")
    assert said in str(report.to_markdown(memory_bytes="1GB"))
