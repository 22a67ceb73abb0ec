"""Quantized weights at the bytes they are stored in: tensor subclasses (torchao's int8, float8,
int4 and NF4 weights) by their inner tensors, scales and zero points included; packed params of
``quantize_dynamic`` (float16 kept in half precision, per-channel int8 with its scales)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.generation.memory import weights_bytes
from modelprof.report.memory import memory_facts
from modelprof.runtime.tensors import stored_nbytes, tensor_nbytes


class RowInt8(torch.Tensor):
    """A weight kept as int8 rows with a float32 scale and an int8 zero point per row, computing
    in float32: the layout of torchao's ``Int8Tensor``, made here so that the mechanism is
    tested without torchao."""

    @staticmethod
    def __new__(cls, qdata, scale, zero_point):
        return torch.Tensor._make_wrapper_subclass(
            cls, qdata.shape, dtype=scale.dtype, device=qdata.device
        )

    def __init__(self, qdata, scale, zero_point):
        self.qdata, self.scale, self.zero_point = qdata, scale, zero_point

    def __tensor_flatten__(self):
        return ["qdata", "scale", "zero_point"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return RowInt8(inner["qdata"], inner["scale"], inner["zero_point"])

    @classmethod
    def quantize(cls, w: torch.Tensor) -> RowInt8:
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        return cls(
            torch.round(w / scale).to(torch.int8), scale, torch.zeros_like(scale, dtype=torch.int8)
        )

    def dequantize(self) -> torch.Tensor:
        return (self.qdata.float() - self.zero_point) * self.scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:  # nn.Parameter(w): the same storage
            return cls(args[0].qdata, args[0].scale, args[0].zero_point)
        args = [a.dequantize() if isinstance(a, cls) else a for a in args]
        return func(*args, **(kwargs or {}))


class Wrapped(torch.Tensor):
    """A subclass holding another subclass (as torchao's older ``AffineQuantizedTensor`` held a
    ``tensor_impl``): its bytes are its inner subclass's, walked down."""

    @staticmethod
    def __new__(cls, impl):
        return torch.Tensor._make_wrapper_subclass(cls, impl.shape, dtype=impl.dtype)

    def __init__(self, impl):
        self.impl = impl

    def __tensor_flatten__(self):
        return ["impl"], None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:
            return cls(args[0].impl)
        args = [a.impl.dequantize() if isinstance(a, cls) else a for a in args]
        return func(*args, **(kwargs or {}))


def _linear_with(weight_of, n_in: int = 512, n_out: int = 1024) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(n_in, n_out)
    layer.weight = nn.Parameter(weight_of(layer.weight.detach()), requires_grad=False)
    return layer


def test_a_wrapper_subclass_counts_its_inner_tensors():
    w = RowInt8.quantize(torch.randn(1024, 512))
    # int8 data 1024*512 = 524,288 + float32 scales 1024*4 = 4,096 + int8 zero points 1,024
    assert stored_nbytes(w) == tensor_nbytes(w) == 524_288 + 4_096 + 1_024 == 529_408
    assert w.numel() * w.element_size() == 2_097_152  # what it read before: 1024*512*4
    assert stored_nbytes(Wrapped(w)) == 529_408  # walked down through the outer one
    plain = torch.randn(3, 5)
    assert stored_nbytes(plain) == 3 * 5 * 4 == 60


def test_a_quantized_linear_reads_its_weight_as_stored():
    layer = _linear_with(RowInt8.quantize)
    r = profile(nn.Sequential(layer), (512,), timing=False)
    row = r.to_dataframe().set_index("module").loc["0"]
    # the products are the float layer's: 512*1024 = 524,288 MACs
    assert r.totals["macs"] == 524_288
    # elements, not bytes: weight 524,288 + bias 1,024
    assert row["params"] == 525_312
    # read: input 512*4 = 2,048 + weight as stored 529,408 + float32 bias 4,096 = 535,552
    assert row["read_bytes"] == 535_552
    assert row["write_bytes"] == 1024 * 4 == 4_096


def test_a_nested_subclass_weight_is_read_as_stored():
    layer = _linear_with(lambda w: Wrapped(RowInt8.quantize(w)), 64, 32)
    r = profile(nn.Sequential(layer), (64,), timing=False)
    # input 64*4 = 256 + int8 32*64 = 2,048 + scales 32*4 = 128 + zero points 32 + bias 128
    assert (
        r.to_dataframe().set_index("module").loc["0", "read_bytes"]
        == 256 + 2048 + 128 + 32 + 128
        == 2_592
    )


def test_memory_estimates_keep_quantized_weights_as_stored():
    model = nn.Sequential(_linear_with(RowInt8.quantize, 64, 32))
    # weight 2,048 + 128 + 32 = 2,208 as stored + float32 bias 32*4 = 128
    assert memory_facts(model, 0, [], None).param_bytes == 2_208 + 128
    # in bfloat16 the float bias is 32*2 = 64 B; the quantized weight stays as stored
    assert memory_facts(model, 0, [], torch.bfloat16).param_bytes == 2_208 + 64
    assert weights_bytes(model, torch.bfloat16) == 2_208 + 64


def _dynamic(model: nn.Module, dtype: torch.dtype, qconfig=None) -> nn.Module:
    spec = {type(m): qconfig for m in model.children()} if qconfig else {nn.Linear, nn.LSTM}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(model, spec, dtype=dtype)


def test_dynamic_float16_linear_reads_half_precision_weights():
    q = _dynamic(nn.Sequential(nn.Linear(512, 1024)), torch.float16)
    r = profile(q, (512,), timing=False)
    row = r.to_dataframe().set_index("module").loc["0"]
    # input 2,048 + weight 512*1024*2 = 1,048,576 (fp16, though unpack gives float32)
    # + float32 bias 4,096 = 1,054,720
    assert row["read_bytes"] == 1_054_720
    assert row["params"] == 525_312 and r.totals["macs"] == 524_288


def test_dynamic_float16_lstm_reads_half_precision_weights():
    x = torch.randn(5, 1, 8)
    r = profile(_dynamic(nn.Sequential(nn.LSTM(8, 16)), torch.float16), inputs=x, timing=False)
    # weights 4*16*8 + 4*16*16 = 1,536 at 2 B = 3,072; biases 2*64 float32 = 512;
    # input 5*8*4 = 160
    assert r.to_dataframe().set_index("module").loc["0", "read_bytes"] == 3_072 + 512 + 160


def test_dynamic_int8_per_channel_linear_reads_its_scales_and_zero_points():
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    q = _dynamic(nn.Sequential(nn.Linear(8, 4)), torch.qint8, qconfig)
    r = profile(q, (8,), timing=False)
    # input 8*4 = 32 + int8 weight 4*8 = 32 + float64 scales 4*8 = 32 + int64 zero points
    # 4*8 = 32 + float32 bias 4*4 = 16
    assert r.to_dataframe().set_index("module").loc["0", "read_bytes"] == 144


# -- torchao's formats ----------------------------------------------------------------------------
def _torchao_linear(config_name: str, **config) -> nn.Module:
    quantization = pytest.importorskip("torchao.quantization")
    model = nn.Sequential(nn.Linear(512, 1024))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantization.quantize_(model, getattr(quantization, config_name)(**config))
    return model


def _read_bytes(model: nn.Module) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = profile(model, (512,), timing=False)
    assert r.totals["macs"] == 512 * 1024
    return int(r.to_dataframe().set_index("module").loc["0", "read_bytes"])


# input 512*4 = 2,048 and float32 bias 1024*4 = 4,096 beside each weight
_AROUND = 2_048 + 4_096


def test_torchao_int8_weight_only():
    model = _torchao_linear("Int8WeightOnlyConfig")
    # int8 data 524,288 + float32 scale per row 4,096 + int8 zero point per row 1,024
    assert stored_nbytes(model[0].weight) == 529_408
    assert _read_bytes(model) == 529_408 + _AROUND


def test_torchao_float8_weight_only():
    model = _torchao_linear("Float8WeightOnlyConfig")
    # float8_e4m3fn data 524,288 + float32 scale per row 4,096
    assert stored_nbytes(model[0].weight) == 528_384
    assert _read_bytes(model) == 528_384 + _AROUND


def test_torchao_int4_weights_unpacked_to_int8():
    model = _torchao_linear("IntxWeightOnlyConfig", weight_dtype=torch.int4)
    # one int8 per int4 value 524,288 + float32 scale 4,096 + int8 zero point 1,024 per row
    # (one group per row of 512)
    assert stored_nbytes(model[0].weight) == 529_408
    assert _read_bytes(model) == 529_408 + _AROUND


def test_torchao_nf4_packs_two_values_a_byte():
    pytest.importorskip("torchao")
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    model = nn.Sequential(_linear_with(lambda w: to_nf4(w, 64, 256)))
    # 524,288 4-bit codes 2 a byte = 262,144; 524,288/64 = 8,192 blocks, one int8 scaler
    # each = 8,192; 8,192/256 = 32 float32 factors = 128; a float32 mean 4; the 16-entry
    # float32 code table 64: 270,532
    assert stored_nbytes(model[0].weight) == 262_144 + 8_192 + 128 + 4 + 64 == 270_532
    assert _read_bytes(model) == 270_532 + _AROUND
