"""A transformers config spec given to a command that takes none, or misspelt, is named as one
in one line ("did you mean LlamaConfig"), not reported as an unknown torchvision name."""

from __future__ import annotations

import pytest

from modelprof.cli import main

pytest.importorskip("transformers")


def _one_error_line(capsys, args):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelprof: error: ")
    return err[0]


@pytest.mark.parametrize("command", ["profile", "compare", "generate", "fit"])
def test_a_misspelt_config_class_says_which_it_resembles(capsys, command):
    args = [command, "LlamaConfg:hidden_size=64"] + (["resnet18"] if command == "compare" else [])
    line = _one_error_line(capsys, args)
    assert "LlamaConfg" in line and "did you mean LlamaConfig" in line
    assert "torchvision.models.list_models" not in line


@pytest.mark.parametrize("spec", ["LlamaConfig:hidden_size=64", "LlamaConfig:rms_norm_eps=0.5"])
def test_a_config_given_to_profile_is_said_to_be_one(capsys, spec):
    # "rms_norm_eps=0.5" ends in what a path would call the suffix ".5": still a config spec
    line = _one_error_line(capsys, ["profile", spec])
    assert f"model '{spec}' is a transformers config" in line
    assert "`modelprof generate` and `modelprof fit`" in line
