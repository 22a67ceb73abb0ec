"""Every comma-separated flag of the command line reads its items by one rule (``comma_items``):
an empty item is a usage error naming the flag and the value. A trial's ``generate --batch-size
1,,2`` ran batches 1 and 2 and ``--contexts 8,,9`` contexts 8 and 9 (exit 0), where
``--batch-size 2,1,2`` is refused as a duplicate: a list typed wrong ran as another list."""

from __future__ import annotations

import pytest

import modelprof.generation
from modelprof.cli import comma_items, main, parse_formats, parse_input_arg
from modelprof.errors import ModelProfError

pytest.importorskip("transformers")

TINY = (
    "LlamaConfig:hidden_size=64,intermediate_size=96,num_hidden_layers=2,"
    "num_attention_heads=4,num_key_value_heads=2,vocab_size=128"
)


def _ran(*_a, **_k):
    raise AssertionError("a flag with an empty item reached profile_generation")


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--batch-size", "1,,2"),
        ("--batch-size", "1,2,"),
        ("--contexts", "8,,9"),
        ("--contexts", ",9"),
        ("--format", "csv,,md"),
    ],
)
def test_generate_refuses_an_empty_list_item_before_it_runs(
    flag, value, capsys, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(modelprof.generation, "profile_generation", _ran)
    argv = ["generate", TINY, "--prompt-len", "8", "--new-tokens", "2", "--no-timing"]
    assert main([*argv, flag, value]) == 2
    assert f"{flag} {value!r} has an empty item" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, flag, value",
    [
        ("profile", "--columns", "params,,macs"),
        ("profile", "--format", "md,"),
        ("compare", "--format", ",csv"),
    ],
)
def test_profile_and_compare_refuse_an_empty_list_item(
    command, flag, value, nets, capsys, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)  # (a run that went on would write its files here)
    models = [f"{nets}:narrow"] * (2 if command == "compare" else 1)
    assert main([command, *models, "--input-size", "10", "--no-timing", flag, value]) == 2
    assert f"{flag} {value!r} has an empty item" in capsys.readouterr().err


def test_one_rule_for_the_items_and_for_an_inputs_shape():
    assert comma_items("--format", " csv , md") == ["csv", "md"]
    assert parse_formats("CSV, markdown,csv,.png") == ("csv", "md", "png")
    for text in (",", "a,,b", "a,"):
        with pytest.raises(ModelProfError, match="has an empty item"):
            comma_items("--x", text)
    # an empty value names nothing: said so, not as a comma out of place
    with pytest.raises(ModelProfError, match="--x '' names nothing: give one item or more"):
        comma_items("--x", "")
    # an --input's shape by --input-size's rule: a doubled separator is no shape (it read 3x4)
    assert parse_input_arg("x:float32[3,4]").shape == (3, 4)
    assert parse_input_arg("t:int64[]:1").shape == ()  # one number per sample, as before
    with pytest.raises(ModelProfError, match="shape"):
        parse_input_arg("x:float32[3,,4]")
