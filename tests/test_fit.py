"""``fit``: bytes per rank against closed forms (Llama-3-70B's weights and KV cache) and against
torch's own FSDP2 memory tracker on a fake process group; the table, the CLI and bad input.

``torch.distributed._tools.FSDPMemTracker`` is a private torch module: used here, as an oracle
only, never by modelprof itself."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import latex_headers

import modelprof
from modelprof import ModelProfError, ModelProfWarning, ViewOptions
from modelprof.cli import main
from modelprof.fit import fit

transformers = pytest.importorskip("transformers")

GiB = 2**30


def llama3_70b():
    return transformers.LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
    )


def small_llama():
    return transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=101,
        max_position_embeddings=64,
    )


@pytest.mark.slow
def test_llama3_70b_inference_closed_forms():
    report = fit(llama3_70b(), device="H100 SXM", context=8192, training=False)
    t = report.table["inference"]
    # parameters: embeddings 2 x 128256 x 8192 = 2,101,346,304; per layer q, o 8192^2, k, v
    # 8192 x 1024, MLP 3 x 8192 x 28672, two norms 2 x 8192 = 855,654,400; x 80 layers
    # = 68,452,352,000; final norm 8,192: 70,553,706,496 x 2 bytes (bf16) = 141.1 GB
    assert t["weights"] == 70_553_706_496 * 2 == 141_107_412_992
    # KV: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes x 8192 tokens = 2.68 GB a sequence
    assert t["kv_cache"] == 2 * 80 * 8 * 128 * 2 * 8192 == 2_684_354_560
    # the largest activation of the prefill, counted: the MLP's SiLU, 8192 x 28672 in and
    # 8192 x 28672 out (the up projection reads 8192 x 8192 only; the logits are of the last
    # token only), bf16: 2 x 8192 x 28672 x 2 = 896 MiB
    assert t["activation"] == 2 * 8192 * 28672 * 2
    assert t["memory"] == 80 * GiB and not report.fits("inference")
    assert t["headroom"] == 80 * GiB - t["total"] < 0
    text = str(report)
    assert "131.42 GiB" in text and "2.50 GiB" in text and " no" in text  # 141.1e9 B, 2.68e9 B
    # over 2 tensor-parallel ranks: half of every matrix, the norms whole (2 x 80 + 1 of
    # 8192 = 1,318,912 elements on each rank): (70,553,706,496 - 1,318,912) / 2 + 1,318,912
    # = 35,277,512,704 elements x 2 bytes; 4 KV heads each
    two = fit(llama3_70b(), device="H100 SXM", context=8192, training=False, tp=2)
    t2 = two.table["inference"]
    assert t2["weights"] == ((70_553_706_496 - 1_318_912) // 2 + 1_318_912) * 2 == 70_555_025_408
    assert t2["kv_cache"] == 2_684_354_560 // 2
    assert two.fits("inference")  # 65.7 + 1.25 + 0.88 GiB under 80 GiB
    # beyond 8 ranks the KV heads cannot split further: each rank holds one
    sixteen = fit(llama3_70b(), device="H100 SXM", context=8192, training=False, tp=16)
    assert sixteen.table.loc["kv_cache", "inference"] == 2_684_354_560 // 8


def test_training_plans_closed_forms():
    cfg = small_llama()
    report = fit(cfg, device="H100 SXM", context=16, batch_size=2, ranks=4)
    t = report.table
    # parameters: embeddings and head 2 x 101 x 64 = 12,928; per layer q, o 64 x 64, k, v
    # 32 x 64, MLP 3 x 64 x 96, norms 2 x 64 = 30,848; x 2 layers + final norm 64 = 74,688
    psi = 74_688
    assert t.loc["weights", "data parallel"] == 2 * psi  # bf16
    assert t.loc["master_weights", "data parallel"] == 4 * psi  # fp32 (mixed precision)
    assert t.loc["gradients", "data parallel"] == 2 * psi
    tensors = 2 + 2 * 9 + 1  # 21 parameter tensors
    # Adam: m and v in fp32, and a float32 step per tensor
    assert t.loc["optimizer_state", "data parallel"] == 2 * 4 * psi + 4 * tensors
    # each tensor split in 4 chunks of ceil(d0 / 4) rows, as FSDP2 does: the 101-row
    # embedding and head keep 26 rows each; every other dim 0 (64, 32, 96) divides by 4
    shard = 2 * 26 * 64 + (psi - 2 * 101 * 64) // 4  # 3,328 + 15,440
    assert t.loc["optimizer_state", "ZeRO-1"] == 2 * 4 * shard + 4 * tensors
    assert t.loc["master_weights", "ZeRO-1"] == 4 * shard
    assert t.loc["gradients", "ZeRO-1"] == 2 * psi and t.loc["gradients", "ZeRO-2"] == 2 * shard
    assert t.loc["weights", "ZeRO-2"] == 2 * psi and t.loc["weights", "ZeRO-3 (FSDP)"] == 2 * shard
    saved = modelprof_saved(cfg, 2, 16)
    assert (t.loc["saved_activations"] == [0, saved, saved, saved, saved]).all()
    # the model's own loss saves its fp32 log-softmax at least: 2 x 16 tokens x 101 x 4 B
    # (fit counted the step on a sum of the logits, without it)
    assert saved - modelprof_saved(cfg, 2, 16, labels=False) >= 2 * 16 * 101 * 4
    # SDPA is counted as the fused kernel on meta too, so no row ran attention as matmuls
    assert not any("ran attention as matmuls" in n for n in report.notes)
    # buffers: the rotary inv_freq, head dim 32 / 2 = 16 floats, cast to bf16: 32 B, whole
    # in every plan; inputs: 2 x 16 int64 token ids, 256 B (the labels are the same tensor)
    assert (t.loc["buffers"] == 16 * 2).all() and (t.loc["inputs"] == 2 * 16 * 8).all()
    assert list(t.loc["total"]) == list(
        t.loc[
            [
                "weights",
                "buffers",
                "inputs",
                "kv_cache",
                "activation",
                "master_weights",
                "gradients",
                "optimizer_state",
                "saved_activations",
            ]
        ].sum()
    )


def modelprof_saved(cfg, batch, seq, labels=True):
    import modelprof

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    r = modelprof.profile(
        model,
        # trained on its own loss, as fit counts it
        inputs={"input_ids": ids, "labels": ids} if labels else {"input_ids": ids},
        device="meta",
        dtype=torch.bfloat16,
        backward=True,
        timing=False,
    )
    # beyond the inputs, which fit's inputs row holds, as memory_estimate's saved row counts
    return r.totals["saved_bytes"] - r.memory.saved_inputs_bytes


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zero3_equals_fsdp2_memory_tracker_to_the_byte(world):
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    cfg = small_llama()
    expected = fit(
        cfg, device="H100 SXM", dtype=torch.float32, context=16, ranks=world, mixed_precision=False
    ).table["ZeRO-3 (FSDP)"]
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 101, (2, 16))
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((ids,))
        with tracker:
            model(input_ids=ids).logits.sum().backward()
            opt.step()
            got = tracker.get_tracker_snapshot()[torch.device("cpu")]
    finally:
        dist.destroy_process_group()
    assert got[_FSDPRefType.SHARDED_PARAM] == expected["weights"]
    assert got[_FSDPRefType.SHARDED_GRAD] == expected["gradients"]
    assert got[_FSDPRefType.OPT] == expected["optimizer_state"]
    assert expected["master_weights"] == 0  # float32 training: no second copy


def test_device_names_memory_and_variants():
    report = fit(small_llama(), device="A100 SXM 80GB", context=8, training=False)
    assert report.table.loc["memory", "inference"] == 80 * GiB
    try:
        family = fit(small_llama(), device="A100", context=8, training=False)
    except ModelProfError as e:  # a table that asks instead of taking one
        assert "A100 SXM 80GB" in str(e) and "A100 SXM 40GB" in str(e)
    else:  # a table that takes one says which, and the others
        assert family.device == "A100 SXM 40GB" and family.matched_from == "A100"
        text = str(family)
        assert "A100 SXM 40GB (from 'A100')" in text and "A100 SXM 80GB (80.00 GiB)" in text
    own = fit(small_llama(), device="H100 SXM", memory_bytes=10**6, context=8, training=False)
    assert own.table.loc["memory", "inference"] == 10**6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"context": -1}, "context=-1"),
        ({"ranks": 0}, "ranks=0"),
        ({"tp": 1.5}, "tp=1.5"),
        ({"device": "Z9000"}, "device='Z9000'.*H100 SXM"),
        ({"memory_bytes": 0}, "memory_bytes=0"),
        ({"optimizer": "lion"}, "optimizer='lion'"),
        ({"optimizer": torch.nn.Linear}, "optimizer=<class"),
        ({"dtype": torch.int8}, "dtype=torch.int8"),
        # fp32 weights under mixed precision: a master copy of 4 bytes a parameter beside
        # weights of 4 bytes a parameter, the weights held twice (it was added silently)
        ({"dtype": torch.float32, "mixed_precision": True}, "mixed_precision=True with dtype"),
    ],
)
def test_bad_input_is_named(kwargs, match):
    with pytest.raises(ModelProfError, match=match):
        fit(small_llama(), **kwargs)


def test_not_a_model():
    with pytest.raises(ModelProfError, match="got str"):
        fit("llama")


def test_the_command_line(capsys):
    spec = (
        "LlamaConfig:hidden_size=64,intermediate_size=96,num_hidden_layers=2,"
        "num_attention_heads=4,num_key_value_heads=2,vocab_size=101"
    )
    assert main(["fit", spec, "--context", "16", "--ranks", "2", "--on", "L4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device L4") and "ZeRO-3 (FSDP)" in out and "24.00 GiB" in out
    assert main(["fit", spec, "--context", "0"]) == 2
    assert "--context 0 must be" in capsys.readouterr().err  # in its flag (cli_words)
    # the plans' activation checkpointing, as fit(checkpointing=) takes it: the same table
    base = ["fit", spec, "--context", "16", "--ranks", "2", "--on", "L4"]
    assert main([*base, "--checkpointing", "full"]) == 0
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=101,
    )
    api = fit(cfg, context=16, ranks=2, device="L4", checkpointing="full").to_text()
    out = capsys.readouterr().out
    # the same table and the same checkpointing note (the API's adds "built from the config")
    table = [line for line in out.splitlines() if not line.startswith("note:")]
    # (its head names the SPEC's model as its files do, then the class: the API's, alone)
    assert table[0].startswith("device L4; model Llama (LlamaForCausalLM), 74.69 K")
    assert table[1:] == [line for line in api.splitlines() if not line.startswith("note:")][1:]
    assert "note: full checkpointing: each of 2 layers saves its input" in out
    assert main([*base, "--checkpointing", "some"]) == 2
    assert "--checkpointing" in capsys.readouterr().err


def test_a_fit_exports_like_every_result(tmp_path, capsys):
    """A newcomer found no way to save a fit's table: it exports through the format registry
    (raw bytes read back equal; a human table as to_text shows it, every plan kept in LaTeX),
    and the command line writes it with --out/--format."""
    from modelprof.render import read_csv, read_json

    report = fit(small_llama(), context=16, ranks=2, device="L4")
    path = report.to_csv(tmp_path / "fit.csv")
    back = read_csv(path).set_index("component").rename_axis(None)
    pd.testing.assert_frame_equal(back, report.table, check_index_type=False)
    df, _, env = read_json(report.to_json())
    assert env["device"] == "L4" and env["notes"] == list(report.notes)
    assert list(df["component"]) == list(report.table.index)
    md = report.to_markdown()
    assert md.startswith(f"**{report.to_text().splitlines()[0]}**")
    assert "| fits " in md and "24.00 GiB" in md  # the L4's memory, in IEC units
    tex = report.to_latex()
    assert "dropped to fit" not in tex and "\\resizebox" in tex  # every plan kept, scaled
    assert latex_headers(tex) == ["component", *report.table.columns]
    # text is to_text's (what the command line prints, notes included); plans picked keep the
    # component; a per-layer table's views are refused, not ignored (review)
    assert report.export("text") == report.to_text()
    assert report.to_csv(columns=["inference"]).splitlines()[0] == "component,inference"
    long = report.to_latex(long=True)  # not scaled (a longtable cannot be), nor cut to a width
    assert "longtable" in long and "dropped to fit" not in long
    assert latex_headers(long) == ["component", *report.table.columns]
    assert report.to_csv(columns="inference").splitlines()[0] == "component,inference"
    with pytest.raises(ModelProfError, match="a fit's text is to_text's"):
        report.export("text", view=ViewOptions(max_rows=2))
    for option in (dict(units="fixed"), dict(style="torchstat"), dict(depth=1)):
        with pytest.raises(ModelProfError, match="a fit's table is a component a row"):
            report.to_markdown(**option)
    spec = (
        "LlamaConfig:hidden_size=64,intermediate_size=96,num_hidden_layers=2,"
        "num_attention_heads=4,num_key_value_heads=2,vocab_size=101"
    )
    out = tmp_path / "out"
    args = ["fit", spec, "--context", "16", "--ranks", "2", "--on", "L4", "--out", str(out)]
    assert main([*args, "--format", "csv,tex"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["Llama_fit.csv", "Llama_fit.tex"]
    written = read_csv(out / "Llama_fit.csv").set_index("component").rename_axis(None)
    pd.testing.assert_frame_equal(written, report.table, check_index_type=False)
    fresh = ["--out", str(tmp_path / "png_out")]
    assert main([*args, *fresh, "--format", "png"]) == 2
    assert "fit draws no figure" in capsys.readouterr().err
    assert not (tmp_path / "png_out").exists()  # refused: the --out made for it is removed


def test_a_fits_exports_right_align_its_bytes_and_say_its_plan_in_words():
    """A fit's Markdown, HTML and LaTeX left-aligned its bytes (its cells were made strings
    before the renderer saw them), where every other table right-aligns numbers; its head read
    `1 GPU a plan (tp x ranks)` and its note `batch 1 of 400`."""
    from modelprof.render import read_json
    from modelprof.render.units import format_bytes

    report = fit(torch.nn.Sequential(torch.nn.Linear(400, 300)), input_size=(400,))
    plans = list(report.table.columns)
    md = report.to_markdown().splitlines()
    rule = next(line for line in md if line.startswith("|:-")).strip("|").split("|")
    # the component's names left, each plan's bytes right (":" on that side only)
    assert [(c.startswith(":"), c.endswith(":")) for c in rule] == [(True, False)] + [
        (False, True)
    ] * len(plans)
    fits = next(line for line in md if line.startswith("| fits "))
    assert [c.strip() for c in fits.strip("|").split("|")] == ["fits", *["yes"] * len(plans)]
    # bf16 weights: (400 x 300 + 300) x 2 B = 240,600 B = 234.96 KiB, in every plan's column
    weights = format_bytes(240_600)
    assert weights == "234.96 KiB" and int(report.table.loc["weights", "ZeRO-1"]) == 240_600
    html = report.to_html(standalone=False)
    assert '<td class="l">weights</td>' + f'<td class="r">{weights}</td>' * len(plans) in html
    assert '<td class="l">fits</td>' + '<td class="r">yes</td>' * len(plans) in html
    assert "\\begin{tabular}{l" + "r" * len(plans) + "}" in report.to_latex()
    # plans picked by their names (no unit suffix in them nor in an error)
    picked = report.to_markdown(columns=["ZeRO-1"], standalone=False, caption=None)
    picked = picked.splitlines()
    assert [c.strip() for c in picked[0].strip("|").split("|")] == ["component", "ZeRO-1"]
    with pytest.raises(ModelProfError, match=r"unknown column\(s\) \['ZeRO-9'\]") as e:
        report.to_html(columns=["ZeRO-9"])
    assert "_bytes" not in str(e.value)
    # the files keep the bytes and fits as 1/0/-1, read back as stored
    df, _, env = read_json(report.to_json())
    pd.testing.assert_frame_equal(
        df.set_index("component").rename_axis(None), report.table, check_index_type=False
    )
    assert (env["tp"], env["ranks"], env["gpus"]) == (1, 1, 1)
    assert report.to_text().splitlines()[0].endswith("; 1 GPU per plan (tp 1 x 1 rank)")
    assert "torch.bfloat16, batch 1 of input (400,);" in report.notes[0]


def test_memory_estimate_prints_human_units_and_stays_numeric():
    import modelprof

    report = modelprof.profile(torch.nn.Linear(1000, 1000), (1000,), timing=False)
    est = report.memory_estimate()
    # 1000 x 1000 weights + 1000 biases, float32: 4,004,000 B = 3.82 MiB
    assert est.loc["parameters", "inference"] == 4_004_000
    assert str(est["inference"].dtype) == "int64"
    text = repr(est)
    assert "3.82 MiB" in text and "4004000" not in text
    # state tensors per parameter: a count, 0 or more (-1 printed a negative optimizer state)
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ModelProfError, match=f"optimizer_states={bad!r} must be an int >= 0"):
            report.memory_estimate(optimizer_states=bad)
    # plain SGD (0 states): the training step holds no optimizer state
    assert report.memory_estimate(optimizer_states=0).loc["optimizer state", "training_step"] == 0


def test_the_optimizers_own_state_is_read_from_one_step():
    from modelprof.fit import optimizer_states

    # (bytes that scale with a 6 x 10 parameter at 4 bytes a state element, fixed bytes)
    assert optimizer_states(torch.optim.Adam).nbytes((6, 10), 4) == (2 * 60 * 4, 4)  # m, v; step
    assert optimizer_states(torch.optim.SGD).nbytes((6, 10), 4) == (0, 0)
    p = torch.nn.Parameter(torch.zeros(2))
    sgd_m = optimizer_states(torch.optim.SGD([p], lr=0.1, momentum=0.9))
    assert sgd_m.nbytes((6, 10), 4) == (60 * 4, 0)  # one momentum buffer
    assert optimizer_states(torch.optim.Adagrad).nbytes((6, 10), 4) == (60 * 4, 4)  # sum; step
    cfg = small_llama()
    sgd = fit(cfg, context=8, optimizer=torch.optim.SGD([p], lr=0.1, momentum=0.9))
    # one momentum buffer per element, fp32 under mixed precision: 4 x 74,688
    assert sgd.table.loc["optimizer_state", "data parallel"] == 4 * 74_688
    with pytest.raises(ModelProfError, match="optimizer=3"):
        fit(cfg, optimizer=3)


def test_a_plain_module_counts_weights_and_says_what_it_left_out():
    model = torch.nn.Sequential(torch.nn.Linear(100, 50), torch.nn.Linear(50, 10))
    with pytest.warns(ModelProfWarning, match="no activations counted"):
        report = fit(model, dtype=torch.float32, mixed_precision=False)
    t = report.table
    # 100 x 50 + 50 + 50 x 10 + 10 = 5,560 elements x 4 bytes
    assert t.loc["weights", "inference"] == 22_240 and t.loc["kv_cache", "inference"] == 0
    # Adam: 2 x 22,240 + a 4-byte step for each of the 4 tensors
    assert t.loc["optimizer_state", "data parallel"] == 2 * 22_240 + 16
    assert "no KV cache and no activations" in str(report)
    assert next(model.parameters()).device.type == "cpu"  # the user's model is untouched


def test_a_plain_module_without_an_input_size_gets_no_yes():
    """resnet18 at batch 100,000 said "fits yes" on 2 GB: its activations were never counted."""
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None)
    with pytest.warns(ModelProfWarning, match="pass input_size="):
        report = fit(model, memory_bytes=2e9, dtype=torch.float32, batch_size=100_000)
    assert not report.activations
    # weights 46.8 MB + gradients + Adam's 93.5 MB fit 2 GB: unknown (-1), not yes (1)
    assert (report.table.loc["fits"] == -1).all()
    assert "weights and states only" in str(report) and " yes" not in str(report)
    with pytest.raises(ModelProfError, match="plan='ZeRO-1'.*input_size="):
        report.fits("ZeRO-1")
    # weights that do not fit even alone: a plain no (10**6 B < 46.8 MB of fp32 weights)
    with pytest.warns(ModelProfWarning):
        small = fit(model, memory_bytes=10**6, dtype=torch.float32)
    assert (small.table.loc["fits"] == 0).all() and not small.fits("inference")


def test_a_plain_module_given_an_input_size_counts_its_activations():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelProfWarning)  # counted: no warning
        report = fit(
            model, memory_bytes=2e9, dtype=torch.float32, batch_size=256, input_size=(3, 224, 224)
        )
    t = report.table
    est = modelprof.profile(
        model,
        (3, 224, 224),
        batch_size=256,
        device="meta",
        dtype=torch.float32,
        timing=False,
        backward=True,
    )
    # the largest leaf call: bn1's 64 x 112 x 112 input and output, fp32, at batch 256:
    # 2 x 256 x 64 x 112 x 112 x 4 = 1,644,167,168 B; saved: profile(backward=True)'s 5.29 GiB
    # less the input that conv1 saves, which the inputs row holds: 256 x 3 x 224 x 224 x 4 B
    # (0.14 GiB), 5.14 GiB
    assert t.loc["activation", "inference"] == 2 * 256 * 64 * 112 * 112 * 4
    assert est.memory.saved_inputs_bytes == 256 * 3 * 224 * 224 * 4
    assert (t.loc["inputs"] == 256 * 3 * 224 * 224 * 4).all()
    saved = est.totals["saved_bytes"] - 256 * 3 * 224 * 224 * 4
    assert t.loc["saved_activations", "data parallel"] == saved > 5 * 2**30
    assert report.activations and report.fits("inference") and not report.fits("ZeRO-3 (FSDP)")
    # docs/utilization.md quotes the two (it said 5.29 GiB, the inputs counted in, once they
    # had a row of their own)
    quoted = [
        f"{t.loc[k, p] / 2**30:.2f} GiB"
        for k, p in (("activation", "inference"), ("saved_activations", "data parallel"))
    ]
    doc = " ".join((Path(__file__).parents[1] / "docs" / "utilization.md").read_text().split())
    assert f"resnet18 at batch 256, fp32: {quoted[0]} and {quoted[1]}" in doc, quoted
    with pytest.raises(ModelProfError, match=r"input_size=\(3, 224, 224\) is for.*token ids"):
        fit(small_llama(), context=8, input_size=(3, 224, 224))
    with pytest.raises(ModelProfError, match="input_size="):
        fit(model, input_size=(3, -1))


def test_the_command_line_counts_a_vision_model_at_its_input_size(capsys):
    pytest.importorskip("torchvision")
    # resnet18's spec records 3 x 224 x 224: batch 64 in bf16 saves 725.91 MiB, of which the
    # input conv1 saves, 64 x 3 x 224 x 224 x 2 B = 18.38 MiB, is the inputs row's: 707.54
    assert main(["fit", "resnet18", "--memory", "2GB", "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "707.54 MiB" in out and "no activations counted" not in out
    # --input-size overrides it: the largest leaf call 2 x 64 x 64 x 16 x 16 x 2 B = 4 MiB
    assert (
        main(
            ["fit", "resnet18", "--memory", "2GB", "--batch-size", "64", "--input-size", "3,32,32"]
        )
        == 0
    )
    assert "4.00 MiB" in capsys.readouterr().out


_VIT = (  # a transformers ViTModel: a config, but fed pixels, not token ids
    "import transformers\n"
    "INPUT_SIZE = (3, 32, 32)\n"
    "def build():\n"
    "    return transformers.ViTModel(transformers.ViTConfig(hidden_size=32, "
    "num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32, "
    "patch_size=16))\n"
)
_KWARGS = (  # forward(self, x, **kwargs), no config: fit feeds it no token ids
    "import torch\n"
    "INPUT_SIZE = (3, 32, 32)\n"
    "class Net(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.conv = torch.nn.Conv2d(3, 8, 3)\n"
    "    def forward(self, x, **kwargs):\n"
    "        return self.conv(x)\n"
    "def build():\n"
    "    return Net()\n"
)


@pytest.mark.parametrize("source", [_VIT, _KWARGS], ids=["transformers_vit", "plain_kwargs"])
def test_the_command_line_keeps_the_input_size_of_a_model_fed_no_token_ids(
    source, tmp_path, capsys
):
    # the spec's INPUT_SIZE is used where fit feeds no token ids ("has a config" and "takes
    # **kwargs" each read as "takes input_ids" dropped it: weights and states only)
    nets = tmp_path / "nets.py"
    nets.write_text(source)
    assert main(["fit", f"{nets}:build", "--memory", "2GB", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "batch 4 of input (3, 32, 32)" in out and "weights and states only" not in out


def test_the_command_line_builds_a_config_as_fit_does(tmp_path, capsys):
    # modelprof fit ViTConfig:... exited 2 ("no model class for ViTConfig (tried
    # AutoModelForCausalLM, ...)") where fit(ViTConfig(...)) builds the bare ViTModel: one rule
    sizes = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
    )
    spec = "ViTConfig:" + ",".join(f"{k}={v}" for k, v in sizes.items())
    cfg = tmp_path / "vit.json"
    cfg.write_text(json.dumps({"model_type": "vit", **sizes}))
    flags = ["--input-size", "3,32,32", "--dtype", "fp32", "--memory", "1GiB"]
    api = fit(
        transformers.ViTConfig(**sizes), input_size=(3, 32, 32), dtype="fp32", memory_bytes=GiB
    )
    for given, name in ((spec, "ViT"), (str(cfg), "vit")):
        assert main(["fit", given, *flags]) == 0
        out = capsys.readouterr().out.splitlines()
        # parameters: patch conv 3*8*8*64 + 64 = 12,352, class token 64, 17 positions x 64 =
        # 1,088; a layer 2 x 128 (norms) + 3 x 4,160 (q, k, v) + 4,160 (out) + 8,320 + 8,256
        # (MLP) = 33,472, two of them; the final norm 128, the pooler 4,160: 84,736
        assert out[0].startswith(f"memory 1.00 GiB (1,073,741,824 B) given; model {name} (ViTM")
        assert "84,736" in out[0] and out[1:] == api.to_text().splitlines()[1:]


def test_the_command_line_names_a_factorys_files_as_profile_does(tmp_path, capsys):
    # a file's factory is named by file and factory (nets_build), as profile names it: by the
    # factory alone, two files' build() wrote one build_fit.csv
    nets = tmp_path / "nets.py"
    nets.write_text(_KWARGS)
    out = tmp_path / "out"
    assert main(["fit", f"{nets}:build", "--memory", "2GB", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["nets_build_fit.csv", "nets_build_fit.md"]


def test_a_plain_module_gets_no_tensor_parallel_plan():
    # a CNN has no heads to shard: at tp=2 its activations read half of tp=1's, as if sharded
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    with pytest.raises(ModelProfError, match=r"tp=2: fit shards a model by its transformers"):
        fit(model, input_size=(3, 16, 16), tp=2, memory_bytes=1e9)
    fit(model, input_size=(3, 16, 16), ranks=2, memory_bytes=1e9)  # data parallel: planned
    # where no training plan fits, the way forward does not offer it a larger tp
    big = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(65536, 1000)
    )
    notes = fit(big, memory_bytes=2**28, input_size=(3, 32, 32), batch_size=64).notes
    said = [n for n in notes if n.startswith("no training plan fits")]
    assert said and "tp" not in said[0].split("would fit")[1].replace("tp=1", "")


def test_every_fit_option_has_help():
    from modelprof.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["fit"]
    for action in sub._actions:
        assert action.help, f"fit: {action.option_strings or action.dest} has no help"
    # SPEC's help named configs and factories only, yet `modelprof fit resnet18` runs (above)
    spec = next(a for a in sub._actions if a.dest == "spec").help
    for kind in ("config.json", "torchvision name (resnet18)", "timm:NAME", "file.py:FACTORY"):
        assert kind in spec, kind


def test_a_module_is_counted_as_given_not_rebuilt_from_its_config():
    cfg = small_llama()
    classifier = transformers.LlamaForSequenceClassification(cfg)
    report = fit(classifier, context=16, training=False)
    # the causal LM's 74,688 parameters less its 101 x 64 LM head, plus the 2 x 64 score
    # head (no bias): 68,352 elements x 2 bytes (bf16); the old rebuild counted 149,376
    assert report.table.loc["weights", "inference"] == (74_688 - 101 * 64 + 2 * 64) * 2
    assert report.model == "LlamaForSequenceClassification"
    assert "model LlamaForSequenceClassification" in str(report)
    lm = transformers.LlamaForCausalLM(cfg)
    lm.adapter = torch.nn.Linear(64, 8)  # the user's own addition: 64 x 8 + 8 elements
    added = fit(lm, context=16, dtype=torch.float32, mixed_precision=False, training=False)
    assert added.table.loc["weights", "inference"] == (74_688 + 520) * 4
    assert next(lm.parameters()).device.type == "cpu"  # counted on meta, given back as is
    # a forward that fails on meta at these inputs (no pad token at batch 2) leaves the
    # activations out, and says why, instead of counting another model
    batch2 = fit(classifier, context=16, batch_size=2, training=False)
    assert batch2.table.loc["activation", "inference"] == 0
    assert "padding token" in batch2.notes[0]


def test_a_config_builds_the_class_that_maps_it_and_says_which():
    t5 = transformers.T5Config(d_model=64, d_ff=96, num_layers=2, num_heads=4, d_kv=16)
    report = fit(t5, context=16)  # no causal-LM class: an encoder-decoder is built as one
    assert report.model == "T5ForConditionalGeneration"
    assert any(
        "counted T5ForConditionalGeneration, built from the config" in n for n in report.notes
    )
    # T5's decoder caches K and V of its own tokens, 2 x 2 layers x 4 heads x 16 (d_kv) x 2
    # bytes x 16 tokens, and of the 16 encoded ones for cross-attention, as many again
    assert report.table.loc["kv_cache", "inference"] == 2 * (2 * 2 * 4 * 16 * 2 * 16)
    by_class = fit(transformers.LlamaConfig, context=8, training=False)  # its defaults
    assert by_class.model == "LlamaForCausalLM"
    as_dict = fit({"model_type": "llama", **small_llama().to_diff_dict()}, context=16)
    assert as_dict.table.equals(fit(small_llama(), context=16).table)
    with pytest.raises(ModelProfError, match="model_type='lama'.*'llama'"):
        fit({"model_type": "lama"})
    with pytest.raises(ModelProfError, match="needs its 'model_type'"):
        fit({"hidden_size": 64})
    with pytest.raises(ModelProfError, match=r"hidden size \(30\)"):
        fit({"model_type": "llama", "hidden_size": 30, "num_attention_heads": 4})


def test_the_command_line_counts_an_encoder_decoder(capsys):
    spec = "T5Config:d_model=64,d_ff=96,num_layers=2,num_heads=4,d_kv=16"
    assert main(["fit", spec, "--context", "16"]) == 0
    assert "model T5 (T5ForConditionalGeneration)" in capsys.readouterr().out


def _real_state_bytes(model, opt, steps=1):
    """Bytes of every tensor in ``opt``'s state after ``steps`` real steps on ``model``."""

    def closure():
        opt.zero_grad()
        loss = model(input_ids=torch.randint(0, 101, (2, 8))).logits.float().pow(2).mean()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    total = 0
    for state in opt.state.values():
        for v in state.values():
            for t in v if isinstance(v, list) else [v]:
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
    return total


def _fit_state(cfg, optimizer):
    plain = {"dtype": torch.float32, "mixed_precision": False, "context": 8}
    return fit(cfg, optimizer=optimizer, **plain).table.loc["optimizer_state", "data parallel"]


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True),  # a third state, max_exp_avg_sq
        lambda ps: torch.optim.Adafactor(ps, lr=1e-2),
        lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9, centered=True),
    ],
    ids=["adamw", "amsgrad", "adafactor", "rmsprop-centered"],
)
def test_an_optimizer_instance_is_sized_from_its_real_state(make):
    # the oracle: the optimizer itself, one real step on the real model in float32
    torch.manual_seed(0)
    cfg = small_llama()
    model = transformers.LlamaForCausalLM(cfg)
    opt = make(model.parameters())
    torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # adds 'initial_lr' to the groups
    expected = _real_state_bytes(model, opt)
    assert _fit_state(cfg, opt) == expected
    assert _fit_state(cfg, type(opt)) > 0  # the class too, with its defaults


def test_adafactor_keeps_row_and_column_factors_not_full_moments():
    cfg = small_llama()
    state = _fit_state(cfg, torch.optim.Adafactor)
    # 2-D weights keep a row and a column of factors: embed and head 2 x (101 + 64), per
    # layer q, o 2 x (64 + 64), k, v 2 x (32 + 64), MLP 3 x (96 + 64) = 928, x 2 layers;
    # the 5 norms (1-D) a full 64-element second moment; a float32 step per tensor (21)
    factors = 2 * (101 + 64) + 2 * 928 + 5 * 64
    assert state == 4 * factors + 4 * 21 == 10_108
    assert state < _fit_state(cfg, "adam") / 50  # Adam: 2 x 74,688 elements


def test_lbfgs_and_sparse_adam_are_sized_not_refused():
    cfg = small_llama()
    psi = 74_688
    # LBFGS: the flat direction and previous gradient, and history_size (default 100)
    # directions and steps, one element each per parameter element (float32); its 0-d
    # scalars (ro, al: history_size each, and H_diag), 4 bytes each, held once: LBFGS keeps
    # one state for all its parameters (per tensor, 21 x, was counted)
    lbfgs = _fit_state(cfg, torch.optim.LBFGS([torch.nn.Parameter(torch.zeros(1))]))
    assert lbfgs == 4 * psi * (2 + 2 * 100) + (2 * 100 + 1) * 4
    # the bytes of a real LBFGS's state after 3 steps of a 3-tensor model, to the byte:
    # 12 flat vectors of its 1,078 elements (history 5), 5 ro, 5 al and H_diag (0-d)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Conv1d(4, 6, 3))
    real = torch.optim.LBFGS(model.parameters(), lr=0.1, history_size=5, max_iter=4)

    def closure():
        real.zero_grad()
        loss = sum(((p - 1) ** 2).sum() for p in model.parameters())
        loss.backward()
        return loss

    for _ in range(3):
        real.step(closure)
    held = [v for st in real.state.values() for v in st.values()]
    held = [t for v in held for t in (v if isinstance(v, list) else [v])]
    nbytes = sum(t.nbytes for t in held if isinstance(t, torch.Tensor))
    assert nbytes == 4 * (12 * 1_078 + 5 + 5 + 1)
    sized = fit(model, dtype=torch.float32, optimizer=real, memory_bytes=10**9)
    assert sized.table.loc["optimizer_state", "data parallel"] == nbytes
    # SparseAdam: m and v per element, its step a Python int (no tensor)
    sparse = torch.optim.SparseAdam([torch.nn.Parameter(torch.zeros(1))])
    assert _fit_state(cfg, sparse) == 2 * 4 * psi


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"memory_bytes": float("inf")}, "memory_bytes=inf"),
        ({"memory_bytes": float("nan")}, "memory_bytes=nan"),
        ({"memory_bytes": 1e30}, "memory_bytes=1e\\+30"),  # past int64: no table holds it
        ({"context": 10**20}, "context=100000000000000000000"),
        ({"batch_size": 2**30, "context": 2**30}, "batch_size=1073741824 x context"),
        # 2**52 tokens x 2 sequences pass the count check, but the KV cache alone is 2 x 2
        # layers x 2 KV heads x 16 x 2 bytes = 512 B a token: 2**62 bytes and more
        ({"batch_size": 2, "context": 2**52, "training": False}, "over 2\\*\\*62 bytes"),
    ],
)
def test_numbers_out_of_range_are_refused_by_name(kwargs, match):
    config = small_llama()
    config.max_position_embeddings = 2**53  # positions are not what is checked here
    with pytest.raises(ModelProfError, match=match):
        fit(config, **kwargs)


def test_numpy_numbers_are_numbers():
    import numpy as np

    report = fit(small_llama(), batch_size=np.int64(2), context=8, memory_bytes=np.float64(1e9))
    assert report.table.loc["memory", "inference"] == 10**9


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--memory-bytes", "inf"], "--memory inf"),
        (["--memory", "nan"], "--memory nan"),
        (["--context", "100000000000000000000"], "--context 100000000000000000000"),
        (["--context", "x"], "--context: invalid int value: 'x'"),
    ],
)
def test_the_command_line_refuses_numbers_in_one_line(argv, named, capsys):
    spec = "LlamaConfig:hidden_size=64,num_hidden_layers=1,num_attention_heads=4"
    assert main(["fit", spec, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modelprof: error: ") and named in err and err.count("\n") == 1


def test_a_config_its_class_refuses_is_one_line(capsys):
    assert main(["fit", "LlamaConfig:hidden_size=30,num_attention_heads=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modelprof: error: SPEC 'LlamaConfig:hidden_size=30")
    assert "hidden size (30)" in err and err.count("\n") == 1
    assert main(["fit", "LlamaConfg:hidden_size=64"]) == 2  # a typo: not torchvision advice
    assert "did you mean LlamaConfig" in capsys.readouterr().err


def test_fit_takes_the_spellings_every_command_uses_and_keeps_the_old_ones(capsys):
    spec = (
        "LlamaConfig:hidden_size=64,intermediate_size=96,num_hidden_layers=2,"
        "num_attention_heads=4,num_key_value_heads=2,vocab_size=101"
    )
    common = ["fit", spec, "--context", "16", "--inference-only"]
    new = ["--target", "L4", "--dtype", "float32", "--batch-size", "2", "--memory", "1e9"]
    old = ["--on", "L4", "--fit-dtype", "float32", "--batch", "2", "--memory-bytes", "1e9"]
    assert main([*common, *new]) == 0
    out = capsys.readouterr().out
    assert main([*common, *old]) == 0
    assert capsys.readouterr().out == out
    # float32 weights: 74,688 x 4 bytes = 291.75 KiB; 1e9 bytes of memory = 953.67 MiB
    assert "291.75 KiB" in out and "953.67 MiB" in out and "batch 2 x context 16" in out


def test_quantized_weights_count_at_their_stored_size_in_every_memory_answer():
    import warnings

    import modelprof
    from modelprof.generation.memory import weights_bytes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        model = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)),
            {torch.nn.Linear},
            dtype=torch.qint8,
        )
    assert list(model.parameters()) == []  # packed away: no nn.Parameter is left
    # int8 weights 64 x 64 + 8 x 64 = 4,608 B, float32 biases (64 + 8) x 4 = 288 B
    stored = 4_608 + 288
    report = modelprof.profile(model, (64,), timing=False)
    assert report.totals["params"] == 4_680  # the table counted them already
    assert report.memory_estimate().loc["parameters", "inference"] == stored
    plan = fit(model, dtype=torch.float32, mixed_precision=False)
    t = plan.table
    assert t.loc["weights", "inference"] == stored
    assert t.loc["weights", "ZeRO-3 (FSDP)"] == stored  # neither trained nor sharded
    assert t.loc["gradients", "data parallel"] == 0 == t.loc["optimizer_state", "ZeRO-1"]
    assert any("quantized or packed" in n for n in plan.notes)
    assert weights_bytes(model, torch.float32) == stored  # generation's memory plan


def test_fit_takes_every_optimizer_form_profile_takes():
    cfg = small_llama()
    by_class = _fit_state(cfg, torch.optim.Adafactor)
    assert _fit_state(cfg, "adafactor") == by_class  # a torch.optim name, any case
    assert _fit_state(cfg, "Adafactor") == by_class
    factory = _fit_state(cfg, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    assert factory == 4 * 74_688  # one float32 momentum buffer per element
    with pytest.raises(ModelProfError, match="returned a Linear"):
        fit(cfg, context=16, optimizer=lambda ps: torch.nn.Linear(2, 2))
    with pytest.raises(ModelProfError, match="optimizer='lion'.*adafactor"):
        fit(cfg, context=16, optimizer="lion")


def test_a_kv_cache_is_counted_only_for_a_forward_that_keeps_one():
    vit = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96
    )
    report = fit(vit, context=16, training=False)
    assert report.model == "ViTModel"  # an encoder: no cache, whatever its config's heads
    assert report.table.loc["kv_cache", "inference"] == 0
    assert "reads 'pixel_values'" in report.notes[0]  # and its activations are not made up
    bert = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96
        )
    )
    assert fit(bert, context=16, training=False).table.loc["kv_cache", "inference"] == 0
    # a decoder keeps one: 2 (K, V) x 2 layers x 2 KV heads x 16 x 2 bytes x 16 tokens
    llama = fit(small_llama(), context=16, training=False)
    assert llama.table.loc["kv_cache", "inference"] == 2 * 2 * 2 * 16 * 2 * 16


class _Wrapped(torch.nn.Module):
    """A user's wrapper that passes everything on, as adapters and PEFT models do."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def test_a_wrapper_that_passes_everything_on_is_counted_as_its_model():
    lm = transformers.LlamaForCausalLM(small_llama())
    plain = fit(lm, context=16, training=False).table["inference"]
    wrapped = fit(_Wrapped(lm), context=16, training=False).table["inference"]
    # its forward takes **kwargs: token ids reach the model and its cache is the model's;
    # only the logits differ (the wrapper's forward cannot be told to keep the last only)
    assert wrapped["weights"] == plain["weights"] and wrapped["kv_cache"] == plain["kv_cache"] > 0
    assert wrapped["activation"] >= plain["activation"] > 0
    odd = torch.nn.Linear(4, 4)
    odd.config = small_llama()  # a config, but a forward that takes a tensor
    assert "forward takes no input_ids" in fit(odd, training=False).notes[0]


def _mamba(kind="MambaConfig", **kw):
    # hidden 64, expand 2: 128 channels; state 16; conv kernel 4; 2 layers
    return getattr(transformers, kind)(
        hidden_size=64,
        state_size=16,
        num_hidden_layers=2,
        vocab_size=256,
        expand=2,
        conv_kernel=4,
        **kw,
    )


def test_mamba_recurrent_state_is_the_kv_column():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' note on its reference kernels
        f32 = fit(_mamba(), batch_size=8, context=64, dtype=torch.float32, training=False)
        bf16 = fit(_mamba(), batch_size=8, context=64, training=False)
        two = fit(_mamba(), batch_size=8, context=64, training=False, tp=2)
        longer = fit(_mamba(), batch_size=8, context=512, training=False)
        mamba2 = fit(
            _mamba("Mamba2Config", num_heads=8, head_dim=16, n_groups=1),
            batch_size=8,
            context=32,
            dtype=torch.float32,
            training=False,
        )
    # a layer's conv state 128 x 4 and SSM state 128 x 16; float32: 2,048 + 8,192 = 10,240
    # B; 2 layers x 8 sequences = 163,840 B (before: 0)
    assert f32.table.loc["kv_cache", "inference"] == 2 * 8 * (128 * 4 * 4 + 128 * 16 * 4)
    # bf16: the conv state in bf16 (1,024 B), the SSM state still float32 (8,192 B), as
    # transformers' scan computes it: 2 x 8 x 9,216 = 147,456 B
    assert bf16.table.loc["kv_cache", "inference"] == 2 * 8 * (128 * 4 * 2 + 128 * 16 * 4)
    assert any("float32" in n for n in bf16.notes)
    assert longer.table.loc["kv_cache", "inference"] == 147_456  # any context: no tokens kept
    assert two.table.loc["kv_cache", "inference"] == 147_456 // 2  # channels split over tp
    # Mamba2: conv over 128 + 2 x 1 group x 16 = 160 channels x 4, SSM 8 heads x 16 x 16,
    # float32: 2,560 + 8,192 = 10,752 B a layer; x 2 layers x 8 sequences = 172,032 B
    assert mamba2.table.loc["kv_cache", "inference"] == 2 * 8 * (160 * 4 * 4 + 8 * 16 * 16 * 4)


@pytest.mark.parametrize("tp, named", [(3, "tp=3"), (8, "more ranks than heads")])
def test_tp_must_split_whole_heads(tp, named):
    # small_llama: 4 heads of 16, hidden 64; 3 divides neither, 8 exceeds the heads
    with pytest.raises(ModelProfError, match=f"{named}.*heads % tp == 0; tp in \\[1, 2, 4\\]"):
        fit(small_llama(), context=16, tp=tp)


def test_tp_keeps_norms_whole_and_gives_odd_rows_to_rank_0():
    t = fit(small_llama(), context=16, tp=2, training=False).table["inference"]
    # embedding and head: 101 rows -> rank 0 holds 51: 2 x 51 x 64 = 6,528; per layer q, o
    # 32 x 64 each (4,096), k, v 16 x 64 (2,048), gate, up 48 x 64 (6,144), down 32 x 96
    # (3,072), two norms whole 128: 15,488 x 2 layers; final norm whole 64: 37,568 x 2 B
    assert t["weights"] == (6_528 + 2 * 15_488 + 64) * 2 == 75_136


def test_context_past_the_learned_positions_is_refused():
    gpt2 = transformers.GPT2Config(n_layer=2, n_embd=96, n_head=12, n_positions=128)
    with pytest.raises(
        ModelProfError, match="context=4096 .* 128 positions .*n_positions.*learned"
    ):
        fit(gpt2, context=4096, training=False)
    assert fit(gpt2, context=128, training=False).fits("inference")  # at the limit: yes
    with pytest.raises(ModelProfError, match="context=65 .*max_position_embeddings=64"):
        fit(small_llama(), context=65, training=False)


def test_a_head_dim_that_is_no_integer_is_refused():
    # Phi builds 30 / 4 = 7.5 without a word
    phi = transformers.PhiConfig(
        hidden_size=30,
        num_attention_heads=4,
        num_hidden_layers=1,
        intermediate_size=32,
        vocab_size=50,
    )
    with pytest.raises(ModelProfError, match="hidden size 30 / 4 attention heads = 7.5"):
        fit(phi, context=8, training=False)


def test_activation_checkpointing_closed_forms_and_the_gpus_a_plan_uses():
    import modelprof

    cfg = small_llama()
    kw = dict(context=16, batch_size=2, ranks=4, tp=2)
    none, full, selective = (
        fit(cfg, checkpointing=c, **kw).table.loc["saved_activations", "ZeRO-3 (FSDP)"]
        for c in ("none", "full", "selective")
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    rows = modelprof.profile(
        model,
        inputs={"input_ids": ids},
        device="meta",
        dtype=torch.bfloat16,
        backward=True,
        timing=False,
    ).rows
    layers = [r.saved_bytes for r in rows if r.module in ("model.layers.0", "model.layers.1")]
    saved = modelprof_saved(cfg, 2, 16)
    assert none == -(-saved // 2)  # as counted, split over tp = 2 (sequence parallel)
    # full: the 2 layers' saved bytes replaced by their inputs (2 x 16 x 64 x 2 B = 4,096 B
    # each, the paper's 2sbh) plus the larger layer's, live while it is recomputed
    assert len(layers) == 2
    assert full == -(-(saved - sum(layers) + 2 * 4_096 + max(layers)) // 2) < none
    assert selective == none  # SDPA ran as the fused kernel: its core is recomputed already
    report = fit(cfg, **kw)
    assert (report.parameters, report.gpus) == (74_688, 8)
    assert (report.tp, report.ranks) == (2, 4)
    assert "74.69 K (74,688) parameters; 8 GPUs per plan (tp 2 x 4 ranks)" in str(report)
    with pytest.raises(ModelProfError, match="checkpointing='some'"):
        fit(cfg, checkpointing="some", **kw)


def test_selective_checkpointing_drops_an_eager_attention_core():
    cfg = small_llama()
    cfg._attn_implementation = "eager"
    kw = dict(context=16, batch_size=2)
    none = fit(cfg, **kw)
    selective = fit(cfg, checkpointing="selective", **kw)
    dropped = (
        none.table.loc["saved_activations", "data parallel"]
        - selective.table.loc["saved_activations", "data parallel"]
    )
    # the eager core keeps the T x T scores and probabilities: at least 2 layers x batch 2 x
    # 4 heads x 16 x 16 x 2 B (bf16 probabilities) = 8,192 B of them are not saved
    assert dropped >= 2 * 2 * 4 * 16 * 16 * 2
    assert any("selective checkpointing" in n for n in selective.notes)


def test_the_notes_say_the_zero_paper_is_followed_and_what_deepspeed_adds():
    notes = fit(small_llama(), context=16, ranks=4).notes
    note = next(n for n in notes if "ZeRO paper" in n)
    # fp32 gradient partition: 4 B x the rank's shard, 3,328 + 15,440 = 18,768 elements
    # (test_training_plans_closed_forms) = 75,072 B = 73.31 KiB; the largest layer is the
    # 101 x 64 embedding: 4 B x 6,464 = 25,856 B = 25.25 KiB
    assert "+73.31 KiB a rank" in note and "(+25.25 KiB)" in note


def test_tp_keeps_a_row_parallel_bias_whole_and_splits_its_weight_by_the_input():
    # attention and MLP biases on: q, k, v, gate, up are column-parallel (bias split with the
    # rows); o_proj and down_proj are row-parallel (weight split by its input, bias added after
    # the all-reduce: whole on every rank). Over the no-bias 75,136 B, per layer at tp = 2:
    # q 32 + k 16 + v 16 + o 64 (whole) + gate 48 + up 48 + down 64 (whole) = 288 elements,
    # 2 layers x 288 x 2 B = 1,152 B
    cfg = small_llama()
    cfg.attention_bias, cfg.mlp_bias = True, True
    t = fit(cfg, context=16, tp=2, training=False).table["inference"]
    assert t["weights"] == 75_136 + 2 * 288 * 2 == 76_288


def test_a_given_memory_is_what_the_header_and_notes_say():
    """memory_bytes=2e9 printed `device H100 SXM` and offered H100 NVL as a variant; a CNN's
    note read `batch 32 x context 2048`."""
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None)
    kw = {"dtype": torch.float32, "batch_size": 32, "input_size": (3, 64, 64)}
    text = str(fit(model, memory_bytes=2e9, **kw))
    # 2e9 B / 2**30 = 1.86 GiB: the memory used, not a datasheet entry's
    head = text.splitlines()[0]
    assert head.startswith("memory 1.86 GiB (2,000,000,000 B) given; model ResNet")
    assert "H100" not in text and "variants" not in text
    assert "batch 32 of input (3, 64, 64)" in text and "x context" not in text
    named = str(fit(model, device="A100", memory_bytes=2e9, **kw))  # a name beside it: a label
    assert named.startswith("device A100, memory 1.86 GiB (2,000,000,000 B) given;")
    # no memory given: the datasheet's H100 SXM (80 GiB), and its variants
    sheet = str(fit(model, **kw))
    assert sheet.startswith("device H100 SXM;") and "other variants: H100 NVL" in sheet
    with pytest.warns(ModelProfWarning):  # nothing fed: the batch alone
        bare = str(fit(model, memory_bytes=2e9, dtype=torch.float32, batch_size=32))
    assert "torch.float32, batch 32\n" in bare and "x context" not in bare
    # a model fed token ids keeps its context
    assert "batch 1 x context 8" in str(fit(small_llama(), context=8, training=False))
    # no training plan fits 10**8 B (178 MiB of weights, gradients and Adam's state at 1 rank):
    # the way forward names the batch, not a context the CNN has not got
    tight = fit(model, memory_bytes=10**8, **kw).notes[-1]
    assert tight.startswith("no training plan fits") and tight.endswith(
        "smaller batch lower it too"
    )


@pytest.mark.parametrize("optimizer", [None, "adam"])
def test_memory_estimate_and_fit_count_adams_state_alike(optimizer):
    """memory_estimate() gave resnet18 93,516,096 B of Adam state (no step tensors), fit()
    93,516,344 B (with them, as docs/utilization.md and torch's FSDP tracker count it)."""
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None)
    report = modelprof.profile(
        model,
        (3, 224, 224),
        device="meta",
        dtype=torch.float32,
        timing=False,
        backward=True,
        optimizer=optimizer,  # None: memory_estimate's assumed 2 states, Adam's
    )
    estimated = report.memory_estimate().loc["optimizer state", "training_step"]
    planned = fit(model, dtype=torch.float32, input_size=(3, 224, 224)).table
    # 11,689,512 parameters x (m + v) x 4 B + a 4-byte step for each of the 62 tensors:
    # 93,516,096 + 248 = 93,516,344 B
    assert (
        estimated == planned.loc["optimizer_state", "data parallel"] == 2 * 11_689_512 * 4 + 62 * 4
    )


def test_an_input_size_the_forward_refuses_is_refused_as_profile_refuses_it():
    # Linear(10, 5) fed 3 features: profile refuses it, and fit only warned ("weights and
    # states only") though input_size= asked for activations; it is refused, profile's words
    # quoted
    model = torch.nn.Linear(10, 5)
    with pytest.raises(ModelProfError, match=r"input_size=\(3,\) .*forward pass failed"):
        fit(model, input_size=(3,), memory_bytes=2**30)
    # at its own feature size it counts: the 1 x 10 input in its row, 10 x 2 B, and the
    # largest leaf call beyond it, the 1 x 5 output in bf16: 5 x 2 B
    counted = fit(model, input_size=(10,), memory_bytes=2**30, training=False)
    assert counted.table.loc["activation", "inference"] == 10
    assert counted.table.loc["inputs", "inference"] == 20
    with pytest.warns(ModelProfWarning, match="pass input_size="):  # none given: a warning
        assert not fit(model, memory_bytes=2**30).activations


def test_the_command_line_counts_weights_where_the_specs_own_input_size_fails(tmp_path, capsys):
    # the spec's recorded INPUT_SIZE was not asked for: its forward failing there (a detection
    # model's nonzero on meta) leaves weights and states, as before fit refused such a size;
    # --input-size given is asked for, and refused
    spec = tmp_path / "nets.py"
    spec.write_text(
        "from torch import nn\nINPUT_SIZE = (3,)\ndef build():\n    return nn.Linear(10, 5)\n"
    )
    assert main(["fit", f"{spec}:build", "--memory", "2GB"]) == 0
    out, err = capsys.readouterr()
    assert "weights and states only" in out
    assert (
        "no activations counted at the spec's own input size (3, not a --input-size given)" in err
    )
    # (exit status 1: the model failed to run there, as profile's does)
    assert main(["fit", f"{spec}:build", "--memory", "2GB", "--input-size", "3"]) == 1
    assert "forward pass failed" in capsys.readouterr().err
    # a token-id model whose spec records a float input size: the same fallback (its refusal,
    # fit's own words for a model it cannot feed ids, ended the run instead)
    spec.write_text(
        "from torch import nn\nINPUT_SIZE = (3,)\ndef build():\n"
        "    return nn.Sequential(nn.Embedding(100, 8))\n"
    )
    assert main(["fit", f"{spec}:build", "--memory", "2GB"]) == 0
    out, err = capsys.readouterr()
    assert "weights and states only" in out and "cannot size this model's activations" in err


def test_a_sequence_classifier_is_counted_without_token_labels():
    # fit fed labels shaped as the token ids to every forward taking labels: a sequence
    # classifier wants one label a sequence, its counted forward failed on meta and fit counted
    # no activations at all (activation and saved both 0); only an LM head gets token labels
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    with torch.device("meta"):
        model = transformers.BertForSequenceClassification(cfg)
    report = fit(model, context=16, batch_size=2, memory_bytes=2**34)
    assert not any("failed" in n for n in report.notes)
    # the step as profile counts it on meta at fit's bf16, trained on the sum of its logits
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    step = modelprof.profile(
        model, inputs={"input_ids": ids}, device="meta", dtype=torch.bfloat16, backward=True
    )
    saved = report.table.loc["saved_activations", "data parallel"]
    assert saved == step.totals["saved_bytes"] - step.memory.saved_inputs_bytes > 0
    assert report.table.loc["activation", "inference"] > 0
    # a token classifier labels every token: counted on its own loss, labels shaped as the ids
    with torch.device("meta"):
        tagger = transformers.BertForTokenClassification(cfg)
    tagged = fit(tagger, context=16, batch_size=2, memory_bytes=2**34)
    own = modelprof.profile(
        tagger,
        inputs={"input_ids": ids, "labels": ids},
        device="meta",
        dtype=torch.bfloat16,
        backward=True,
    )
    own_saved = own.totals["saved_bytes"] - own.memory.saved_inputs_bytes
    assert tagged.table.loc["saved_activations", "data parallel"] == own_saved


class BigBuf(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.register_buffer("table", torch.randn(1024, 1024))

    def forward(self, x):
        return self.a(x) + self.table[: x.shape[0], :64]


def test_buffers_are_counted_in_every_plan_at_their_real_dtype():
    t = fit(BigBuf(), input_size=(64,), batch_size=2, dtype=torch.float32).table
    # the 1024 x 1024 fp32 table: 4 MiB, whole in every plan (no gradient, never sharded)
    assert (t.loc["buffers"] == 1024 * 1024 * 4).all()
    # BatchNorm's running mean and var cast with dtype= as module.to(dtype) casts them, its
    # num_batches_tracked an int64 still: 2 x 8 x 2 B (bf16) + 8 B
    norm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    t = fit(norm, input_size=(4,), batch_size=2, dtype=torch.bfloat16).table
    assert (t.loc["buffers"] == 2 * 8 * 2 + 8).all()


def test_fit_and_memory_estimate_agree_where_they_count_the_same():
    """resnet-like: conv, BatchNorm (buffers), pooling, a head; batch 4, fp32, Adam."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    )
    planned = fit(model, input_size=(3, 16, 16), batch_size=4, dtype=torch.float32).table
    est = modelprof.profile(
        model,
        (3, 16, 16),
        batch_size=4,
        device="meta",
        dtype=torch.float32,
        timing=False,
        backward=True,
        optimizer="adam",
    ).memory_estimate()
    pairs = {  # fit's row: memory_estimate's
        "weights": "parameters",  # (3 x 9 x 8 + 8) + 2 x 8 + (8 x 10 + 10) = 330 x 4 B
        "buffers": "buffers",  # running mean, var 2 x 8 x 4 B + num_batches_tracked 8 B = 72
        "inputs": "inputs",  # 4 x 3 x 16 x 16 x 4 B = 12,288
        # the BatchNorm's input and output beyond the input: 2 x 4 x 8 x 16 x 16 x 4 = 65,536
        "activation": "activations",
    }
    for mine, theirs in pairs.items():
        assert planned.loc[mine, "inference"] == est.loc[theirs, "inference"], mine
    assert planned.loc["weights", "inference"] == 330 * 4
    assert (
        planned.loc["buffers", "inference"] == 72 and planned.loc["inputs", "inference"] == 12_288
    )
    assert planned.loc["activation", "inference"] == 2 * 4 * 8 * 16 * 16 * 4
    assert planned.loc["total", "inference"] == est.loc["total", "inference"]
    step = {  # fit's data parallel plan: memory_estimate's training step
        "weights": "parameters",
        "buffers": "buffers",
        "inputs": "inputs",
        "gradients": "gradients",  # 330 x 4 B
        "optimizer_state": "optimizer state",  # m, v: 2 x 330 x 4 B + a 4-byte step x 6 tensors
        "saved_activations": "saved for backward",  # beyond the input, which conv saved
    }
    for mine, theirs in step.items():
        assert planned.loc[mine, "data parallel"] == est.loc[theirs, "training_step"], mine
    assert planned.loc["optimizer_state", "data parallel"] == 2 * 330 * 4 + 6 * 4
    # by design: no activation row in a training plan (the ZeRO accounting), so the estimate's
    # step is larger by exactly its activations row
    gap = est.loc["total", "training_step"] - planned.loc["total", "data parallel"]
    assert gap == est.loc["activations", "training_step"] == 2 * 4 * 8 * 16 * 16 * 4


def test_a_token_model_without_a_config_is_refused_naming_what_counts_it():
    class Tok(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e, self.h = torch.nn.Embedding(100, 16), torch.nn.Linear(16, 100)

        def forward(self, x):
            return self.h(self.e(x))

    # its hint named inputs=, which fit does not take; fit cannot feed it ids: it says so
    with pytest.raises(ModelProfError) as caught:
        fit(Tok(), input_size=(5,), dtype=torch.float32)
    said = str(caught.value)
    assert "Tok takes integer token ids" in said and "cannot size this model's" in said
    assert "memory_estimate() of a training step's profile fed modelprof.token_inputs(" in said
    assert "pass inputs=" not in said
