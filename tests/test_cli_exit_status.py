"""The command line's exit status and its failed models, as a shell-only user reads them: 2 for
what was typed wrong, 1 for a model that failed to run, the others done (a trial of the
``modelprof`` command alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelprof.cli import main


def test_throughput_goes_past_a_failed_model_naming_its_model_word(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # it stopped at the first failed model, named by its class, wrote nothing and exited 2
    out = tmp_path / "out"
    argv = [f"{nets}:broken", f"{nets}:narrow", "--max-batch", "1", "--budget", "0.02"]
    code = main(["throughput", *argv, "--out", str(out), "--format", "csv"])
    stdout, err = capsys.readouterr()
    assert code == 1  # a model failed to run; the other's curve is written
    assert f"{nets}:broken failed, no throughput measured: the forward pass failed" in err
    assert f"# {nets}:broken  failed" in stdout and "# nets_narrow" in stdout
    assert [p.name for p in out.iterdir()] == ["nets_narrow_throughput.csv"]
    # every model failed: the --out it made is left empty, so removed
    empty = tmp_path / "empty"
    argv = [f"{nets}:broken", "--max-batch", "1", "--out", str(empty), "--format", "csv"]
    assert main(["throughput", *argv]) == 1 and not empty.exists()


def test_a_model_that_fails_to_run_exits_1_a_refused_flag_2(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    # profile and an all-failed compare exited 2, the usage error's status, where a partly
    # failed compare or sweep exits 1
    assert main(["profile", f"{nets}:broken", "--no-timing"]) == 1
    assert main(["compare", f"{nets}:broken", "--no-timing"]) == 1
    assert "every model failed" in capsys.readouterr().err
    # what was typed wrong stays a usage error: a model name, a flag combination
    assert main(["profile", "resnet1", "--no-timing"]) == 2
    assert main(["profile", f"{nets}:narrow", "--dtype", "float64", "--amp", "bf16"]) == 2
    # throughput as profile: --tokens to a model that takes no token ids is what was typed, 2
    # (it was filed as a failed model, 1, once per model)
    assert main(["profile", f"{nets}:narrow", "--tokens", "8", "--no-timing"]) == 2
    assert main(["throughput", f"{nets}:narrow", "--tokens", "8", "--max-batch", "1"]) == 2


@pytest.mark.parametrize(
    "clash, said",
    [
        (["--dtype", "float64", "--amp", "bf16"], "--amp bfloat16 with --dtype float64"),
        (["--backward", "--compile"], "--compile with --backward"),
    ],
)
def test_flags_every_model_refuses_are_a_usage_error_before_any_model_is_built(
    clash: list[str], said: str, nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # compare built and ran each model, which refused the flags alike: exit 1, "every model
    # failed", the reason once per model; profile built its model before refusing them
    unbuilt = tmp_path / "unbuilt.py"
    unbuilt.write_text("def model():\n    raise RuntimeError('the model was built')\n")
    for command in (
        ["profile", f"{unbuilt}:model"],
        ["compare", f"{unbuilt}:model", f"{nets}:narrow"],
    ):
        assert main([*command, *clash, "--no-timing"]) == 2  # what was typed: a usage error
        err = capsys.readouterr().err
        assert said in err and "was built" not in err
    # models that would run otherwise: one refusal, not theirs each
    assert main(["compare", f"{nets}:narrow", f"{nets}:wide", *clash, "--no-timing"]) == 2
    err = capsys.readouterr().err
    assert err.count(said) == 1 and "every model failed" not in err


def test_an_optimizer_refused_by_name_or_by_the_parameters_shapes_is_a_usage_error(
    nets: Path, capsys: pytest.CaptureFixture
) -> None:
    # Muon takes 2-D parameters only: narrow's Linear(10, 20) has a (20,) bias, which its
    # constructor refuses whatever the run; it exited 1 (a failed model) after the counted
    # forward and backward, where LBFGS (needs a closure) is refused by name, 2
    for command in (["profile", "--no-timing"], ["throughput", "--max-batch", "1"]):
        argv = [command[0], f"{nets}:narrow", "--backward", "--optimizer", "muon", *command[1:]]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "optimizer=Muon refuses the parameters of Sequential (their shapes, before " in err
        assert "only supports 2D parameters" in err
    assert main(["profile", f"{nets}:narrow", "--backward", "--optimizer", "lbfgs"]) == 2
    # the names offered for a typo are those a step can run: LBFGS's refusal is by name alone
    # (SparseAdam and Muon stay: each runs a model whose gradients, or shapes, suit it)
    assert main(["profile", f"{nets}:narrow", "--backward", "--optimizer", "adamx"]) == 2
    offered = capsys.readouterr().err.split("use one of ")[1]
    assert "'lbfgs'" not in offered and "'muon'" in offered and "'sparseadam'" in offered


def test_trust_pickle_is_read_by_generate_and_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # generate took --trust-pickle (a common option) and ignored it, and fit had no such flag,
    # though both refused a pickled module with "If you trust the file, pass --trust-pickle"
    import torch
    from torch import nn

    saved = tmp_path / "m.pt"
    torch.save(nn.Sequential(nn.Linear(8, 16)), saved)
    assert main(["fit", str(saved), "--input-size", "8", "--memory", "1GB"]) == 2
    assert "pass --trust-pickle" in capsys.readouterr().err
    # trusted, it loads: fit answers (Linear(8, 16): 8 * 16 + 16 = 144 parameters, counted)
    argv = ["fit", str(saved), "--trust-pickle", "--input-size", "8", "--memory", "1GB"]
    assert main(argv) == 0
    assert "144" in capsys.readouterr().out
    # generate loads it too, then refuses it for what it is: no causal LM
    assert main(["generate", str(saved), "--trust-pickle", "--no-timing"]) == 2
    err = capsys.readouterr().err
    assert "builds a Sequential, not a transformers causal LM" in err
    assert "pass --trust-pickle" not in err


def test_compare_on_meta_counts_and_says_so_throughput_there_is_refused_unbuilt(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # with timing left on, each model was built, then failed "--device meta has no clock:
    # pass timing=False ...", exit 1; profile on meta counts only, with a note, as compare now
    assert main(["compare", f"{nets}:narrow", f"{nets}:wide", "--device", "meta"]) == 0
    stdout, err = capsys.readouterr()
    # Linear(10, 20), Linear(10, 40) at batch 1: 10 * 20 = 200 and 10 * 40 = 400 MACs (the
    # 6th cell: model, source, input shape, params, MACs)
    macs = {r.split("|")[1].strip(): r.split("|")[5].strip() for r in stdout.splitlines()[4:6]}
    assert macs == {"nets_narrow": "200", "nets_wide": "400"} and "has no clock" not in err
    assert stdout.count("note: --device meta: counted from shapes alone, not timed") == 1
    # a throughput search times real runs: refused as typed (2), before any model is built
    unbuilt = tmp_path / "unbuilt.py"
    unbuilt.write_text("def model():\n    raise RuntimeError('the model was built')\n")
    argv = ["compare", f"{unbuilt}:model", f"{nets}:narrow", "--device", "meta", "--throughput"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--device meta has no clock: --throughput times real runs" in err
    assert "was built" not in err and "every model failed" not in err


def test_generate_names_a_model_that_is_no_causal_lm_with_its_article(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # errors.a_type names a type with its article (1ca7608); this message wrote 'a {name}' by
    # hand: 'builds a Identity' (efficientnet_b0: 'builds a EfficientNet')
    import torch
    from torch import nn

    saved = tmp_path / "m.pt"
    torch.save(nn.Identity(), saved)
    assert main(["generate", str(saved), "--trust-pickle", "--no-timing"]) == 2
    assert "SPEC" in (err := capsys.readouterr().err)
    assert "builds an Identity, not a transformers causal LM" in err
