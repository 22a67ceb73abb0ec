"""Arguments refused before any work, each named in a ModelProfError: a reviewer's hunt found
them raising bare TypeErrors (often after every model had been profiled and warmed up),
failing inside numpy or torch, or accepted in silence."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from helpers import tiny_llama
from torch import nn

import modelprof as mp
from modelprof import ModelProfError
from modelprof.render import read_csv, read_json


def _pair() -> dict[str, nn.Module]:
    return {"a": nn.Linear(4, 3), "b": nn.Linear(4, 5)}


def _llama() -> nn.Module:
    pytest.importorskip("transformers")
    return tiny_llama()


@pytest.mark.parametrize(
    "call, message",
    [
        # numpy's generators take no seed below 0: it failed after every model was profiled
        (lambda: mp.compare(_pair(), (4,), seed=-1, roofline=False), "seed=-1 must be an int >= 0"),
        (
            lambda: mp.measure_latencies(_pair(), torch.randn(1, 4), seed=-1),
            "seed=-1 must be an int >= 0",
        ),
        # a callback that cannot be called: TypeError after the first model or point
        (
            lambda: mp.compare(_pair(), (4,), on_step=3, timing=False),
            "on_step=3 must be a callable or None",
        ),
        (
            lambda: mp.measure_throughput(nn.Linear(4, 3), (4,), max_batch=2, on_point=3),
            "on_point=3 must be a callable or None",
        ),
        (
            lambda: mp.sweep({"models": ["resnet18"], "input_size": [3, 32, 32]}, on_config=3),
            "on_config=3 must be a callable or None",
        ),
        (
            lambda: mp.sweep({"models": ["resnet18"]}, timeout_s=float("nan")),
            "timeout_s=nan must be a positive number of seconds",
        ),
        # the generation's seed went to torch's manual_seed, which raised RuntimeError
        *[
            (
                lambda seed=seed: mp.profile_generation(
                    _llama(), prompt_len=4, new_tokens=2, timing=False, seed=seed
                ),
                f"seed={seed!r} must be an int >= 0",
            )
            for seed in (None, 1.5, -1)
        ],
        (
            lambda: mp.profile_generation(
                _llama(), prompt_len=4, new_tokens=2, timing=False, on_step=3
            ),
            "on_step=3 must be a callable or None",
        ),
        (
            lambda: mp.compare_generation({"x": _llama()}, prompt_len=4, new_tokens=2, seed=None),
            "seed=None must be an int >= 0",
        ),
        # token inputs of no model, past the model's positions, or beyond the memory
        (lambda: mp.token_inputs(None, 4, 1), "model=NoneType is not a torch.nn.Module"),
        (
            lambda: mp.token_inputs(_llama(), 10**9, 1),
            "seq_len=1000000000 is past the model's 128 positions",
        ),
        (lambda: mp.token_inputs(_llama(), 4, 10**12), "token inputs of batch_size 10000"),
    ],
)
def test_a_bad_argument_is_named_before_any_work(call, message):
    with pytest.raises(ModelProfError, match=re.escape(message)):
        call()


@pytest.mark.parametrize(
    "export, message",
    [
        (lambda r: r.to_latex(caption=3), "caption=3 must be a string or None"),
        (lambda r: r.to_latex(label=3), "label=3 must be a string or None"),
        (lambda r: r.to_html(caption=3), "caption=3 must be a string or None"),  # (accepted)
        (lambda r: r.to_json(indent="  "), "indent must be a non-negative integer, got '  '"),
        (lambda r: r.to_json(indent=1.5), "indent must be a non-negative integer, got 1.5"),
        (lambda r: r.to_markdown(columns=[]), "columns=[] names no column"),  # ('\n' before)
        # written into the page's <style> as given: a number there is no CSS, a quote in it
        # ends the attribute
        (lambda r: r.to_html(max_height=3), "max_height=3 must be a CSS length"),
        (lambda r: r.to_html(max_height='3px"><script>'), "must be a CSS length such as"),
        (lambda r: r.export("csv", 3), "path=3 must be a file path (a str or os.PathLike)"),
    ],
)
def test_an_export_names_its_bad_option(export, message):
    report = mp.profile(nn.Linear(4, 3), (4,), timing=False)
    with pytest.raises(ModelProfError, match=re.escape(message)):
        export(report)
    # a CSS length as documented is written as given
    assert "max-height: 30em;" in report.to_html(max_height="30em")
    assert "max-height: calc(100vh - 10em);" in report.to_html(max_height="calc(100vh - 10em)")


def test_a_reader_names_its_bad_source_and_dtypes():
    text = mp.profile(nn.Linear(4, 3), (4,), timing=False).to_csv()
    for bad in (None, 3):
        with pytest.raises(ModelProfError, match=f"source={bad} must be a file path"):
            read_csv(bad)
        with pytest.raises(ModelProfError, match=f"source={bad} must be a file path"):
            read_json(bad)
    for dtypes in ({"params": np.int64}, ["params"]):
        with pytest.raises(ModelProfError, match="must map column names to dtype names"):
            read_csv(text, dtypes=dtypes)
    assert read_csv(text, dtypes={"params": "float64"})["params"].dtype == np.float64


def test_given_input_ids_past_the_models_positions_are_refused_as_token_inputs_refuses():
    import transformers  # a test extra

    # they failed inside transformers ("The expanded size of the tensor (17) must match the
    # existing size (16)"), where token_inputs(bert, 17) named the limit
    bert = transformers.BertModel(
        transformers.BertConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            vocab_size=50, max_position_embeddings=16,
        )
    )  # fmt: skip
    with pytest.raises(ModelProfError) as e:
        mp.profile(bert, {"input_ids": torch.zeros(2, 17, dtype=torch.long)}, timing=False)
    assert str(e.value) == (
        "input_ids of length 17 (shape (2, 17)) is past the model's 16 positions "
        "(config.max_position_embeddings)"
    )
    # at the limit it runs: 16 tokens of 2 sequences
    r = mp.profile(bert, {"input_ids": torch.zeros(2, 16, dtype=torch.long)}, timing=False)
    assert r.batch_size == 2 and r.totals["macs"] > 0
    # relative positions (T5) have no such limit: 40 ids run where no config names one
    t5 = transformers.T5EncoderModel(
        transformers.T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                              num_heads=2)
    )  # fmt: skip
    ids = torch.zeros(1, 40, dtype=torch.long)
    assert mp.profile(t5, {"input_ids": ids}, timing=False).totals["macs"] > 0
    # rotary positions (Llama) index no table: ids past max_position_embeddings run (a
    # long-context measurement), though the config names the limit
    llama = transformers.LlamaModel(
        transformers.LlamaConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=50, max_position_embeddings=16,
        )
    )  # fmt: skip
    ids = torch.zeros(1, 24, dtype=torch.long)
    assert mp.profile(llama, {"input_ids": ids}, timing=False).totals["macs"] > 0


def test_a_padded_mask_on_meta_hints_what_an_encoder_user_can_do():
    import transformers  # a test extra

    # BertModel on meta with a padded mask hinted "use_cache=True runs there": an encoder has
    # no cache; the mask given is what it read
    with torch.device("meta"):
        bert = transformers.BertModel(
            transformers.BertConfig(
                hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, vocab_size=50, max_position_embeddings=16,
            )
        )  # fmt: skip
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 4:] = 0  # padded: its values matter, so it is not left out as an all-ones one
    ids = torch.zeros(2, 8, dtype=torch.long, device="meta")
    with pytest.raises(ModelProfError) as e:
        mp.profile(bert, {"input_ids": ids, "attention_mask": mask}, device="meta", timing=False)
    assert "the attention_mask given is read for its values" in str(e.value)
    assert "leave it out to count full attention here" in str(e.value)
    assert "use_cache" not in str(e.value)
