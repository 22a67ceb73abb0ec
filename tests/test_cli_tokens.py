"""Token and named inputs on the command line: ``--tokens SEQ_LEN`` builds
calflops-style ``input_ids``/``attention_mask``, ``--input NAME:DTYPE[SHAPE]:VALUES`` any named
input, both at ``--batch-size``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from modelprof import profile, token_inputs
from modelprof.cli import main, parse_input_arg
from modelprof.errors import ModelProfError
from modelprof.models import load_spec
from modelprof.runtime import compat
from modelprof.runtime.inputs import vocab_size

pytest.importorskip("transformers")

FACTORY = textwrap.dedent("""
    from transformers import (
        BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
        T5Config, T5ForConditionalGeneration, WhisperConfig, WhisperForConditionalGeneration
    )

    def bert():
        return BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64,
                                    max_position_embeddings=64))

    def gpt2():
        return GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2,
                                          n_positions=64))

    def llama():
        return LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=2,
                                            num_key_value_heads=1))

    def t5():
        # tests/helpers.py's tiny_t5, its decoder starting from token 7
        return T5ForConditionalGeneration(T5Config(
            vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=3, num_decoder_layers=2,
            num_heads=2, decoder_start_token_id=7, pad_token_id=0, eos_token_id=1))

    def whisper():
        return WhisperForConditionalGeneration(WhisperConfig(
            d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
            num_mel_bins=16, max_source_positions=50, max_target_positions=32, vocab_size=300,
            pad_token_id=1, bos_token_id=2, eos_token_id=2, decoder_start_token_id=3))
""")


@pytest.fixture
def lm(tmp_path: Path) -> Path:
    f = tmp_path / "lm.py"
    f.write_text(FACTORY)
    return f


def test_tokens_profile_a_bert_factory(lm: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        main(["profile", f"{lm}:bert", "--tokens", "16", "--batch-size", "2", "--no-timing"]) == 0
    )
    out = capsys.readouterr().out
    assert "on input 2x16, 2x16" in out  # input_ids and attention_mask, (2, 16)
    # tokens b*s = 32, hidden 32, 2 heads of 16, ffn 64, one layer:
    # q,k,v,o 4*32*32*32 = 131072; scores and context 2*(2*2*16*16*16) = 32768;
    # ffn 2*32*32*64 = 131072; pooler (first token of 2 sequences) 2*32*32 = 2048
    assert "MACs 296,960" in out  # 131072 + 32768 + 131072 + 2048


def test_a_transformers_factory_without_tokens_is_refused_up_front(
    lm: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # it was fed the default 3x224x224 floats and failed in BertEmbeddings with no hint
    for command in (["profile", f"{lm}:bert", "--no-timing"], ["compare", f"{lm}:gpt2"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "is a transformers model that takes token ids (input_ids)" in err
        assert "pass --tokens N" in err and "forward pass failed" not in err
    # a transformers model that takes an image runs on the default size as before
    f = tmp_path / "vision.py"
    f.write_text(
        "from transformers import ResNetConfig, ResNetModel\n"
        "def resnet():\n"
        "    return ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1]))\n"
    )
    assert main(["profile", f"{f}:resnet", "--no-timing"]) == 0
    assert "sets no INPUT_SIZE: its input is taken as 3x224x224" in capsys.readouterr().err


def test_a_transformers_text_model_given_floats_is_told_to_take_token_ids(lm: Path) -> None:
    # profile(bert, (3, 224, 224)) failed inside BertEmbeddings, which no nn.Embedding hint
    # reached (the unpacking of its input's shape failed first)
    with pytest.raises(ModelProfError) as err:
        profile(load_spec(f"{lm}:bert").model, (3, 8, 8), timing=False)
    assert "(BertModel takes integer token ids, and every input here is floating point" in str(
        err.value
    )


def test_named_inputs_profile_a_gpt2_factory(lm: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        main(
            [
                "profile",
                f"{lm}:gpt2",
                "--input",
                "input_ids:int64[16]:0-100",
                "--input",
                "attention_mask:int64[16]:1",
                "--no-timing",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    # 16 tokens, n_embd 32: c_attn 16*32*96 = 49152, scores + context 2*(2*16*16*16) = 16384,
    # attn proj 16*32*32 = 16384, mlp 2*16*32*128 = 131072, lm head 16*32*100 = 51200
    assert "MACs 264,192" in out  # 49152+16384+16384+131072+51200


def test_token_inputs_values() -> None:
    emb = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 2))
    made = token_inputs(emb, 12, batch_size=3)
    # forward(input) has no input_ids parameter: the ids go in positionally
    assert isinstance(made, tuple) and made[0].shape == (3, 12) and made[0].dtype == torch.int64
    assert 0 <= int(made[0].min()) and int(made[0].max()) < 50  # the embedding's 50 rows
    assert torch.equal(made[0], token_inputs(emb, 12, batch_size=3)[0])  # seeded
    # a model without embeddings: the error names the keyword that gives the ids' range
    with pytest.raises(ModelProfError, match=r"\(vocab=1000; the CLI: --input input_ids"):
        token_inputs(nn.Linear(12, 2), 12)
    ids = token_inputs(nn.Linear(12, 2), 12, vocab=7)[0]
    assert int(ids.max()) < 7  # given the range, the same model takes token ids


class _PositionedLM(nn.Module):
    """A hand-written LM whose position table (512 rows) is larger than its vocabulary (100)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(100, 8)
        self.pos = nn.Embedding(512, 8)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.tok(input_ids) + self.pos(torch.arange(input_ids.shape[1]))


def test_token_ids_come_from_the_token_table_not_the_largest_embedding() -> None:
    model = _PositionedLM()
    ids = token_inputs(model, 64, batch_size=8)["input_ids"]
    # 512 ids drawn from [0, 100): the first registered Embedding (tok) is the vocabulary;
    # drawn below the largest table (pos, 512 rows) they reached 510 here and tok raised
    assert int(ids.max()) < 100 and vocab_size(model) == 100
    model(ids)  # the forward takes them
    # a transformers model without an input embedding (ResNetModel raises
    # NotImplementedError from get_input_embeddings) is told to give vocab=, not a traceback
    from transformers import ResNetConfig, ResNetModel

    resnet = ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8] * 4, depths=[1] * 4))
    with pytest.raises(ModelProfError, match=r"reads no token ids: its main input is 'pixel"):
        token_inputs(resnet, 12)


class _PositionsFirstLM(nn.Module):
    """A hand-written LM that registers its position table (512 rows) before its token table
    (100 rows), and a token-type table (2 rows) after."""

    def __init__(self) -> None:
        super().__init__()
        self.wpe = nn.Embedding(512, 8)
        self.blocks = nn.ModuleDict({"pos_emb": nn.Embedding(64, 8)})
        self.embed = nn.Embedding(100, 8)
        self.token_type = nn.Embedding(2, 8)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))


def test_token_ids_skip_a_position_table_registered_before_the_token_table() -> None:
    model = _PositionsFirstLM()
    # the first registered Embedding was taken: ids drawn from [0, 512), past embed's 100 rows
    assert vocab_size(model) == 100
    ids = token_inputs(model, 64, batch_size=8)["input_ids"]
    assert int(ids.max()) < 100
    model(ids)
    # a table named as tokens wins over an unnamed one registered before it ...
    model.tok_emb = nn.Embedding(30, 8)
    assert vocab_size(model) == 30
    # ... and with nothing but position tables, the first registered is taken
    only = nn.Module()
    only.pos = nn.Embedding(64, 8)
    only.position_embeddings = nn.Embedding(32, 8)
    assert vocab_size(only) == 64


class _KwargsLM(nn.Module):
    """A forward whose ids are its first positional parameter, with **kwargs after it."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(10, 4)

    def forward(self, tokens: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return self.tok(tokens)


class _KeywordsOnly(_KwargsLM):
    def forward(self, *args: object, **kwargs: torch.Tensor) -> torch.Tensor:  # a wrapper's
        return self.tok(kwargs["input_ids"])


def test_ids_go_positionally_to_a_first_positional_parameter_despite_kwargs() -> None:
    model = _KwargsLM()
    made = token_inputs(model, 5, batch_size=2)
    # forward(tokens, **kwargs) binds a positional id tensor to tokens; {"input_ids": ids}
    # went into **kwargs and left tokens missing (a TypeError in the forward)
    assert isinstance(made, tuple) and made[0].shape == (2, 5)
    assert model(*made).shape == (2, 5, 4)  # batch 2, 5 tokens, width 4
    # a forward with nothing but *args and **kwargs still gets them by name
    assert set(token_inputs(_KeywordsOnly(), 5)) == {"input_ids"}


def test_parse_input_arg() -> None:
    spec = parse_input_arg("input_ids:int64[128]:0-30522")
    assert (spec.name, spec.dtype, spec.shape, spec.low, spec.high) == (
        "input_ids",
        torch.int64,
        (128,),
        0,
        30522,
    )
    assert parse_input_arg("mask:int64[4]:1").value == 1
    assert parse_input_arg("pixels:float32[3,8,8]").low is None
    # every floating name dtype= takes: bf16, half, fp64, double, ...
    assert parse_input_arg("x:bf16[3]").dtype == torch.bfloat16
    assert parse_input_arg("x:double[3]").dtype == torch.float64
    assert parse_input_arg("x:float32[3]:0.5").value == 0.5
    for bad in (
        "input_ids:int64[128]",  # integers need their values
        "input_ids:int64[0]:0-5",  # empty shape
        "x:complex[3]",
        "x[3]",
        "ids:int64[4]:5-5",
        "ids:int64[4]:five",  # neither a range nor a number
    ):
        with pytest.raises(ModelProfError, match="--input"):
            parse_input_arg(bad)


def test_input_and_input_size_contradict(lm: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", f"{lm}:bert", "--tokens", "8", "--input-size", "8", "--no-timing"]) == 2
    assert "--input-size" in capsys.readouterr().err


def test_help_documents_tokens_and_input(capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--tokens SEQ_LEN" in out and "--input NAME:DTYPE[SHAPE][:VALUES]" in out
    assert "attention_mask" in out and "input_ids:int64[128]" in out


def test_tokens_search_a_language_models_throughput(
    lm: Path, capsys: pytest.CaptureFixture
) -> None:
    # without --tokens the search fed the default 3x224x224 floats to the embedding
    args = ["throughput", f"{lm}:gpt2", "--tokens", "16", "--max-batch", "2", "--budget", "0.02"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "(input 16 tokens)" in captured.out and "best:" in captured.out
    assert "sets no INPUT_SIZE" not in captured.err  # the tokens are its input
    assert main([*args, "--backward"]) == 0  # whole training steps on the same ids
    assert "(whole training steps)" in capsys.readouterr().out
    assert main([*args, "--input-size", "16"]) == 2
    assert "use one or the other" in capsys.readouterr().err
    # compare's search takes --tokens as throughput does (it refused them), not --input
    both = ["compare", f"{lm}:gpt2", f"{lm}:gpt2", "--tokens", "16", "--throughput"]
    assert main([*both, "--max-batch", "2", "--budget", "0.02", "--no-timing"]) == 0
    assert "throughput (samples/s)" in capsys.readouterr().out
    named = [*both[:3], "--input", "input_ids:int64[16]:0-100", "--throughput"]
    assert main(named) == 2
    err = capsys.readouterr().err
    assert "searches batch sizes of an --input-size or --tokens, not --input" in err


def test_tokens_count_a_llama_built_on_meta(lm: Path, capsys: pytest.CaptureFixture) -> None:
    # --device meta builds the model on meta and the token ids there; a meta attention_mask has
    # no values for transformers' mask code to read (Tensor.item() on meta), so none is built
    argv = ["profile", f"{lm}:llama", "--tokens", "16", "--batch-size", "2", "--no-timing"]
    if main([*argv, "--device", "meta"]) != 0:  # the one way it may fail: transformers 4.46's
        # rotary embedding enters autocast on meta, which torch 2.4 and 2.6 cannot
        said = capsys.readouterr().err
        assert not compat.meta_autocast() and "cannot enter torch.autocast on the meta" in said
        return
    on_meta = capsys.readouterr().out
    assert "on input 2x16 (" in on_meta  # the ids alone
    assert main(argv) == 0  # on the CPU: the same MACs (its all-ones mask's ops add FLOPs)
    on_cpu = capsys.readouterr().out

    def macs(out: str) -> list[str]:
        return [line.split("  FLOPs")[0] for line in out.splitlines() if line.startswith("params")]

    # 32 tokens, hidden 32, 2 heads of 16, 1 KV head, ffn 64, vocab 100: q, o 2*32*32*32 = 65536,
    # k, v 2*32*32*16 = 32768; scores and context 2*(2*2*16*16*16) = 32768; gate, up, down
    # 3*32*32*64 = 196608; lm_head 32*32*100 = 102400: 430080. params: embed and lm_head
    # 2*100*32 = 6400, q, o 2*32*32 = 2048, k, v 2*32*16 = 1024, mlp 3*32*64 = 6144, three norms
    # 3*32 = 96: 15712
    assert macs(on_meta) == macs(on_cpu) == ["params 15,712  MACs 430,080"]


def test_compare_feeds_tokens_to_the_text_model_and_a_size_to_the_other(
    lm: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # --tokens went to every model: a model without an nn.Embedding refused the whole run
    # ("no nn.Embedding ... to draw token ids from"), and --input-size beside it was refused
    mlp = tmp_path / "mlp.py"
    mlp.write_text("from torch import nn\ndef build():\n    return nn.Linear(10, 20)\n")
    argv = ["compare", f"{mlp}:build", f"{lm}:bert", "--tokens", "16", "--batch-size", "2"]
    assert main([*argv, "--input-size", "10", "--no-timing"]) == 0
    out = capsys.readouterr().out
    # the Linear: 2*10*20 = 400 MACs; the BERT on 2x16 tokens: 296,960 (as profiled above)
    rows = [[c.strip() for c in ln.split("|")[1:4]] for ln in out.splitlines() if ln[:2] == "| "]
    assert [f"{lm}:bert", "2x16, 2x16 (int64)"] in [r[1:] for r in rows if r[0] == "lm_bert"]
    assert [f"{mlp}:build", "2x10"] in [r[1:] for r in rows if r[0] == "mlp_build"]  # source
    assert "296.96 K" in out and "note: the models ran different inputs" in out
    assert main([*argv, "--no-timing"]) == 1  # the Linear's own (3, 224, 224): its row fails
    assert "mat1 and mat2 shapes cannot be multiplied" in capsys.readouterr().out


def test_tokens_refuse_a_model_that_reads_no_token_ids(
    lm: Path, capsys: pytest.CaptureFixture
) -> None:
    # Whisper's forward takes input_features (mel frames) first: the ids went there, positionally,
    # and its encoder failed ("expects the mel input features to be of length 100, but found 8")
    whisper = load_spec(f"{lm}:whisper").model
    with pytest.raises(ModelProfError, match=r"reads no token ids: its main input is 'input_f"):
        token_inputs(whisper, 8)
    assert main(["profile", f"{lm}:whisper", "--tokens", "8", "--no-timing"]) == 2  # was 1
    err = capsys.readouterr().err
    assert "reads no token ids" in err and "the forward pass failed" not in err


def test_tokens_feed_an_encoder_decoder_its_decoder_ids_too(
    lm: Path, capsys: pytest.CaptureFixture
) -> None:
    from modelprof import compare

    # the encoder's ids alone: T5's decoder failed "You must specify exactly one of input_ids or
    # inputs_embeds"; a teacher-forced decoder of seq_len tokens, from its start token (7)
    t5 = load_spec(f"{lm}:t5").model.eval()
    made = token_inputs(t5, 24, batch_size=2)
    assert set(made) == {"input_ids", "attention_mask", "decoder_input_ids"}
    dec = made["decoder_input_ids"]
    assert dec.shape == (2, 24) and dec[:, 0].tolist() == [7, 7] and int(dec.max()) < 64
    # 48 encoder and 48 decoder tokens, d 16, inner 2 x 4 = 8, d_ff 32, vocabulary 64. An
    # encoder layer per token: q,k,v,o 4*16*8 = 512, FFN 2*16*32 = 1024, scores and context
    # 2*24*8 = 384: 1920 x 48 x 3 layers = 276480. A decoder layer per token: self q,k,v,o 512,
    # cross q,o 256, FFN 1024, self and cross scores and context 2*384: 2560, and cross k,v on
    # the 48 encoder tokens 2*16*8 = 256 each: (2560 + 256) x 48 x 2 layers = 270336. lm_head
    # 48*16*64 = 49152: 595968
    assert profile(t5, made, timing=False).totals["macs"] == 595968
    df = compare({"t5": t5}, tokens=24, batch_size=2, timing=False)
    assert (
        df.loc["t5", "macs"] == 595968 and df.loc["t5", "input_shape"] == "2x24, 2x24, 2x24 (int64)"
    )
    assert main(["profile", f"{lm}:t5", "--tokens", "24", "--batch-size", "2", "--no-timing"]) == 0
    assert "MACs 595,968" in capsys.readouterr().out


def test_token_inputs_of_a_model_on_meta_are_meta_ids_without_a_mask() -> None:
    from helpers import tiny_llama

    # they were CPU ids and an all-ones mask, which profile then left out on meta with a note
    made = token_inputs(tiny_llama(device="meta"), 16, batch_size=2)
    assert set(made) == {"input_ids"}  # transformers takes no mask as all ones
    assert made["input_ids"].device.type == "meta" and made["input_ids"].shape == (2, 16)
