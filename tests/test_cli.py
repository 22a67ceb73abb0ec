"""The ``modelprof`` command line, run in-process through ``main([...])``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from modelprof import cli
from modelprof.cli import build_parser, main, parse_formats, parse_input_size_arg
from modelprof.errors import ModelProfError
from modelprof.render.csvio import read_csv
from modelprof.render.jsonio import read_json


def _row(markdown: str, name: str) -> str:
    """The table line of model ``name``."""
    return next(line for line in markdown.splitlines() if line.startswith(f"| {name} "))


def test_profile_prints_table_and_totals(nets: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", f"{nets}:narrow", "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert "input 1x10" in out  # the model file's INPUT_SIZE (10,), batch 1
    assert "Linear" in out and "ReLU" in out
    # Linear(10, 20): 10*20 + 20 = 220 params, 200 MACs
    assert "params 220  MACs 200" in out  # the summary line


def test_a_model_file_without_input_size_is_said_to_run_on_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # a newcomer's factory took 3x224x224 without a word; a Linear(16, 8) then failed on it
    f = tmp_path / "flat.py"
    f.write_text("from torch import nn\ndef make():\n    return nn.Linear(16, 8)\n")
    note = (
        f"modelprof: note: {f} sets no INPUT_SIZE: its input is taken as 3x224x224 "
        "(--input-size gives another)\n"
    )
    assert main(["profile", f"{f}:make", "--no-timing"]) == 1  # the model failed to run
    err = capsys.readouterr().err
    assert err.startswith(note) and "Inputs were 1x3x224x224" in err
    # given a size (or inputs), nothing to note: 16 * 8 = 128 MACs
    assert main(["profile", f"{f}:make", "--no-timing", "--input-size", "16"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "MACs 128" in captured.out
    # the file's INPUT_SIZE: nothing to note either
    f.write_text(f.read_text() + "INPUT_SIZE = (16,)\n")
    assert main(["profile", f"{f}:make", "--no-timing"]) == 0
    assert capsys.readouterr().err == ""


def test_profile_writes_every_format(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out_dir = tmp_path / "out"
    code = main(
        [
            "profile",
            f"{nets}:wide",
            "--no-timing",
            "--out",
            str(out_dir),
            "--format",
            "csv,md,tex,html,json,png",
        ]
    )
    assert code == 0, capsys.readouterr().err
    names = sorted(p.name for p in out_dir.iterdir())
    # untimed: the FLOPs chart only (latency and roofline plots need measured time)
    assert names == [
        "nets_wide.csv",
        "nets_wide.html",
        "nets_wide.json",
        "nets_wide.md",
        "nets_wide.tex",
        "nets_wide_flops.png",
    ]
    table = pd.read_csv(out_dir / "nets_wide.csv")
    # one row per module call: the Sequential, its Linear and its ReLU
    assert len(table) == 3
    assert table["macs"].max() == 400  # 10*40
    assert "|" in (out_dir / "nets_wide.md").read_text()
    assert "tabular" in (out_dir / "nets_wide.tex").read_text()
    assert "<table" in (out_dir / "nets_wide.html").read_text()
    json.loads((out_dir / "nets_wide.json").read_text())
    err = capsys.readouterr().err
    assert f"wrote {out_dir / 'nets_wide.csv'}" in err


def test_columns_choose_the_printed_and_human_tables_columns(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # a newcomer's --backward .tex could never show the backward: the command line had no way
    # to name the columns. --columns names them for the printed table and md/tex/html/txt; CSV
    # and JSON keep every one
    out_dir = tmp_path / "cols"
    argv = ["profile", f"{nets}:wide", "--no-timing", "--out", str(out_dir)]
    assert main([*argv, "--columns", "module, params,macs", "--format", "csv,md,tex"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].split() == ["module", "params", "MACs"]
    md = (out_dir / "nets_wide.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("|"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["module", "params", "MACs"]
    assert "module & params & MACs" in (out_dir / "nets_wide.tex").read_text()
    assert "output_shape" in pd.read_csv(out_dir / "nets_wide.csv").columns
    # all: every column; an unknown name is refused by name
    assert main([*argv, "--columns", "all", "--format", "md"]) == 0
    assert "MAdd" in (out_dir / "nets_wide.md").read_text()
    # an empty item is refused as every comma list's is (test_cli_comma_lists), and compact
    # (the default) is taken by name
    assert main([*argv, "--columns", "module,macs,", "--format", "md"]) == 2
    assert main([*argv, "--columns", "compact", "--format", "md"]) == 0
    assert "output shape" in (out_dir / "nets_wide.md").read_text()
    capsys.readouterr()
    # an unknown name is refused by name before anything runs (not after a whole profile):
    # before the model file is even looked for
    assert main(["profile", str(tmp_path / "absent.py:f"), "--columns", "module,nope"]) == 2
    err = capsys.readouterr().err
    assert "--columns 'module,nope': unknown column(s) ['nope']" in err and "absent" not in err
    # a near miss names the column meant: difflib's ratio of mac to macs, 2 * 3 / 7 = 0.86, is
    # over its 0.75 cutoff; nope is near none
    assert main(["profile", str(tmp_path / "absent.py:f"), "--columns", "module,mac"]) == 2
    assert "unknown column(s) ['mac'] (mac: did you mean macs?)" in capsys.readouterr().err
    assert "did you mean" not in err


def test_profile_torchstat_style_file_names(nets: Path, tmp_path: Path) -> None:
    assert (
        main(
            [
                "profile",
                f"{nets}:wide",
                "--no-timing",
                "--style",
                "torchstat",
                "--out",
                str(tmp_path),
                "--format",
                "csv",
            ]
        )
        == 0
    )
    table = pd.read_csv(tmp_path / "nets_wide_torchstat.csv")
    assert "MAdd" in table.columns and "MemRead(B)" in table.columns


def test_out_alone_writes_the_default_formats(nets: Path, tmp_path: Path) -> None:
    assert main(["profile", f"{nets}:narrow", "--no-timing", "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.glob("nets_narrow.*")} == {"nets_narrow.csv", "nets_narrow.md"}


def test_format_without_out_writes_into_the_current_directory_as_the_readme_says(
    nets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # a trial's --format tex wrote resnet18.tex where it ran; the README did not say where
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["profile", f"{nets}:narrow", "--no-timing", "--format", "md"]) == 0
    assert [p.name for p in here.iterdir()] == ["nets_narrow.md"]
    assert "wrote nets_narrow.md" in capsys.readouterr().err
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    cli_section = readme[readme.index("## Command line") : readme.index("## Comparing models")]
    words = " ".join(cli_section.split())  # (the sentence may wrap)
    assert "`--format` without `--out` writes into the current directory" in words


def test_profile_torchvision_model(capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", "resnet18", "--no-timing", "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert "input 1x3x224x224" in out  # resnet18's crop size, batch 1
    assert "layer1 " in out and "layer1.0" not in out  # --depth 1 collapses the blocks
    # torchvision publishes 1.814 GMACs for resnet18 (1,814,073,344 counted)
    assert "MACs 1,814,073,344" in out


def test_depth_applies_to_every_file_written_json_too(tmp_path: Path) -> None:
    from modelprof.render import read_csv, read_json

    argv = ["profile", "resnet18", "--no-timing", "--depth", "1", "--input-size", "3,32,32"]
    assert main([*argv, "--out", str(tmp_path), "--format", "csv,json"]) == 0
    # depth 1: the root and its 10 children (conv1, bn1, relu, maxpool, layer1-4, avgpool, fc)
    csv_rows = read_csv(tmp_path / "resnet18.csv")
    json_rows = read_json(tmp_path / "resnet18.json")[0]
    assert len(csv_rows) == len(json_rows) == 11


def test_unknown_model_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", "resnet1800", "--no-timing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modelprof: error: unknown model 'resnet1800'; did you mean resnet18,")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["profile", "resnet18", "--format", "xls"], "--format 'xls'"),
        (["profile", "resnet18", "--input-size", "3,a"], "--input-size '3,a'"),
        # (profiled as 1x3x64 and 1x3x64x64: the empty parts were dropped)
        (["profile", "resnet18", "--input-size", "3,x,64"], "--input-size '3,x,64' must be"),
        (["profile", "resnet18", "--input-size", "3,64,64,x"], "--input-size '3,64,64,x' must"),
        (["profile", "resnet18", "--batch-size", "0"], "--batch-size 0"),
        (["profile", "resnet18", "--budget", "-1"], "--budget -1"),
        (["profile", "resnet18", "--budget", "nan"], "--budget nan"),  # nan <= 0 is False
        (["profile", "resnet18", "--budget", "inf"], "--budget inf"),
        (["profile", "resnet18", "--depth", "-1"], "--depth -1"),
    ],
)
def test_bad_options_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_every_usage_error_is_one_modelprof_error_line(capsys: pytest.CaptureFixture) -> None:
    # (fit's --input-size was parsed by argparse itself, whose ModelProfError escaped main)
    fit_zero = ["fit", "resnet18", "--input-size", "0"]
    for argv in (["profile"], ["frobnicate"], ["fit", "X", "--context", "x"], ["sweep"], fit_zero):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("modelprof: error: ") and err.count("\n") == 1, argv
    assert main(["generate", "LlamaConfig:num_hidden_layers=1", "--memory", "inf"]) == 2
    assert capsys.readouterr().err == (
        "modelprof: error: --memory inf must be a finite number of bytes, at least 1 and below "
        "2**63\n"
    )
    # what memory_bytes= refuses is refused before the model is loaded or run (1e19 bytes
    # profiled a whole generation before its plan refused it)
    for flag in ("generate", "fit"):
        assert main([flag, "LlamaConfig:num_hidden_layers=1", "--memory", "1e19"]) == 2
        assert "--memory 1e+19 must be a finite number of bytes, at least 1" in (
            capsys.readouterr().err
        )
    for bad in ("24 gigs", "1.2.3GB"):
        assert main(["fit", "LlamaConfig:num_hidden_layers=1", "--memory", bad]) == 2
        err = capsys.readouterr().err
        assert f"'{bad}' is not a number of bytes such as 24e9, 24GB or 80GiB" in err


def test_an_unknown_flag_points_to_its_commands_help(capsys: pytest.CaptureFixture) -> None:
    # a newcomer's typo in a command's flag was sent to the top-level help, which lists no flags;
    # a misspelt flag is given the command's nearest one
    for command, model in (("profile", "resnet18"), ("fit", "X"), ("generate", "X")):
        assert main([command, model, "--batchsize", "2"]) == 2
        assert capsys.readouterr().err == (
            f"modelprof: error: {command}: unrecognized arguments: --batchsize 2 "
            f"(--batchsize: did you mean --batch-size?) (see 'modelprof {command} --help')\n"
        )
    # each misspelt flag, written with its value or not; nothing near (difflib's ratio under
    # 0.75: --frobnicate and --format read 0.6): no guess
    assert main(["profile", "m", "--budgte=2", "--no-timng", "--frobnicate"]) == 2
    assert capsys.readouterr().err == (
        "modelprof: error: profile: unrecognized arguments: --budgte=2 --no-timng --frobnicate "
        "(--budgte: did you mean --budget?; --no-timng: did you mean --no-timing?) "
        "(see 'modelprof profile --help')\n"
    )
    # snake case for a kebab-case flag
    assert main(["generate", "X", "--prompt_len", "3"]) == 2
    assert "(--prompt_len: did you mean --prompt-len?)" in capsys.readouterr().err
    # given before the command's name, it is the top-level parser's
    assert main(["--verbose", "profile", "resnet18"]) == 2
    assert capsys.readouterr().err == (
        "modelprof: error: unrecognized arguments: --verbose (see 'modelprof --help')\n"
    )


def test_a_value_that_begins_with_a_minus_is_shown_how_to_pass(
    capsys: pytest.CaptureFixture,
) -> None:
    # argparse reads "-3,224,224" as an option and says only "expected one argument" (a
    # newcomer's negative size); after "=" the value reaches its own check, which names it
    assert main(["profile", "resnet18", "--input-size", "-3,224,224", "--no-timing"]) == 2
    assert capsys.readouterr().err == (
        "modelprof: error: profile: argument --input-size: expected one argument (a value that "
        "begins with '-' goes after '=': --input-size=-3,224,224) (see 'modelprof profile "
        "--help')\n"
    )
    # a value left out, last or before another flag: no word of a minus (a review's case)
    for argv in (["--input-size"], ["--input-size", "--no-timing"]):
        assert main(["profile", "resnet18", *argv]) == 2
        assert "goes after '='" not in capsys.readouterr().err
    assert main(["profile", "resnet18", "--input-size=-3,224,224", "--no-timing"]) == 2
    assert "--input-size '-3,224,224' must be positive integers" in capsys.readouterr().err


def test_dtype_takes_every_float_dtype_profile_takes() -> None:
    # profile(dtype=torch.float64) runs, so the command line takes it too, by any of its names
    for name in ("float64", "fp64", "double"):
        assert build_parser().parse_args(["profile", "m", "--dtype", name]).dtype == "float64"


def test_memory_takes_bytes_as_people_write_them() -> None:
    parser = build_parser()
    read = {  # GB and G in powers of 1000 (as datasheets print them), GiB in powers of 1024
        "24e9": 24e9,
        "24GB": 24e9,
        "24 G": 24e9,
        "80GiB": 80 * 2**30,
        "512MiB": 512 * 2**20,
        "1.5TB": 1.5e12,
        "100": 100.0,
        "100B": 100.0,
    }
    for text, expected in read.items():
        assert parser.parse_args(["fit", "X", "--memory", text]).memory_bytes == expected, text
        assert parser.parse_args(["generate", "X", "--memory", text]).memory == expected, text


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture) -> None:
    assert main(["profile"]) == 2
    assert main(["frobnicate"]) == 2
    assert main(["profile", "resnet18", "--style", "fancy"]) == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_cuda(capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", "resnet18", "--device", "cuda", "--no-timing"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_a_model_that_fails_to_run_exits_1(nets: Path, capsys: pytest.CaptureFixture) -> None:
    # (1, as a comparison's or a sweep's failed model; 2 is what was typed wrong)
    assert main(["profile", f"{nets}:broken", "--no-timing"]) == 1  # Linear(11, ..) on 10
    err = capsys.readouterr().err
    assert err.startswith("modelprof: error:") and "Traceback" not in err


def test_a_failed_run_leaves_no_empty_out_behind(nets: Path, tmp_path: Path) -> None:
    # --out is made before the work (a bad one fails at once); a run that then fails removes
    # the folders it made while they are empty, and never one that was there or holds a file
    out = tmp_path / "new" / "deeper"
    assert main(["profile", f"{nets}:broken", "--no-timing", "--out", str(out)]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nets.py"]
    kept = tmp_path / "kept"
    (kept / "deeper").mkdir(parents=True)
    (kept / "file.txt").write_text("mine")
    assert main(["profile", f"{nets}:broken", "--out", str(kept / "deeper" / "x")]) == 1
    assert sorted(p.name for p in kept.iterdir()) == ["deeper", "file.txt"]
    assert list((kept / "deeper").iterdir()) == []  # there before the run: stays


def test_unexpected_errors_exit_1_with_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def bug(ctx: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_run_profile", bug)
    assert main(["profile", "resnet18"]) == 1
    err = capsys.readouterr().err
    assert "internal error" in err and "Traceback" in err and "RuntimeError: a bug" in err


def test_compare_says_which_model_each_row_is(nets: Path, capsys: pytest.CaptureFixture) -> None:
    # one factory twice is rows "nets_narrow" and "nets_narrow (2)" (its file's stem and name):
    # each row named otherwise than its MODEL is said, as generate's comparison does
    assert main(["compare", f"{nets}:narrow", f"{nets}:narrow", "--no-timing"]) == 0
    out = capsys.readouterr().out  # (its source column: the MODEL each row is)
    assert _row(out, "nets_narrow").startswith(f"| nets_narrow     | {nets}:narrow |")
    assert _row(out, "nets_narrow (2)").startswith(f"| nets_narrow (2) | {nets}:narrow |")
    assert main(["compare", "resnet18", "resnet18", "--input-size", "3,32,32", "--no-timing"]) == 0
    out = capsys.readouterr().out  # a name as given is its source too
    assert _row(out, "resnet18 (2)").startswith("| resnet18 (2) | resnet18 ")
    assert main(["compare", "resnet18", "alexnet", "--input-size", "3,64,64", "--no-timing"]) == 0
    assert "source" not in capsys.readouterr().out  # every row named as given: none


def test_compare_files_say_which_file_each_row_is(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # before: "model: net_build (2) = b/net.py:build" on stdout only, the files' rows bare
    specs = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "net.py").write_text(
            "from torch import nn\n\ndef build():\n    return nn.Sequential(nn.Linear(4, 2))\n"
        )
        specs.append(f"{tmp_path / folder / 'net.py'}:build")
    out = tmp_path / "out"
    argv = ["compare", *specs, "--input-size", "4", "--no-timing", "--out", str(out)]
    assert main([*argv, "--format", "csv,md,json,tex,html"]) == 0
    printed = capsys.readouterr().out
    assert f"| net_build (2) | {specs[1]} |" in printed
    csv = read_csv(out / "comparison.csv")  # read back as written
    assert csv["source"].tolist() == specs and csv["model"].tolist() == [
        "net_build",
        "net_build (2)",
    ]
    assert read_json(out / "comparison.json")[0]["source"].tolist() == specs
    for suffix in ("md", "html", "tex"):  # (LaTeX escapes the path's underscores)
        text = (out / f"comparison.{suffix}").read_text().replace("\\_", "_")
        assert all(spec in text for spec in specs), suffix


def test_compare_with_a_failing_model_exits_1_after_its_table(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from torch import nn\n\n\nclass Bad(nn.Module):\n"
        "    def forward(self, x):\n        raise RuntimeError('broken on purpose')\n\n\n"
        "def build():\n    return Bad()\n"
    )
    # the others are compared and the table printed, but the run failed in part (as a sweep's)
    assert main(["compare", f"{nets}:narrow", f"{bad}:build", "--no-timing"]) == 1
    captured = capsys.readouterr()
    assert "broken on purpose" in _row(captured.out, "bad_build")
    assert _row(captured.out, "nets_narrow")
    # said once, in the heading over the table whose error column it points to (a note line
    # below the table said it again)
    said = "bad_build failed and is not compared (its error column says why)"
    heading = captured.out.splitlines()[0]
    assert heading.startswith("# comparison (") and said in heading
    assert captured.out.count("bad_build failed") == 1
    # the second model is the second done, failed or not
    assert "modelprof: bad_build: failed (2 of 2)" in captured.err.splitlines()


def test_compare_writes_ratios(nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(
        [
            "compare",
            f"{nets}:narrow",
            f"{nets}:wide",
            "--no-timing",
            "--out",
            str(tmp_path),
            "--format",
            "csv,md,json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "baseline nets_narrow" in out
    assert "2.00" in _row(out, "nets_wide")
    table = pd.read_csv(tmp_path / "comparison.csv", index_col="model")
    # 10*40 / (10*20) = 2.0
    assert table.loc["nets_wide", "macs_x"] == 2.0
    assert table.loc["nets_narrow", "macs"] == 200
    assert "2.00" in _row((tmp_path / "comparison.md").read_text(encoding="utf-8"), "nets_wide")
    from modelprof.render import read_json

    frame, _, env = read_json(tmp_path / "comparison.json")
    assert frame.loc["nets_wide", "macs"] == 400
    assert env is not None and env["device"] == "cpu"


def test_compare_baseline_option(nets: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        main(
            ["compare", f"{nets}:narrow", f"{nets}:wide", "--no-timing", "--baseline", "nets_wide"]
        )
        == 0
    )
    assert "0.50" in _row(capsys.readouterr().out, "nets_narrow")  # macs_x = 200 / 400
    # or by the MODEL spec given for it: the same ratio
    wide = f"{nets}:wide"
    assert main(["compare", f"{nets}:narrow", wide, "--no-timing", "--baseline", wide]) == 0
    assert "0.50" in _row(capsys.readouterr().out, "nets_narrow")
    assert main(["compare", f"{nets}:narrow", "--no-timing", "--baseline", "nope"]) == 2
    assert "--baseline nope is not one of the models" in capsys.readouterr().err


def test_compare_same_model_twice_gets_two_rows(nets: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", f"{nets}:narrow", f"{nets}:narrow", "--no-timing"]) == 0
    assert "nets_narrow (2)" in capsys.readouterr().out


def test_parse_helpers() -> None:
    assert parse_input_size_arg("3,224,224") == (3, 224, 224)
    assert parse_input_size_arg("3x32x32") == (3, 32, 32)
    assert parse_formats("CSV, markdown,csv,.png") == ("csv", "md", "png")
    for bad in ("", "0,3", "3;4"):
        with pytest.raises(ModelProfError):
            parse_input_size_arg(bad)
    with pytest.raises(ModelProfError):
        parse_formats(",")


def test_input_size_takes_its_separators_one_at_a_time() -> None:
    # the accepted spellings of 3 x 224 x 224 (batch excluded)
    spellings = ["3,224,224", "3x224x224", "3 224 224", "3×224×224", "3, 224, 224"]
    for good in [*spellings, " 3 x 224x224 "]:
        assert parse_input_size_arg(good) == (3, 224, 224), good
    # a stray separator or a part that is no number was dropped: "3,x,64" profiled 3x64 and
    # "3,64,64,x" 3x64x64; now each is refused, naming the value given
    for bad in ("3,x,64", "3,64,64,x", "3,,64", "3,224,224,", "x3", "3_0,4", "+3,4", "3,64,64.5"):
        with pytest.raises(ModelProfError, match=rf"--input-size {re.escape(repr(bad))} must be"):
            parse_input_size_arg(bad)


def test_input_size_takes_a_capital_x_and_a_python_tuple(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    # 3X224X224 and (3,224,224) were refused as "must be positive integers", nothing saying
    # which spelling was meant; each is one size, unambiguous
    for good in ("3X224X224", "(3,224,224)", "(3, 224, 224)", "[3,224,224]", "(3,224,224,)"):
        assert parse_input_size_arg(good) == (3, 224, 224), good
    assert parse_input_size_arg("(16,)") == (16,)  # a one-tuple as Python writes it
    assert main(["profile", f"{nets}:narrow", "--no-timing", "--input-size", "(10,)"]) == 0
    assert "input 1x10" in capsys.readouterr().out
    # junk still refused, named, with the spellings that are taken
    for bad in ("(3,224,224", "3,224,224)", "((3,224))", "(3,,224)", "()", "[3,4)", "3XX4"):
        with pytest.raises(ModelProfError, match=rf"--input-size {re.escape(repr(bad))} must be"):
            parse_input_size_arg(bad)
    with pytest.raises(ModelProfError, match=r"also 3x224x224, '3 224 224' or \(3,224,224\)"):
        parse_input_size_arg("3;224")


def test_python_dash_m_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "modelprof", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert "usage: modelprof" in done.stdout
    for command in ("profile", "compare", "throughput"):
        assert command in done.stdout


def test_throughput_writes_the_curve(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code = main(
        [
            "throughput",
            f"{nets}:narrow",
            "--max-batch",
            "4",
            "--budget",
            "0.05",
            "--out",
            str(tmp_path),
            "--format",
            "csv,png",
        ]
    )
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "best:" in out and "samples/s over all its runs at batch size" in out
    curve = pd.read_csv(tmp_path / "nets_narrow_throughput.csv")
    # batch sizes double from 1 and never pass --max-batch 4
    assert list(curve["batch_size"])[:2] == [1, 2]
    assert curve["batch_size"].max() <= 4
    assert (curve["samples_per_s"] > 0).all()
    assert (tmp_path / "nets_narrow_throughput.png").stat().st_size > 0


def test_throughput_without_a_terminal_prints_a_line_per_batch_size(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    # stderr captured: no terminal, so no progress bar; a line per finished point instead
    code = main(["throughput", f"{nets}:narrow", "--max-batch", "4", "--budget", "0.05"])
    assert code == 0
    err = capsys.readouterr().err
    # (a warning, as under load, names samples/s too: "modelprof: warning: throughput: ...")
    said = [line for line in err.splitlines() if not line.startswith("modelprof: warning:")]
    lines = [line for line in said if "samples/s" in line]
    # batch 1, 2, 4 (doubling up to --max-batch 4), each as it finished, in order
    assert [line.split(": ")[2] for line in lines] == ["batch 1", "batch 2", "batch 4"]
    assert all(line.startswith("modelprof: nets_narrow: batch ") for line in lines)


def test_compare_without_a_terminal_says_it_is_alive(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    # stderr captured: no terminal, so no progress bar; a line per profiled model and one when
    # the interleaved timing ends
    assert main(["compare", f"{nets}:narrow", f"{nets}:wide", "--budget", "0.05"]) == 0
    lines = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("modelprof: ") and "warning" not in line
    ]
    assert lines == [
        "modelprof: nets_narrow: profiled (1 of 2)",
        "modelprof: nets_wide: profiled (2 of 2)",
        "modelprof: interleaved timing of 2 models done",
    ]


def test_throughput_with_a_progress_bar_prints_no_lines(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("tqdm")
    assert (
        main(["throughput", f"{nets}:narrow", "--max-batch", "2", "--budget", "0.05", "--progress"])
        == 0
    )
    assert "modelprof: nets_narrow: batch" not in capsys.readouterr().err


def test_profile_with_timing_plots_time(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out_dir = tmp_path / "plots"
    code = main(
        ["profile", f"{nets}:narrow", "--budget", "0.05", "--out", str(out_dir), "--format", "png"]
    )
    assert code == 0, capsys.readouterr().err
    assert "latency median" in capsys.readouterr().out
    assert {p.name for p in out_dir.iterdir()} == {
        "nets_narrow_flops.png",
        "nets_narrow_latency.png",
        "nets_narrow_roofline.png",
    }


# -- user errors: one line, exit 2, the value named, no traceback --------------------------------
def _one_line_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.startswith("modelprof: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err and "internal error" not in err
    return err


def test_input_size_too_large_is_refused_before_allocating(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    assert (
        main(["profile", f"{nets}:narrow", "--input-size", "3,100000,100000", "--no-timing"]) == 2
    )
    err = _one_line_error(capsys)
    # 3 * 100000 * 100000 float32 values = 1.2e11 bytes
    # (said in the command line's flag: cli_words)
    assert "--input-size 3,100000,100000" in err and "120.0 GB" in err


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the no-MPS message")
def test_device_this_machine_lacks(nets: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", f"{nets}:narrow", "--device", "mps", "--no-timing"]) == 2
    assert "--device mps" in _one_line_error(capsys)


def test_out_under_an_existing_file(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    blocker = tmp_path / "report.txt"
    blocker.write_text("not a directory")
    assert main(["profile", f"{nets}:narrow", "--no-timing", "--out", str(blocker / "sub")]) == 2
    err = _one_line_error(capsys)
    assert f"--out '{blocker / 'sub'}'" in err and "is a file, not a directory" in err
    assert blocker.read_text() == "not a directory"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux)")
def test_out_where_nothing_can_be_created(nets: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        main(["profile", f"{nets}:narrow", "--no-timing", "--out", "/proc/modelprof-out"]) == 2
    )  # procfs refuses new directories, even to root
    assert "--out '/proc/modelprof-out': cannot create" in _one_line_error(capsys)


def test_write_failure_names_out(
    nets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from modelprof.report.report import Report

    export = Report.export

    def full_disk(self: Report, fmt: str, path: object = None, **kw: object) -> object:
        if path is None:  # the table printed, not written
            return export(self, fmt, path, **kw)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Report, "export", full_disk)  # what --out writes every table with
    assert main(["profile", f"{nets}:narrow", "--no-timing", "--out", str(tmp_path)]) == 2
    err = _one_line_error(capsys)
    assert f"cannot write '{tmp_path / 'nets_narrow.csv'}' (No space left on device)" in err


def test_factory_calling_sys_exit_does_not_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    f = tmp_path / "quits.py"
    f.write_text("import sys\ndef build():\n    sys.exit(0)\n")
    assert main(["profile", f"{f}:build", "--no-timing"]) == 2
    assert "SystemExit(0)" in _one_line_error(capsys)


def test_forward_calling_sys_exit_does_not_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    f = tmp_path / "quits_late.py"
    f.write_text(
        textwrap.dedent("""
        import sys
        from torch import nn
        INPUT_SIZE = (3,)
        class Quit(nn.Module):
            def forward(self, x):
                sys.exit(0)
        def build():
            return Quit()
    """)
    )
    assert main(["profile", f"{f}:build", "--no-timing"]) == 2
    assert "sys.exit(0)" in _one_line_error(capsys)


def test_profile_pt2_uses_the_recorded_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from torch import nn

    path = tmp_path / "mlp.pt2"
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU())
    torch.export.save(torch.export.export(model, (torch.randn(3, 6),)), path)
    assert main(["profile", str(path), "--no-timing"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "input 3x6" in out  # the archive's (3, 6), not (1, 3, 224, 224)
    # Linear(6, 5) on 3 rows: 3*6*5 = 90 MACs; 6*5 + 5 = 35 parameters
    assert "params 35  MACs 90" in out


def test_all_ranks_lets_a_non_zero_rank_speak(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # launched by torchrun as rank 1 (no process group initialised: RANK decides): one voice
    # keeps rank 1 quiet and writes no files; --all-ranks makes it print and write, for this
    # command only (MODELPROF_ALL_RANKS is put back afterwards)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MODELPROF_ALL_RANKS", raising=False)
    quiet, loud = tmp_path / "quiet", tmp_path / "loud"
    assert main(["profile", f"{nets}:narrow", "--no-timing", "--out", str(quiet)]) == 0
    assert "params 220  MACs 200" not in capsys.readouterr().out
    assert not quiet.exists() or not any(quiet.iterdir())
    assert (
        main(["profile", f"{nets}:narrow", "--no-timing", "--all-ranks", "--out", str(loud)]) == 0
    )
    assert "params 220  MACs 200" in capsys.readouterr().out  # Linear(10, 20), as above
    assert any(loud.iterdir())
    assert "MODELPROF_ALL_RANKS" not in os.environ


def test_a_library_warning_names_the_command_lines_flags_not_python_keywords() -> None:
    import io

    from modelprof.cli import _one_line_warnings, cli_words
    from modelprof.timing.measurement import Measurement
    from modelprof.timing.runner import _notice

    # 4 threads less 1.5 cores of other work leave floor(2.5) = 2 (Measurement.threads_hint)
    loaded = Measurement([5.0, 5.1, 5.2], competing_cores=1.5, env={"torch_num_threads": 4})
    stream = io.StringIO()
    with _one_line_warnings(stream):
        # the notice of a per-layer floor going 6 s past the budget (capped at 30 s), as
        # profile() says it
        _notice("per-layer Net", 1, 10, 6.0, 30.0, "layer_extend_s")
        loaded.warn_if_noisy()
    said = stream.getvalue()
    assert "(the Python API's layer_extend_s= caps it; --progress with tqdm shows a bar)" in said
    assert "or with --threads 2: other work took 1.50 of the cores its 4 threads need" in said
    assert "progress=True" not in said and "set_num_threads" not in said
    # and the floor's own cap, said alike
    assert cli_words("floor_extend_s= caps it") == "the Python API's floor_extend_s= caps it"


def test_a_library_warning_is_said_with_one_modelprof_prefix() -> None:
    import io
    import warnings

    from modelprof.cli import _one_line_warnings

    stream = io.StringIO()
    with _one_line_warnings(stream):
        warnings.warn("modelprof: the passes disagree", UserWarning, stacklevel=1)
        warnings.warn("a plain one", RuntimeWarning, stacklevel=1)
    assert stream.getvalue().splitlines() == [
        "modelprof: warning: the passes disagree (UserWarning)",
        "modelprof: warning: a plain one (RuntimeWarning)",
    ]


def test_threads_sets_torchs_threads_for_the_command_only(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # the loaded-machine warning says torch.set_num_threads(k); --threads is that for the CLI
    seen = tmp_path / "seen.txt"
    f = tmp_path / "net.py"
    f.write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Net(nn.Linear):\n"
        "    def forward(self, x):\n"
        f"        open({str(seen)!r}, 'a').write(f'{{torch.get_num_threads()}}\\n')\n"
        "        return super().forward(x)\n"
        "def build():\n"
        "    return Net(4, 2)\n"
    )
    before = torch.get_num_threads()
    n = 2 if before == 1 else 1  # a count the process does not have already
    argv = ["profile", f"{f}:build", "--input-size", "4", "--no-timing", "--threads", str(n)]
    assert main(argv) == 0
    assert set(seen.read_text().split()) == {str(n)}  # every forward ran on n threads
    assert torch.get_num_threads() == before  # and the process's count is put back
    assert main(["profile", "resnet18", "--threads", "two"]) == 2
    assert "'two' is not a number of threads" in capsys.readouterr().err
    # a sweep takes it too (it was an unrecognized argument; the README names --threads k)
    seen.unlink()
    sweep = tmp_path / "grid.toml"
    sweep.write_text(f'models = ["{f}:build"]\ninput_size = [4]\ntiming = false\n')
    out = tmp_path / "sweep_out"
    assert main(["sweep", str(sweep), "--out", str(out), "--threads", str(n)]) == 0
    assert set(seen.read_text().split()) == {str(n)} and torch.get_num_threads() == before


def test_amp_runs_the_profile_under_autocast(nets: Path, capsys: pytest.CaptureFixture) -> None:
    # the header names the autocast dtype the pass ran under; a dtype autocast does not take
    # is refused by argparse (exit 2) before anything is built
    assert main(["profile", f"{nets}:narrow", "--amp", "fp16", "--no-timing"]) == 0
    assert "float32 under float16 autocast" in capsys.readouterr().out
    assert main(["profile", f"{nets}:narrow", "--amp", "int8", "--no-timing"]) == 2
    assert "argument --amp: invalid choice: 'int8'" in capsys.readouterr().err


def test_a_refused_dtype_names_the_spellings_that_work(capsys: pytest.CaptureFixture) -> None:
    # before: "(choose from 'float16', 'bfloat16')", where --amp bf16 (the README's) works too
    for flag, value in (("--amp", "int8"), ("--amp", "float64"), ("--dtype", "bfloat17")):
        assert main(["profile", "X", flag, value]) == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: invalid choice: {value!r} (use one of [" in err
        assert "'bf16', 'bfloat16'" in err and "'fp16'" in err  # what --amp and --dtype take
        assert ("'fp32'" in err) is (flag == "--dtype")  # and no more: amp is half precision


def test_the_timing_modes_reach_profile_and_compare(
    nets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --clock, --amp, --channels-last, --compile (profile and compare), --per-layer and
    # --no-correct-overhead (profile): each the keyword of the same name; none given, none set
    # (--amp takes dtype='s spellings: bf16 is passed as the name its choices spell)
    import importlib

    seen: list[dict] = []

    def spy(real):
        def call(*args, **kw):
            seen.append({k: kw[k] for k in kw if k in _MODES})
            return real(*args, **{**kw, "timing": False})

        return call

    _MODES = {"clock", "amp", "channels_last", "compile", "per_layer", "correct_overhead"}
    for name in ("profile", "compare"):  # the modules (the package's names are functions)
        module = importlib.import_module(f"modelprof.{name}")
        monkeypatch.setattr(module, name, spy(getattr(module, name)))
    flags = ["--clock", "cpu", "--amp", "bf16", "--channels-last", "--compile"]
    profile_flags = [*flags, "--per-layer", "stamps", "--no-correct-overhead"]
    assert main(["profile", f"{nets}:narrow", *profile_flags]) == 0
    assert main(["compare", f"{nets}:narrow", f"{nets}:wide", *flags]) == 0
    assert main(["profile", f"{nets}:narrow"]) == 0
    both = {"clock": "cpu", "amp": "bfloat16", "channels_last": True, "compile": True}
    assert seen == [{**both, "per_layer": "stamps", "correct_overhead": False}, both, {}]


def test_an_error_names_the_command_lines_flags_not_python_keywords(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from modelprof.cli import cli_words

    # fit's refusal of a size its forward fails at was said in the Python API's words
    # (input_size=(16,)); a Linear(8, 4) given 16 features fails on meta
    f = tmp_path / "flat.py"
    f.write_text("from torch import nn\ndef make():\n    return nn.Linear(8, 4)\n")
    assert main(["fit", f"{f}:make", "--input-size", "16"]) == 1  # the model failed to run
    err = capsys.readouterr().err
    assert "error: --input-size 16 (batch excluded)" in err and "input_size=" not in err
    # each keyword said as its flag; a value the user gave (budget_s=0.5) is left as it is
    said = cli_words(
        "pass batch_size=2 or more (backward=True), a larger budget_s= or dtype=torch.bfloat16; "
        "input_size=(3, 224, 224) failed; budget_s=0.5 is too short"
    )
    assert said == (
        "pass --batch-size 2 or more (--backward), a larger --budget or --dtype bfloat16; "
        "--input-size 3,224,224 failed; budget_s=0.5 is too short"
    )


def test_a_sweeps_errors_name_its_files_keys_not_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # a sweep has no --batch-size: its file's batch_sizes = [0] is refused in the file's words
    # (the run's own errors say their flags: test_an_error_names_the_command_lines_flags...)
    grid = tmp_path / "g.toml"
    grid.write_text('models = ["resnet18"]\nbatch_sizes = [0]\n')
    assert main(["sweep", str(grid), "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err
    assert "batch_size=0 must be an int >= 1" in err and "--batch-size" not in err
