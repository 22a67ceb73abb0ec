"""Exported programs keep their layers: ``torch.export`` programs (the ``ExportedProgram``, the
flat graph of its ``.module()``, a ``.pt2`` archive) profile as one row per layer call, named and
typed as in the eager model, with the eager model's counts."""

from __future__ import annotations

import re
import warnings

import pandas as pd
import pytest
import torch
from helpers import tv
from torch import nn

from modelprof import profile
from modelprof.runtime.exported import exported_layers, is_flat_export


def _frame(model, **inputs) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return profile(model, timing=False, **inputs).to_dataframe().reset_index(drop=True)


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    model = tv("resnet18")
    x = torch.randn(1, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, x, torch.export.export(model, (x,))


def test_an_exported_resnet18_has_the_eager_rows(resnet18):
    model, x, program = resnet18
    eager = _frame(model, inputs=x)
    assert len(eager) == 84  # every module call of resnet18, as the eager table has them
    # every column equal: names, types (Conv2d, not InterpreterModule), calls, shapes, params,
    # MACs (148,557,824 at 64x64: 1.814 G x (64/224)^2 rounded by the stride), bytes
    pd.testing.assert_frame_equal(_frame(program, inputs=x), eager)
    assert eager.loc[0, "macs"] == 148_557_824


def test_the_flat_graph_of_module_gets_its_layers_back(resnet18):
    model, x, program = resnet18
    flat = program.module()
    assert is_flat_export(flat) and not is_flat_export(model)
    pd.testing.assert_frame_equal(_frame(flat, inputs=x), _frame(model, inputs=x))


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_an_exported_llama_has_the_eager_rows():
    pytest.importorskip("transformers")
    model = _tiny_llama()
    kwargs = {"input_ids": torch.randint(0, 128, (1, 8)), "use_cache": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (), kwargs)
    eager, exported = _frame(model, inputs=kwargs), _frame(program, inputs=kwargs)
    assert len(eager) == len(exported) == 39
    counted = [
        "module",
        "type",
        "call",
        "depth",
        "leaf",
        "params",
        "trainable_params",
        "macs",
        "macs_pct",
    ]
    pd.testing.assert_frame_equal(exported[counted], eager[counted])
    # the exported program builds its causal mask as a tensor (traced from the mask code)
    # where the eager model passes is_causal: more elementwise FLOPs in the model's own row and
    # the attentions' own rows (a masked SDPA), and the same everywhere else
    masked = exported["module"].str.endswith("(self)") & exported["type"].isin(
        ["LlamaModel", "LlamaAttention"]
    )
    assert masked.sum() == 3
    assert (exported.loc[masked, "flops"] > eager.loc[masked, "flops"]).all()
    same = ["flops", "madd"]
    pd.testing.assert_frame_equal(
        exported.loc[~masked & eager["leaf"], same], eager.loc[~masked & eager["leaf"], same]
    )
    # per layer: q 32x32 + k, v 32x16 + o 32x32 = 3,072 weights x 8 tokens = 24,576 MACs and
    # the scores and values 2 x 8x8 pairs x 4 heads x 8 dims = 4,096; MLP 3 x 32x64 x 8 =
    # 49,152; lm_head 32x128 x 8 = 32,768: 2 x 77,824 + 32,768 = 188,416
    assert exported.loc[0, "macs"] == 188_416
    assert exported.loc[0, "type"] == "LlamaForCausalLM"
    # the program hands each layer the tensors it uses and takes back those used later, so
    # the shapes and bytes around a layer may differ (the rotary embedding gets the positions,
    # not the hidden states; a norm also hands on its input); a Linear's are the eager ones
    linear = eager["type"] == "Linear"
    around = ["input_shape", "output_shape", "read_bytes", "write_bytes"]
    pd.testing.assert_frame_equal(exported.loc[linear, around], eager.loc[linear, around])


def test_other_modules_come_back_as_they_are():
    model = nn.Linear(2, 3)
    assert exported_layers(model) is model
    assert exported_layers(model, ((torch.ones(1, 2),), {})) is model
    assert not is_flat_export(torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 3))))


def test_a_fixed_batch_refused_by_the_program_gets_no_batch_hint():
    from modelprof import ModelProfError

    # exported at batch 1, its guard refuses batch 4 and asks for dynamic_shapes: no
    # batch_size/input_size hint (a newcomer's read "pass (32, 32) (and batch_size=3)")
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (torch.randn(1, 3, 8, 8),))
    with pytest.raises(ModelProfError) as e:
        profile(program, (3, 8, 8), batch_size=4, timing=False)
    assert "shape 1x3x8x8 (as recorded); given 4x3x8x8" in str(e.value)
    assert "hint:" not in str(e.value)
    # a size the program was exported at runs: Conv2d(3, 4, 3) at 8 x 8, 6 x 6 outputs x 4
    # channels x 3 x 9 = 3,888 MACs
    assert profile(program, (3, 8, 8), timing=False).totals["macs"] == 4 * 3 * 9 * 36


def _flat_program():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return x, torch.export.export(model, (x,))


def _counted(module: nn.Module) -> list[int]:
    """A count of ``module``'s calls, kept up by a forward hook."""
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.fixture
def module_calls(monkeypatch):
    """The call counts of every ``ExportedProgram.module()`` made while the test runs."""
    made: list[list[int]] = []
    module = torch.export.ExportedProgram.module

    def counted_module(self, *args, **kwargs):
        flat = module(self, *args, **kwargs)
        made.append(_counted(flat))
        return flat

    monkeypatch.setattr(torch.export.ExportedProgram, "module", counted_module)
    return made


def _timed(model, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return profile(model, x, budget_s=0.2, roofline=False, **kw)


@pytest.mark.parametrize("training", [False, True])
def test_the_clean_runs_of_a_flat_graph_call_the_graph_passed(training):
    # the per-layer passes need the layers (the graph exported again and unflattened, which
    # runs slower); the end-to-end latency is of the flat graph the user passed and runs
    x, program = _flat_program()
    flat = program.module()
    calls = _counted(flat)
    report = _timed(flat, x, training=training)
    assert calls[0] >= report.latency.n  # every clean sample ran the user's graph
    assert len(report.to_dataframe()) == 4  # (root), two Linear and ReLU: the layers' rows
    assert any("ran the exported program unflattened" in n for n in report.timing_notes)
    assert report.timing_agreement.regimes == "the exported program's flat graph"


def test_the_clean_runs_of_a_program_call_its_own_module(module_calls):
    x, program = _flat_program()
    report = _timed(program, x)
    assert len(module_calls) == 1 and module_calls[0][0] >= report.latency.n  # as it runs
    assert len(report.to_dataframe()) == 4
    assert any("ran the exported program unflattened" in n for n in report.timing_notes)


def test_the_command_line_times_a_pt2_as_its_program_runs(tmp_path, module_calls, capsys):
    from modelprof.cli import main

    x, program = _flat_program()
    path = tmp_path / "mlp.pt2"
    torch.export.save(program, path)
    assert main(["profile", str(path), "--budget", "0.2"]) == 0, capsys.readouterr().err
    # the clean runs: the loaded program's module()
    assert len(module_calls) == 1 and module_calls[0][0] > 0
    assert "note: the per-layer passes ran the exported program unflattened" in (
        capsys.readouterr().out
    )


def test_compare_counts_a_program_and_times_its_module(module_calls):
    from modelprof import compare

    x, program = _flat_program()
    eager = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = compare({"eager": eager, "ep": program}, x, budget_s=0.1)
        assert list(compare([program], x, timing=False).index) == ["ExportedProgram"]
    # 2 x (8x8 + 8x4) = 192 MACs, as its layers count them; its latency: the module it runs
    assert table["macs"].tolist() == [192, 192] and table["latency_n"].notna().all()
    assert len(module_calls) == 2 and module_calls[0][0] >= table.loc["ep", "latency_n"]


def test_the_latency_functions_time_a_program_as_its_module(module_calls):
    from modelprof import measure_latencies, measure_latency, measure_throughput

    x, program = _flat_program()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        latency = measure_latency(program, inputs=x, budget_s=0.1)
        assert module_calls[-1][0] >= latency.n
        both = measure_latencies({"ep": program, "again": program}, x, budget_s=0.1)
        runs = [both.measurements[n].n for n in ("ep", "again")]
        assert [c[0] >= n for c, n in zip(module_calls[1:], runs)] == [True, True]
        eager = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
        batch = torch.export.Dim("b", max=8)
        dynamic = torch.export.export(eager, (x,), dynamic_shapes=({0: batch},))
        curve = measure_throughput(dynamic, (8,), max_batch=2, budget_s=0.05)
    assert [p.batch_size for p in curve.points] == [1, 2] and module_calls[-1][0] > 0


def test_inputs_a_program_was_not_recorded_for_are_refused_before_it_runs(module_calls):
    from modelprof import ModelProfError, measure_latencies, measure_latency, measure_throughput

    x, program = _flat_program()  # recorded at 2 x 8
    wrong = re.escape("the exported program takes inputs of shape 2x8 (as recorded); given")
    with pytest.raises(ModelProfError, match=f"{wrong} 2x4"):  # the features, not the batch
        profile(program, (4,), batch_size=2, budget_s=0.1)
    with pytest.raises(ModelProfError, match=f"{wrong} 1x8"):  # input_size's batch of 1
        profile(program, (8,), timing=False)
    with pytest.raises(ModelProfError, match=f"{wrong} 2x4"):  # not _guards_fn's failure
        measure_latency(program, inputs=torch.randn(2, 4), budget_s=0.1)
    with pytest.raises(ModelProfError, match=f"candidate 'ep': {wrong} 2x4"):
        measure_latencies({"ep": program}, torch.randn(2, 4), budget_s=0.1)
    with pytest.raises(ModelProfError, match=f"{wrong} 1x8"):  # its search's first batch
        measure_throughput(program, (8,), max_batch=2, budget_s=0.05)
    assert [c[0] for c in module_calls] == [0, 0, 0, 0]  # each module() made, none called
    eager = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    batch = torch.export.Dim("b", min=2, max=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = torch.export.export(eager, (x,), dynamic_shapes=({0: batch},))
    with pytest.raises(ModelProfError, match=r"shape \[2\.\.16\]x8 \(as recorded\); given 17x8"):
        profile(dynamic, (8,), batch_size=17, timing=False)  # past its bound: torch's guard
    # a batch up to its bound runs: 16 x (8x8 + 8x4) = 1,536 MACs; and batch 1, below the
    # range's least 2, which torch runs too (its guards hold the bound alone): 1 x 96 = 96
    assert profile(dynamic, (8,), batch_size=16, timing=False).totals["macs"] == 1536
    assert profile(dynamic, (8,), timing=False).totals["macs"] == 96


def test_the_command_line_names_the_shape_a_pt2_recorded(tmp_path, capsys):
    from modelprof.cli import main

    _, program = _flat_program()
    path = tmp_path / "mlp.pt2"
    torch.export.save(program, path)
    assert main(["profile", str(path), "--no-timing", "--input-size", "4"]) != 0
    assert "shape 2x8 (as recorded); given 1x4" in capsys.readouterr().err


def test_the_command_line_compares_and_searches_a_pt2_as_its_program_runs(
    tmp_path, module_calls, capsys
):
    from modelprof.cli import main

    x, _ = _flat_program()
    eager = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    path = tmp_path / "mlp.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = torch.export.Dim("b", max=8)
        torch.export.save(torch.export.export(eager, (x,), dynamic_shapes=({0: batch},)), path)
    budget = ["--budget", "0.05"]
    assert main(["compare", str(path), str(path), "--input-size", "8", *budget]) == 0, (
        capsys.readouterr().err
    )
    assert [c[0] > 0 for c in module_calls] == [True, True]  # each timed as its program runs
    del module_calls[:]
    assert main(["throughput", str(path), "--max-batch", "2", *budget]) == 0
    assert [c[0] > 0 for c in module_calls] == [True]


class _Masked(nn.Module):
    """Two positional inputs and a keyword one, as t11's: forward(x, y, mask=None)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.h = nn.Linear(16, 32), nn.Linear(8, 32), nn.Linear(32, 4)

    def forward(self, x, y, mask=None):
        h = self.a(x) + self.b(y)
        return self.h(h * mask if mask is not None else h)


@pytest.fixture(scope="module")
def masked_pt2(tmp_path_factory):
    """A .pt2 exported with a keyword input (``kwargs={"mask": ...}``) and a dynamic batch,
    and one whose example inputs were left out."""
    folder = tmp_path_factory.mktemp("masked")
    x, y, mask = torch.randn(2, 5, 16), torch.randn(2, 5, 8), torch.ones(2, 5, 32)
    batch = torch.export.Dim("b", max=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(
            _Masked().eval(),
            (x, y),
            {"mask": mask},
            dynamic_shapes={"x": {0: batch}, "y": {0: batch}, "mask": {0: batch}},
        )
        torch.export.save(program, folder / "m.pt2")
        program.example_inputs = None
        torch.export.save(program, folder / "bare.pt2")
    return folder


#: MACs per row (5 tokens): 5 x (16x32 + 8x32 + 32x4)
_MASKED_MACS = 5 * (16 * 32 + 8 * 32 + 32 * 4)


@pytest.mark.parametrize(
    "file, flags, batch",
    [
        ("m.pt2", [], 2),  # its recorded inputs, the mask by keyword
        ("bare.pt2", [], 2),  # made from its inputs' shapes, the mask by keyword
        ("m.pt2", ["--batch-size", "3"], 3),  # its recorded rows, repeated to 3
        (
            "m.pt2",
            ["--input", "x:float32[5,16]", "--input", "y:float32[5,8]"]
            + ["--input", "mask:float32[5,32]:1", "--batch-size", "2"],
            2,
        ),
    ],
)
def test_the_command_line_calls_a_pt2_with_its_keyword_inputs(
    masked_pt2, capsys, file, flags, batch
):
    from modelprof.cli import main

    assert main(["profile", str(masked_pt2 / file), "--no-timing", *flags]) == 0, (
        capsys.readouterr().err
    )
    out = capsys.readouterr().out
    assert f"input {batch}x5x16, {batch}x5x8, {batch}x5x32" in out
    assert f"MACs {batch * _MASKED_MACS:,}" in out


def test_an_input_the_program_does_not_take_is_refused_by_name(masked_pt2, capsys):
    from modelprof.cli import main

    given = ["--input", "x:float32[5,16]", "--input", "z:float32[5,8]"]
    assert main(["profile", str(masked_pt2 / "m.pt2"), "--no-timing", *given]) == 2
    err = capsys.readouterr().err
    assert "takes x, y positionally and mask by keyword" in err
    assert "no input z; y, mask missing" in err


def test_input_names_place_single_tensors_only(masked_pt2):
    from modelprof.runtime.exported import input_names

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.load(masked_pt2 / "m.pt2")
        plain = torch.export.export(_Masked(), (torch.ones(1, 16), torch.ones(1, 8)))
    assert input_names(program) == (("x", "y"), ("mask",))
    assert input_names(plain) == (("x", "y"), ())


def test_a_nested_input_has_no_names():
    from modelprof.runtime.exported import input_names

    class Pair(nn.Module):
        def forward(self, pair):
            return pair[0] + pair[1]

    one = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert input_names(torch.export.export(Pair(), ((one, one),))) is None


@pytest.mark.parametrize("option", [{"dtype": torch.float64}, {"backward": True}])
def test_compare_converts_and_trains_a_copy_of_a_program_it_profiled(option):
    # profile unflattens the program first, after which its module() cannot be deep-copied
    # (FakeTensors): the module-by-module copy must keep the graph's forward
    from modelprof import compare

    x, program = _flat_program()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile(program, x, timing=False)
        table = compare({"ep": program}, (8,), batch_size=2, budget_s=0.1, **option)
    assert "error" not in table or table["error"].isna().all()
    assert table.loc["ep", "latency_n"] > 0


def test_a_programs_training_step_says_it_ran_unflattened():
    # the step's instrumented passes need the layers: the timed steps run the unflattened
    # program, not the flat graph the forward's clean runs time, and the notes say so
    x, program = _flat_program()
    notes = _timed(program, x, backward=True).timing_notes
    assert any(
        "timed training steps" in n and "ran the exported program unflattened" in n for n in notes
    )


def test_a_non_tensor_input_has_no_names():
    # an int or a None input is its value in the program's user inputs, not a placeholder
    from modelprof.runtime.exported import input_names

    class Scaled(nn.Module):
        def forward(self, x, n: int, y, mask=None):
            return x * n + y if mask is None else (x + y) * mask

    one = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with_int = torch.export.export(Scaled(), (one, 3, one))
        with_none = torch.export.export(Scaled(), (one, 3, one), {"mask": None})
    assert input_names(with_int) is None and input_names(with_none) is None
