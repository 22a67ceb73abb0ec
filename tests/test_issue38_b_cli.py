"""Issue 38 items 10 and 14 on the command line, the classes: one spelling of a flag and of its
values in every command (``--dtype bf16`` is fit's, the Python API's and every other command's
bfloat16; the old fit spellings stay aliases), a config that returns tuples is generated, and a
mistake is one ``modelprof: error:`` line, exit 2."""

from __future__ import annotations

import warnings

import pytest

from modelprof.cli import build_parser, main

COMMANDS = {
    "profile": ["profile", "resnet18"],
    "compare": ["compare", "resnet18", "resnet34"],
    "throughput": ["throughput", "resnet18"],
    "generate": ["generate", "LlamaConfig"],
}
LLAMA = (
    "LlamaConfig:vocab_size=64,hidden_size=16,intermediate_size=32,num_hidden_layers=1,"
    "num_attention_heads=2"
)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "given, dtype",
    [("bf16", "bfloat16"), ("BF16", "bfloat16"), ("fp16", "float16"), ("half", "float16")]
    + [("fp32", "float32"), ("float", "float32"), ("bfloat16", "bfloat16")],
)
def test_every_dtype_flag_takes_the_names_fit_takes(command, given, dtype):
    # before: fit --dtype bf16 ran while profile/compare/throughput/generate --dtype bf16 were
    # refused ("invalid choice: 'bf16'")
    args = build_parser().parse_args([*COMMANDS[command], "--dtype", given])
    assert args.dtype == dtype
    assert build_parser().parse_args(["fit", "X", "--dtype", given]).fit_dtype == given


def test_a_dtype_no_command_takes_is_one_line(capsys):
    assert main(["profile", "resnet18", "--dtype", "int8"]) == 2  # integers: no float to cast
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("modelprof: error: profile: argument --dtype")


@pytest.mark.parametrize(
    "new, old, value, dest",
    [
        ("--target", "--on", "A100 SXM 80GB", "fit_device"),
        ("--memory", "--memory-bytes", "8e9", "memory_bytes"),
        ("--dtype", "--fit-dtype", "float16", "fit_dtype"),
        ("--batch-size", "--batch", "4", "fit_batch"),
    ],
)
def test_fit_takes_the_common_spellings_and_keeps_the_old_ones(new, old, value, dest):
    parse = build_parser().parse_args
    assert getattr(parse(["fit", "X", new, value]), dest) == getattr(
        parse(["fit", "X", old, value]), dest
    )
    assert f"{new} " in build_parser()._subparsers._group_actions[0].choices["fit"].format_help()


def test_the_command_line_generates_a_config_that_returns_tuples(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(
            ["generate", LLAMA + ",return_dict=False", "--prompt-len", "3", "--new-tokens", "2"]
            + ["--no-timing"]
        )
    out = capsys.readouterr()
    # before: exit 2, "the forward pass failed in module '(root)' ... 'tuple' object has no
    # attribute 'last_hidden_state'"
    assert code == 0, out.err
    assert "LlamaForCausalLM" in out.out and "Traceback" not in out.err
