"""What the command line says to a user of the ``modelprof`` command alone: its flags and the
MODEL words typed, never a Python keyword or class the shell cannot reach."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import MLP_NETS

from modelprof.cli import FORMATS, main


def test_a_column_its_flags_leave_unfilled_names_the_flag(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    # it said "unknown column(s)", listing the others, after the whole profile had run
    argv = ["profile", f"{nets}:narrow", "--no-timing", "--columns"]
    assert main([*argv, "module,saved_bytes"]) == 2
    assert (
        "column(s) ['saved_bytes'] are a training step's: add --backward" in capsys.readouterr().err
    )
    assert main([*argv, "module,latency_ms", "--backward"]) == 2
    assert "column(s) ['latency_ms'] are measured: drop --no-timing" in capsys.readouterr().err


def test_generate_on_a_model_no_causal_lm_names_what_generate_takes(
    capsys: pytest.CaptureFixture,
) -> None:
    # it advised the Python API's step=lambda tokens, cache: ..., which no flag passes, and
    # named the class built (ResNet) alone, not the SPEC typed; several SPECs compared one as
    # a failed row (exit 1) in the Python API's words
    llama = "LlamaConfig:num_hidden_layers=1,hidden_size=32,num_attention_heads=2"
    for specs in (["resnet18", "--device", "meta"], ["resnet18", llama, "--batch-size", "1"]):
        assert main(["generate", *specs]) == 2  # what was typed: a usage error
        err = capsys.readouterr().err
        assert "SPEC 'resnet18' builds a ResNet, not a transformers causal LM" in err
        assert "generate takes a transformers causal LM, a config SPEC" in err
        assert "step=" not in err and "failed" not in err


def test_fit_on_a_token_id_model_outside_transformers_names_fits_own_way(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # it pointed to --tokens N (and Python's inputs=), which fit does not take
    f = tmp_path / "ids.py"
    f.write_text(
        "from torch import nn\ndef build():\n    return nn.Sequential(nn.Embedding(100, 8))\n"
    )
    assert main(["fit", f"{f}:build", "--input-size", "16", "--inference-only"]) == 1
    err = capsys.readouterr().err
    assert "--tokens" not in err and "pass inputs=" not in err
    assert "fit feeds token ids to a model with a transformers config alone" in err
    assert "leave --input-size out to count its weights and training state alone" in err


def test_fit_says_the_model_typed_and_lists_its_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # its head said the class (Sequential) where its files say the MODEL's name (nets_narrow);
    # its --format help listed no format
    f = tmp_path / "nets.py"
    f.write_text(MLP_NETS)
    argv = ["fit", f"{f}:narrow", "--memory", "1GB", "--out", str(tmp_path), "--format", "csv"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "; model nets_narrow (Sequential), " in out.splitlines()[0]
    assert f"wrote {tmp_path / 'nets_narrow_fit.csv'}" in err
    assert main(["fit", "--help"]) == 0
    tables = ",".join(f for f in FORMATS if f != "png")  # fit draws no figure
    assert f"formats to write: {tables} (implies" in " ".join(capsys.readouterr().out.split())


def test_the_printed_profile_says_what_the_latency_share_is_of(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    # the (root) row's 99.89 % stood unexplained under the table
    assert main(["profile", f"{nets}:narrow", "--budget", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "latency share" in out  # the column the note explains is printed
    assert (
        "note: latency share is a row's median over the median instrumented pass, timed from "
        "outside the model's call: (root)'s falls short of 100 % by" in out
    )
    assert main(["profile", f"{nets}:narrow", "--no-timing"]) == 0  # no share, no note
    assert "latency share" not in capsys.readouterr().out
