"""``modelprof generate SPEC``: config classes with overrides, config.json, bad specs."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from modelprof.cli import main
from modelprof.generation.specs import parse_overrides
from modelprof.render import read_json

TINY = (
    "LlamaConfig:hidden_size=64,intermediate_size=96,num_hidden_layers=2,"
    "num_attention_heads=4,num_key_value_heads=2,vocab_size=128"
)


def test_generate_without_a_terminal_prints_a_line_per_finished_step(capsys):
    # stderr captured: no terminal, no progress bar; per batch size a line when its phases are
    # counted (and timed per layer) and one when its generations are timed
    assert (
        main(
            [
                "generate",
                TINY,
                "--prompt-len",
                "8",
                "--new-tokens",
                "4",
                "--batch-size",
                "1,2",
                "--budget",
                "0.1",
            ]
        )
        == 0
    )
    lines = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("modelprof: batch")
    ]
    assert [line.split(": ")[1] for line in lines] == ["batch 1"] * 2 + ["batch 2"] * 2
    assert lines[0] == (
        "modelprof: batch 1: prefill and 3 decode steps counted and timed per layer"
    )  # decode at the first, middle and last step
    assert lines[1].startswith("modelprof: batch 1: ") and lines[1].endswith(" generations timed")


def test_parse_overrides():
    assert parse_overrides("a=1,b=x,c=[1, 2],d=1e-5") == {"a": 1, "b": "x", "c": [1, 2], "d": 1e-5}


def test_generate_config_class_counts_and_writes(tmp_path, capsys):
    code = main(
        [
            "generate",
            TINY,
            "--prompt-len",
            "8",
            "--new-tokens",
            "4",
            "--no-timing",
            "--target",
            "H100 SXM",
            "--memory",
            "1e7",
            "--out",
            str(tmp_path),
            "--format",
            "csv,json",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    # 2 x 2 layers x 2 KV heads x head_dim 16 x 4 bytes = 512 bytes per token
    assert "KV cache: 512 bytes/token (closed form 512)" in out
    assert "fits 10,000,000 bytes" in out
    _, _, doc = read_json(tmp_path / "Llama_generation.json")
    assert [p["phase"] for p in doc["phases"]] == ["prefill", "decode", "decode", "decode"]
    assert doc["target"]["device"] == "H100 SXM"
    assert (tmp_path / "Llama_generation_bound.csv").read_text().startswith("phase,context,")


def test_generate_config_json_on_meta(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128}
        )
    )
    assert (
        main(["generate", str(cfg), "--device", "meta", "--prompt-len", "8", "--new-tokens", "2"])
        == 0
    )
    assert "KV cache: 1,024 bytes/token" in capsys.readouterr().out


@pytest.mark.parametrize(
    "spec, message",
    [
        ("NoSuchConfig:a=1", "transformers has no NoSuchConfig"),
        ("LlamaConfig:hidden=64", "has no attribute 'hidden'"),
        ("LlamaConfig:64", "override '64' must be NAME=VALUE"),
        ("missing.json", "no such config file"),
        # a TypeError traceback from deep inside the model's construction before
        (
            "LlamaConfig:hidden_size=abc",
            "hidden_size='abc' must be an integer, like its default 4096",
        ),
        ("LlamaConfig:rms_norm_eps=tiny", "rms_norm_eps='tiny' must be a number"),
    ],
)
def test_generate_bad_spec(spec, message, capsys):
    assert main(["generate", spec, "--no-timing"]) == 2
    assert message in capsys.readouterr().err


def test_generate_times_a_tiny_model(capsys):
    assert (
        main(
            [
                "generate",
                TINY,
                "--prompt-len",
                "4",
                "--new-tokens",
                "3",
                "--batch-size",
                "1,2",
                "--no-layer-timing",
                "--budget",
                "0.2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "batch 1:" in out and "batch 2:" in out and "TPOT" in out


def test_generate_refuses_an_empty_format(capsys):
    assert main(["generate", TINY, "--no-timing", "--format", ""]) == 2
    assert "--format '' names no format" in capsys.readouterr().err


def test_generate_help_lists_only_what_it_uses(capsys):
    assert main(["generate", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--input-size" not in text and "--prompt-len" in text
    assert main(["profile", "--help"]) == 0
    assert "--input-size" in capsys.readouterr().out
