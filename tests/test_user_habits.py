"""Habits users bring from torchinfo, thop and calflops: a tensor, tuple or
dict in ``profile``'s second position is the inputs; ``device="meta"`` alone counts; a size
that includes the batch gets a hint."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from modelprof import profile
from modelprof.cli import main
from modelprof.errors import ModelProfError


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(y)


def test_tensor_in_second_position_is_the_input() -> None:
    m = nn.Linear(4, 3)
    x = torch.randn(5, 4)
    r = profile(m, x, timing=False)
    assert r.batch_size == 5 and r.input_shape == "5x4"
    # 5 rows x 4 x 3 = 60 MACs: the tensor itself went in, not a size made from it
    assert r.totals["macs"] == 60


def test_tuple_and_dict_in_second_position() -> None:
    m = TwoInputs()
    x, y = torch.randn(2, 4), torch.randn(2, 6)
    by_tuple = profile(m, (x, y), timing=False)
    by_dict = profile(m, {"x": x, "y": y}, timing=False)
    # 2*4*3 + 2*6*3 = 24 + 36 = 60
    assert by_tuple.totals["macs"] == by_dict.totals["macs"] == 60


def test_a_list_for_two_arguments_gets_a_hint_and_a_list_argument_none() -> None:
    # a list is one argument (a detection model's images): forward(x, y) given [x, y] misses y
    m = TwoInputs()
    x, y = torch.randn(2, 4), torch.randn(2, 6)
    for call in (lambda: profile(m, [x, y], timing=False), lambda: profile(m, inputs=[x, y])):
        with pytest.raises(ModelProfError, match="missing 1 required positional") as err:
            call()
        assert "hint: a list is one argument" in str(err.value)
        assert "inputs=(x, y)" in str(err.value)

    class Summed(nn.Module):  # takes the list itself; a failure in it is not about the list
        def forward(self, xs: list) -> torch.Tensor:
            return torch.stack(xs).sum(0) @ torch.ones(5, 1)  # 4 columns against 5 rows

    with pytest.raises(ModelProfError) as err:
        profile(Summed(), [x, x], timing=False)
    assert "hint" not in str(err.value)

    def pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    class Helper(nn.Module):  # takes the list; a helper inside it is called wrongly
        def forward(self, xs: list) -> torch.Tensor:
            return pair(xs[0])  # pair() missing 1 required positional argument: 'b'

    with pytest.raises(ModelProfError, match="positional argument") as err:
        profile(Helper(), [x, x], timing=False)
    assert "\nhint:" not in str(err.value)  # the forward took the list: not about the list


def test_another_tools_name_for_the_inputs_is_pointed_to_ours() -> None:
    # torchinfo's summary(model, input_data=x): a newcomer got only the list of timing options
    with pytest.raises(ModelProfError) as err:
        profile(nn.Linear(4, 3), input_data=torch.randn(2, 4))
    assert str(err.value).startswith("input_data= is inputs= here; unknown keyword(s)")


def test_errors_show_shapes_not_tensor_values() -> None:
    x = torch.arange(4000.0).reshape(1000, 4)
    with pytest.raises(ModelProfError) as err:
        profile(nn.Linear(4, 3), x, inputs=x, timing=False)
    text = str(err.value)
    assert "Tensor[1000x4, float32]" in text
    assert "tensor(" not in text and "3999" not in text and len(text) < 400


def test_meta_device_alone_counts_and_says_so() -> None:
    r = profile(nn.Linear(4, 3), (4,), device="meta")  # timing left at its default
    assert not r.timed and r.device == "meta"
    assert r.totals["macs"] == 12  # 4 * 3
    assert any("meta" in n and "not timed" in n for n in r.timing_notes)
    assert "note: device='meta'" in r.summary()


def test_size_with_the_batch_gets_a_hint() -> None:
    with pytest.raises(ModelProfError) as err:
        profile(nn.Conv2d(3, 4, 3), (1, 3, 8, 8), timing=False)
    text = str(err.value)
    assert "excludes the batch" in text and "(3, 8, 8)" in text


def test_cli_size_with_the_batch_gets_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "conv.py"
    f.write_text(
        textwrap.dedent("""
        from torch import nn
        def build():
            return nn.Conv2d(3, 4, 3)
    """)
    )
    assert main(["profile", f"{f}:build", "--input-size", "1,3,8,8", "--no-timing"]) == 1
    err = capsys.readouterr().err
    assert "conv2d" in err  # the model's own error stays
    assert "pass --input-size 3,8,8 --batch-size 1" in err
    # a size a dimension short was hinted in the Python API's words, "(3, 224, 224)"
    assert main(["profile", f"{f}:build", "--input-size", "3x8", "--no-timing"]) == 1
    err = capsys.readouterr().err
    assert (
        "\nhint: --input-size holds every dimension but the batch (--batch-size sets it): "
        "--input-size 3x8 gave the model 1x3x8, which the convolution read"
    ) in err
    assert "e.g. --input-size 3,224,224)" in err and "input_size" not in err


def test_no_hint_when_the_failure_is_not_about_the_batch() -> None:
    # a 1-D size cannot hold a batch: the plain error, no hint
    with pytest.raises(ModelProfError) as err:
        profile(nn.Linear(5, 3), (4,), timing=False)
    assert "\nhint:" not in str(err.value)


def test_no_hint_when_the_loss_or_the_call_fails_not_the_shapes() -> None:
    # the forward ran on a 2-D sample size (which could hold a batch); the loss refused the
    # target: no batch dimension would change that
    with pytest.raises(ModelProfError, match="loss_fn=cross_entropy") as err:
        profile(
            nn.Linear(4, 3),
            (5, 4),
            batch_size=2,
            backward=True,
            loss_fn=nn.functional.cross_entropy,
            target=torch.full((2, 5), 7),  # a target cross_entropy refuses for this output
            timing=False,
        )
    assert "\nhint:" not in str(err.value)
    assert "on the output of Linear (a Tensor[2x5x3, float32])" in str(err.value)

    # a forward that takes one input, given two: a TypeError, not a shape
    class One(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ModelProfError, match="TypeError") as err:
        profile(One(), [(2, 4), (2, 4)], timing=False)
    assert "\nhint:" not in str(err.value)


def test_warnings_point_at_the_users_line() -> None:
    # however deep in modelprof a warning is raised (the LaTeX writer behind the format
    # registry, the counting pass), Python names the user's line that called in
    class Boxes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module("层", nn.Linear(4, 4))  # a name pdflatex cannot set

        def forward(self, x):
            boxes = torch.cat([x[:, :2], x[:, :2] + 1], dim=1)  # x1, y1, x1 + 1, y1 + 1
            return torchvision.ops.nms(boxes, getattr(self, "层")(x)[:, 0], 0.5)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = profile(Boxes(), (4,), batch_size=3, timing=False)  # nms: no formula
        report.to_latex()
    said = {str(w.message)[:40]: w.filename for w in caught}
    assert any("no formula" in m for m in said) and any("LaTeX" in m for m in said)
    assert set(said.values()) == {__file__}


class _TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 8)

    def forward(self, input_ids):
        return self.embed(input_ids)


def test_an_embedding_that_refuses_its_input_says_what_it_needs() -> None:
    # an input size makes float noise: the Embedding wants token ids, and the error says how
    with pytest.raises(ModelProfError, match="integer token ids.*token_inputs") as err:
        profile(_TinyLM(), (32,), timing=False)
    assert "Embedding" in str(err.value)
    # ids past the table: how many rows it has and how far the ids reach
    ids = torch.full((1, 32), 4000)
    with pytest.raises(
        ModelProfError, match="the Embedding has 1000 rows; the integer inputs reach 4000"
    ):
        profile(_TinyLM(), inputs=ids, timing=False)
    assert profile(_TinyLM(), inputs=ids.clamp(max=999), timing=False).totals["params"] == 8000


def test_a_failed_forward_names_the_inputs_dtypes() -> None:
    # a uint8 image into a float conv: torch's "Byte ... Float" and the inputs' own dtype
    image = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    with pytest.raises(ModelProfError, match=r"Inputs were 1x3x8x8 \(uint8\)\."):
        profile(nn.Conv2d(3, 4, 3), inputs=image, timing=False)


def test_no_batch_hint_for_a_channel_count_or_a_missing_dimension() -> None:
    # (4, 8, 8) gives conv2d 4 channels where it takes 3, and (8, 8) leaves the channel out:
    # neither is fixed by taking a batch off the size, so no hint points that way; (1, 3, 8, 8)
    # gives it a 5-D input where it takes at most 4-D, and is hinted (the test above)
    with pytest.raises(ModelProfError) as err:
        profile(nn.Conv2d(3, 4, 3), (4, 8, 8), timing=False)
    assert "\nhint:" not in str(err.value)
    # (8, 8) made 1x8x8, which conv2d reads as one unbatched 1-channel image ("expected
    # input[1, 1, 8, 8] to have 3 channels"): said to be a dimension short, not a batch
    # (a newcomer's profile(mobilenet, (3, 64)) had no hint at all)
    with pytest.raises(ModelProfError) as err:
        profile(nn.Conv2d(3, 4, 3), (8, 8), timing=False)
    text = str(err.value)
    assert "\nhint: input_size holds every dimension but the batch: (8, 8) gave" in text
    assert "a dimension short" in text and "excludes the batch" not in text


def test_on_meta_the_batch_hint_only_for_a_batch_left_in_the_size() -> None:
    # meta kernels word a size that does not fit "a and b must have same reduction dim"
    # (Linear) and "Invalid channel dimensions" (conv2d): read as a dimension count, they got
    # "pass (20,) (and batch_size=2)", which fails as well; fit counts on meta
    for model, size in ((nn.Linear(10, 5), (2, 20)), (nn.Conv2d(3, 4, 3), (4, 8, 8))):
        with pytest.raises(ModelProfError, match="forward pass failed") as err:
            profile(model, size, device="meta")
        assert "\nhint:" not in str(err.value), size
    # (1, 3, 8, 8) is a batch left in: conv2d given 5-D where it takes at most 4-D
    with pytest.raises(ModelProfError) as err:
        profile(nn.Conv2d(3, 4, 3), (1, 3, 8, 8), device="meta")
    assert "\nhint: input_size excludes the batch dimension" in str(err.value)
    assert "pass (3, 8, 8) (and batch_size=1)" in str(err.value)


def test_a_tensor_without_its_batch_gets_a_hint() -> None:
    # a newcomer's profile(resnet, torch.randn(3, 224, 224)) failed in bn1 ("expected 4D
    # input (got 3D input)") with no word of the batch; conv2d takes the unbatched sample
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    sample = torch.randn(3, 8, 8)
    for given in ({"input_size": sample}, {"inputs": sample}):
        with pytest.raises(ModelProfError) as err:
            profile(model, timing=False, **given)
        assert "expected 4D input (got 3D input)" in str(err.value)
        assert "\nhint: tensors given are used as they are, batch included" in str(err.value)
    # with it, it runs: Conv2d(3, 4, 3) at 8 x 8, 6 x 6 x 4 outputs x 27 = 3,888 MACs (the
    # BatchNorm2d row's MACs column reads none)
    assert profile(model, inputs=sample[None], timing=False).totals["macs"] == 3_888
    # a batch given whole, made 3-D by the model itself: the tensor as given is not short
    made = nn.Sequential(nn.Linear(8, 8), nn.Unflatten(1, (8, 1)), nn.BatchNorm2d(8))
    with pytest.raises(ModelProfError, match="got 3D input") as err:
        profile(made, inputs=torch.randn(2, 8), timing=False)
    assert "\nhint:" not in str(err.value)
    # a tensor of the wrong channel count is no batch's doing: no hint
    with pytest.raises(ModelProfError) as err:
        profile(model, inputs=torch.randn(1, 4, 8, 8), timing=False)
    assert "\nhint:" not in str(err.value)


def test_a_dtype_mismatch_says_both_dtypes_and_dtype_fixes_it() -> None:
    # a bfloat16 model fed float32 (and a float32 one fed float64) got torch's bare "Input type
    # ... and weight type ... should be the same"; now the two dtypes and the fix
    conv = nn.Sequential(nn.Conv2d(3, 4, 3))
    for model, x, want, got in (
        (conv.to(torch.bfloat16), torch.randn(1, 3, 8, 8), "bfloat16", "float32"),
        (nn.Sequential(nn.Conv2d(3, 4, 3)), torch.randn(1, 3, 8, 8).double(), "float32", "float64"),
    ):
        with pytest.raises(ModelProfError) as err:
            profile(model, x, timing=False)
        assert (
            f"\nhint: the inputs are {got} and the model's parameters {want}: pass "
            f"dtype=torch.{want}"
        ) in str(err.value)
        # the fix it names runs: 6 x 6 x 4 outputs x 27 = 3,888 MACs
        assert profile(model, x, dtype=getattr(torch, want), timing=False).totals["macs"] == 3_888


def test_batch_norm_at_batch_one_in_a_training_step_hints_the_batch() -> None:
    # backward=True trains: BatchNorm1d refuses one value per channel, with no word of why
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    with pytest.raises(ModelProfError) as err:
        profile(model, (16,), backward=True, timing=False)
    assert "in train mode" in str(err.value) and "pass batch_size=2 or more" in str(err.value)
    # training=True without a backward trains too: the hint names it beside backward=True
    with pytest.raises(ModelProfError) as err:
        profile(model, (16,), training=True, timing=False)
    assert "a training step or count: backward=True, training=True" in str(err.value)
    # at batch 2 it runs: 2 x (16 x 32 + 32 x 4) = 1,280 MACs in the Linear layers' forward
    r = profile(model, (16,), batch_size=2, backward=True, timing=False)
    assert r.totals["macs"] == 1_280


def test_cli_batch_norm_at_batch_one_is_hinted_in_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # --backward at the default batch 1: the hint names the flags, not backward=/batch_size=
    f = tmp_path / "mlp.py"
    f.write_text(
        "from torch import nn\nINPUT_SIZE = (16,)\n"
        "def build():\n    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32))\n"
    )
    assert main(["profile", f"{f}:build", "--backward", "--no-timing"]) == 1  # the model failed
    err = capsys.readouterr().err
    said = "the model ran in train mode (a training step or count: --backward, fit's training"
    assert said in err and "training=True" not in err
    assert err.rstrip().endswith("pass --batch-size 2 or more") and "batch_size=" not in err
    # fit's training plans meet it too (a warning: no activations counted), in the same words
    assert main(["fit", f"{f}:build"]) == 0
    err = capsys.readouterr().err
    assert said in err and "training=True" not in err and "batch_size=" not in err
    assert "pass --batch-size 2 or more (ModelProfWarning)" in err
    assert main(["profile", f"{f}:build", "--backward", "--no-timing", "--batch-size", "2"]) == 0
    # 2 x 16 x 32 = 1,024 MACs in the Linear (the BatchNorm1d's read none in MACs)
    assert "MACs 1,024" in capsys.readouterr().out


def test_the_dtype_hint_reads_a_root_that_tests_false() -> None:
    # a root module with __len__ 0 (an empty container's rule) is still the model whose float64
    # parameters the float32 inputs missed: the hint was skipped for it (``if model``)
    class Empty(nn.Sequential):
        def __len__(self) -> int:
            return 0

    model = Empty(nn.Linear(4, 2)).double()
    assert not model
    with pytest.raises(ModelProfError) as err:
        profile(model, torch.randn(1, 4), timing=False)
    assert "the inputs are float32 and the model's parameters float64" in str(err.value)


def test_cli_says_its_flags_in_optimizer_backward_and_file_size_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # every message the command line prints names its flags, never the Python API's keywords
    # (optimizer='adamx', backward=False, input_size=): a trial met each of these
    f = tmp_path / "nets.py"
    f.write_text(
        "from torch import nn\nINPUT_SIZE = (8,)\n"
        "def bare():\n    return nn.Sequential(nn.ReLU())\n"
        "def lin():\n    return nn.Sequential(nn.Linear(10, 4))\n"
    )
    args = ["--no-timing", "--backward"]
    assert main(["profile", f"{f}:lin", *args, "--input-size", "10", "--optimizer", "adamx"]) == 2
    err = capsys.readouterr().err
    assert "--optimizer adamx is not a torch.optim optimizer; use one of [" in err
    assert "optimizer=" not in err and "a class or a factory" not in err
    assert main(["profile", f"{f}:bare", *args]) == 2  # no parameters: no step
    err = capsys.readouterr().err
    assert "drop --backward" in err and "backward=False" not in err
    # fit at the file's INPUT_SIZE (8,), which the Linear(10, 4) refuses: its size is the
    # file's, not a --input-size the user gave, and the fallback's own advice is a flag
    assert main(["fit", f"{f}:lin"]) == 0
    err = capsys.readouterr().err
    assert "at the spec's own input size (8, not a --input-size given)" in err
    assert "pass --input-size, batch excluded" in err and "input_size=" not in err


def test_cli_batch_hint_names_a_files_input_size_as_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # a file's INPUT_SIZE holding the batch: (1, 3, 8, 8) gives the conv 1x1x3x8x8; the hint
    # says the size is the file's and the fix in flags (--input-size 3,8,8 --batch-size 1)
    f = tmp_path / "conv.py"
    f.write_text(
        "from torch import nn\nINPUT_SIZE = (1, 3, 8, 8)\n"
        "def build():\n    return nn.Sequential(nn.Conv2d(3, 4, 3))\n"
    )
    assert main(["profile", f"{f}:build", "--no-timing"]) == 1  # the model failed to run
    err = capsys.readouterr().err
    assert "the spec's own input size (its file's INPUT_SIZE 1,3,8,8) was taken" in err
    assert "pass --input-size 3,8,8 --batch-size 1" in err and "(3, 8, 8)" not in err


def test_generate_and_fit_say_their_flags_in_errors(capsys: pytest.CaptureFixture) -> None:
    # a shell-only trial read prompt_len=0, tp=3, device='H999' (fit's --target) and
    # baseline='nosuch' where each command takes a flag: the messages name the flag
    spec = (
        "LlamaConfig:num_hidden_layers=1,hidden_size=64,intermediate_size=128,"
        "num_attention_heads=4,num_key_value_heads=2,vocab_size=1000"
    )
    said = {
        ("generate", spec, "--prompt-len", "0", "--no-timing"): "--prompt-len 0 must be",
        ("generate", spec, "--new-tokens", "0", "--no-timing"): "--new-tokens 0 must be",
        ("fit", spec, "--tp", "3"): "--tp 3 does not split the 4 attention heads",
        ("fit", spec, "--ranks", "0"): "--ranks 0 must be",
        ("fit", spec, "--target", "H999"): "--target H999 is not in the datasheet table",
        ("fit", spec, "--dtype", "int8"): "--dtype int8 is not understood",
        ("compare", "resnet18", "resnet34", "--no-timing", "--baseline", "nosuch"): (
            "--baseline nosuch is not one of the models"
        ),
    }
    for args, words in said.items():
        assert main(list(args)) == 2
        err = capsys.readouterr().err
        assert words in err and "='" not in err and "_len=" not in err, (args, err)
