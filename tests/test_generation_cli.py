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
    # 1e7 bytes hold ~19,000 tokens of 512 B, past the config's 2,048 positions: the limit binds
    assert "context <= 2048 tokens at batch 1 (the model's position limit)" in out
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
    # files written for a config file are named by it (its folder for a config.json), not
    # "config.json_generation.csv"
    small = tmp_path / "small.json"
    small.write_text(cfg.read_text())
    args = ["--device", "meta", "--prompt-len", "8", "--new-tokens", "2", "--format", "csv"]
    assert main(["generate", str(small), *args, "--out", str(tmp_path / "a")]) == 0
    assert main(["generate", str(cfg), *args, "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "small_generation.csv").exists()
    assert (tmp_path / "b" / f"{tmp_path.name}_generation.csv").exists()


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
        # an internal error (rc 1) from the cache of -1 layers before; an error in the
        # embedding, naming no vocab_size
        (TINY.replace("layers=2", "layers=-1"), "num_hidden_layers=-1 counts something and"),
        (TINY.replace("size=128", "size=0"), "vocab_size=0 leaves no token id to feed the model"),
    ],
)
def test_generate_bad_spec(spec, message, capsys):
    assert main(["generate", spec, "--no-timing"]) == 2
    assert message in capsys.readouterr().err


def test_fit_refuses_a_negative_count_in_a_spec_a_json_and_a_config(tmp_path, capsys):
    from transformers import LlamaConfig, LlavaConfig, ViltConfig

    from modelprof import ModelProfError, fit
    from modelprof.generation.specs import check_counts

    # fit printed a plan for the -1 layers (as 0) before
    assert main(["fit", "LlamaConfig:num_hidden_layers=-1"]) == 2
    assert "num_hidden_layers=-1 counts something" in capsys.readouterr().err
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_head": -2}))
    assert main(["fit", str(cfg)]) == 2
    assert "n_head=-2 counts something" in capsys.readouterr().err
    with pytest.raises(ModelProfError, match=r"fit\(\): LlamaConfig: num_hidden_layers=-1"):
        fit(LlamaConfig(num_hidden_layers=-1))
    check_counts(ViltConfig(), "Vilt")  # its own default num_images=-1 ("any") is no error
    # a sub-config's counts (a multimodal config's text model) went unchecked: named by key
    text = {"model_type": "llama", "num_hidden_layers": -1}
    cfg.write_text(json.dumps({"model_type": "llava", "text_config": text}))
    assert main(["fit", str(cfg)]) == 2
    assert "text_config.num_hidden_layers=-1 counts something" in capsys.readouterr().err
    vision = {"model_type": "clip_vision_model", "num_attention_heads": -2}
    with pytest.raises(ModelProfError, match=r"Llava: vision_config\.num_attention_heads=-2 "):
        check_counts(LlavaConfig(vision_config=vision), "Llava")
    check_counts(LlavaConfig(), "Llava")  # its sub-configs' own defaults are no error


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
    assert "--format '' names nothing" in capsys.readouterr().err  # an empty value


def test_generate_help_lists_only_what_it_uses(capsys):
    assert main(["generate", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--input-size" not in text and "--prompt-len" in text
    assert main(["profile", "--help"]) == 0
    assert "--input-size" in capsys.readouterr().out


def test_fit_and_generate_build_one_class_for_a_config(tmp_path, capsys):
    # one rule picks the auto class for both: a speech encoder-decoder its speech class
    # (Speech2Text has no num_mel_bins, which generate took as the sign: it built the text
    # class and failed), a vision-language decoder (LLaVA) its image-text one (generate tried
    # the causal-LM class only and refused it), a text encoder-decoder its Seq2SeqLM
    import torch
    import transformers

    from modelprof.fit import fit
    from modelprof.generation.specs import load_language_model

    small = {"hidden_size": 32, "intermediate_size": 32, "num_attention_heads": 2}
    speech = {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_ffn_dim": 32}
    configs = {
        "T5ForConditionalGeneration": transformers.T5Config(d_model=32, num_layers=1),
        "Speech2TextForConditionalGeneration": transformers.Speech2TextConfig(**speech),
        "LlavaForConditionalGeneration": transformers.LlavaConfig(
            text_config=transformers.LlamaConfig(num_hidden_layers=1, vocab_size=64, **small),
            vision_config=transformers.CLIPVisionConfig(num_hidden_layers=1, **small),
        ),
    }
    for built, config in configs.items():
        path = tmp_path / f"{built}.json"
        config.to_json_file(str(path))
        model, _ = load_language_model(str(path), device=torch.device("meta"))
        assert type(model).__name__ == built
        assert fit(config, context=8, training=False).model == built
    # LLaVA generates from text alone; Speech2Text's features modelprof cannot make up: one
    # line, not a traceback from deep in the encoder
    llava = str(tmp_path / "LlavaForConditionalGeneration.json")
    assert main(["generate", llava, "--device", "meta", "--prompt-len", "4"]) == 0
    s2t = str(tmp_path / "Speech2TextForConditionalGeneration.json")
    assert main(["generate", s2t, "--device", "meta", "--prompt-len", "4"]) == 2
    assert "no num_mel_bins: modelprof knows Whisper's layout" in capsys.readouterr().err


def test_generate_writes_each_batch_sizes_figures_untimed_too(tmp_path):
    pytest.importorskip("matplotlib")
    cfg = tmp_path / "tiny.json"
    cfg.write_text(
        json.dumps(
            {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64}
        )
    )
    args = ["--prompt-len", "4", "--new-tokens", "2", "--no-timing", "--format", "png"]
    out = tmp_path / "out"
    assert main(["generate", str(cfg), *args, "--batch-size", "1,2", "--out", str(out)]) == 0
    # the decode growth's bytes are counted: drawn without timing too; one figure per batch
    assert sorted(p.name for p in out.iterdir()) == [
        f"tiny_generation_batch{b}_{kind}.png"
        for b in (1, 2)
        for kind in ("decode_growth", "phase_share")
    ]


def test_generate_several_specs_compares_them(tmp_path, capsys):
    # two SPECs: compare_generation's table, one row each (the second named apart), its notes,
    # the models' specs named, and its files
    deeper = TINY.replace("num_hidden_layers=2", "num_hidden_layers=4")
    argv = ["generate", TINY, deeper, "--prompt-len", "8", "--new-tokens", "4", "--budget", "0.1"]
    assert main([*argv, "--out", str(tmp_path), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# generation comparison (baseline Llama;")
    rows = [line for line in out.splitlines() if line.startswith("| Llama")]
    assert [r.split("|")[1].strip() for r in rows] == ["Llama", "Llama (2)"]
    assert f"| Llama (2) | {deeper} |" in out and "note: ttft_x, tpot_x:" in out  # its source
    written = (tmp_path / "generation_comparison.csv").read_text().splitlines()
    assert len(written) == 3 and "ttft_x" in written[0]  # a header and a row per model


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--contexts", "2"], "--contexts profiles one model"),
        (["--no-layer-timing"], "--no-layer-timing profiles one model"),
        (["--batch-size", "1,2"], "--batch-size 1,2: several SPECs are compared at one"),
        (["--batch-size", ","], "--batch-size ',' has an empty item"),
        (["--memory", "0"], "--memory profiles one model"),
        (["--device", "meta"], "--device meta has no clock"),
        (["--format", "png"], "--format png: a comparison of SPECs has no figure"),
    ],
)
def test_generate_several_specs_refuses_one_model_options(flags, message, capsys):
    assert main(["generate", TINY, TINY, "--prompt-len", "8", *flags]) == 2
    assert message in capsys.readouterr().err


def test_generate_names_a_specs_row_only_where_its_label_differs(tmp_path, capsys, monkeypatch):
    # file.py:FACTORY rows are labelled with the SPEC itself: "model: lm.py:llama = lm.py:llama"
    # said nothing; a source column maps a row's label to its SPEC where one differs (as
    # compare's)
    (tmp_path / "lm.py").write_text(
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "def llama():\n"
        "    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64,\n"
        "        num_hidden_layers=1, num_attention_heads=2, vocab_size=64))\n"
    )
    monkeypatch.chdir(tmp_path)
    argv = ["generate", "lm.py:llama", TINY, "--prompt-len", "4", "--new-tokens", "2"]
    assert main([*argv, "--budget", "0.05"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:3] for line in out.splitlines() if line.startswith("| ")]
    # a file's factory by file and name (runtime.names.factory_name, as profile and compare
    # name it), the config by its class; each beside its SPEC (its source column)
    named = [[cell.strip() for cell in row] for row in rows[-2:]]
    assert named == [["lm_llama", "lm.py:llama"], ["Llama", TINY]]
    # and its files alike: the SPEC itself named them lm.py_llama_generation.*
    assert (
        main(
            [
                "generate",
                "lm.py:llama",
                "--prompt-len",
                "4",
                "--new-tokens",
                "2",
                "--budget",
                "0.05",
                "--no-layer-timing",
                "--out",
                "o",
                "--format",
                "csv",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["lm_llama_generation.csv"]
