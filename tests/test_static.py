"""The static table: references (torchstat, torchvision, FlopCounterMode), invariants, inputs,
errors, and that the model comes back untouched."""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter, OrderedDict
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import tv
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as module_mod
from torch.utils.flop_counter import FlopCounterMode

from modelprof import ModelProfError, ModelProfWarning, Report, profile, register_formula
from modelprof.counting.formulas import REGISTRY, Cost
from modelprof.report.rows import ADDITIVE, COLUMNS, TORCHSTAT_COLUMNS

# torchstat's own table for resnet18, a copy of shared/reference/torchstat_resnet18.csv (see
# shared/reference/README.md), kept in the repository so that any clone can run this test
REFERENCE = Path(__file__).resolve().parent / "golden" / "torchstat_resnet18.csv"


@pytest.fixture(scope="module")
def resnet18_report() -> Report:
    torch.manual_seed(0)
    return profile(tv("resnet18"), (3, 224, 224), timing=False)


# -- torchstat's table ---------------------------------------------------------------------------
def test_torchstat_view_reproduces_reference(resnet18_report):
    ref = pd.read_csv(REFERENCE)
    ours = resnet18_report.to_dataframe(style="torchstat")
    assert list(ours.columns) == list(TORCHSTAT_COLUMNS)
    by_name = ours.set_index("module name")
    pairs = [
        ("params", "params"),
        ("MAdd", "madd"),
        ("Flops", "flops"),
        ("MemRead(B)", "mem_read_b"),
        ("MemWrite(B)", "mem_write_b"),
        ("MemR+W(B)", "mem_rw_b"),
    ]
    for _, row in ref.iterrows():
        got = by_name.loc[row.module]
        assert got["input shape"] == row.input_shape, row.module
        assert got["output shape"] == row.output_shape, row.module
        assert round(got["memory(MB)"], 2) == row.memory_mb, row.module
        if row.module == "avgpool":
            continue  # torchstat wrote zeros here ("AdaptiveAvgPool2d is not supported!")
        for ours_col, ref_col in pairs:
            assert got[ours_col] == row[ref_col], (row.module, ours_col)
    avgpool = by_name.loc["avgpool"]
    # 512 channels x 7x7 window: 49 per output (48 adds + 1 divide) = 25088 = torchstat's
    # "same principle" for AvgPool; reads 512*49 floats = 100352 B, writes 512 floats = 2048 B
    assert (avgpool["MAdd"], avgpool["Flops"]) == (25088, 25088)
    assert (avgpool["MemRead(B)"], avgpool["MemWrite(B)"]) == (100352, 2048)


def test_torchstat_total_row_sums_the_table(resnet18_report):
    df = resnet18_report.to_dataframe(style="torchstat")
    body, total = df.iloc[:-1], df.iloc[-1]
    assert total["module name"] == "total"
    for col in ("params", "MAdd", "Flops", "MemRead(B)", "MemWrite(B)", "MemR+W(B)"):
        assert total[col] == body[col].sum(), col  # not torchstat's last-row MemRead bug
    assert total["params"] == 11_689_512  # torchstat's printed total
    # The ReLU of every BasicBlock runs twice: 8 second calls appear as "name (2)" rows, and
    # each block's residual add is a "(self)" row torchstat never saw.
    names = list(body["module name"])
    assert sum(n.endswith(" (2)") for n in names) == 8
    assert sum(n.endswith(".(self)") for n in names) == 8


# -- torchvision's published cost ---------------------------------------------------------------
@pytest.mark.parametrize(
    "name,expected",
    [
        ("resnet18", 1.814),
        ("mobilenet_v3_large", 0.217),
        ("vit_b_16", 17.564),
        ("swin_t", 4.491),
        ("convnext_tiny", 4.456),
        ("efficientnet_b0", 0.386),
    ],
)
def test_torchvision_published_gmacs_cpu(name, expected):
    r = profile(tv(name), (3, 224, 224), timing=False)
    assert round(r.totals["macs"] / 1e9, 3) == expected


@pytest.mark.parametrize(
    "name,crop,expected",
    [
        ("inception_v3", 299, 5.713),
        ("maxvit_t", 224, 5.558),
        ("regnet_y_400mf", 224, 0.402),
        ("swin_v2_t", 256, 5.940),
        ("densenet121", 224, 2.834),
        ("shufflenet_v2_x1_0", 224, 0.145),
        ("resnext50_32x4d", 224, 4.230),
        ("vgg16_bn", 224, 15.470),
    ],
)
def test_torchvision_published_gmacs_meta(name, crop, expected):
    # analysed on the meta device from shapes alone: no memory for activations, no compute
    r = profile(tv(name), (3, crop, crop), device="meta", timing=False)
    assert round(r.totals["macs"] / 1e9, 3) == expected


# -- FlopCounterMode ----------------------------------------------------------------------------
def _flop_counter_by_op(model, x) -> dict[str, int]:
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(x)
    return {str(k).removeprefix("aten."): v for k, v in fc.get_flop_counts()["Global"].items()}


def _ours_by_packet(report) -> dict[str, int]:
    out: Counter = Counter()
    for op, macs in zip(report.by_operator()["op"], report.by_operator()["macs"]):
        out[op.removeprefix("aten.").rsplit(".", 1)[0]] += int(macs)
    return out


class _Contractions(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(3, 4, 3)
        self.ct = nn.ConvTranspose2d(4, 2, 3, stride=2)
        self.c3 = nn.Conv3d(2, 2, 3, groups=2)
        self.fc = nn.Linear(10, 6)

    def forward(self, x):
        y = self.c1(x)  # [2, 4, 8]
        z = self.ct(y.unsqueeze(-1).expand(-1, -1, -1, 4).contiguous())
        w = self.c3(z.unsqueeze(2).expand(-1, -1, 5, -1, -1).contiguous())
        h = torch.bmm(y, y.transpose(1, 2))  # [2, 4, 4]
        return self.fc(torch.randn(2, 10)), torch.baddbmm(h, h, h), w, h @ h


@pytest.mark.parametrize(
    "model_fn,size",
    [
        (lambda: tv("resnet18"), (1, 3, 224, 224)),
        (lambda: tv("vit_b_16"), (1, 3, 224, 224)),
        (lambda: _Contractions().eval(), (2, 3, 10)),
    ],
)
def test_two_macs_equal_flop_counter_mode_per_op(model_fn, size):
    model = model_fn()
    x = torch.randn(*size)
    theirs = _flop_counter_by_op(model, x)
    ours = _ours_by_packet(profile(model, inputs=x, timing=False))
    assert theirs, "FlopCounterMode counted nothing"
    for op, flops in theirs.items():
        assert 2 * ours[op] == flops, op


# -- invariants ---------------------------------------------------------------------------------
class SharedAndFunctional(nn.Module):
    """Tied weights, a module called twice, functional ops and a direct parameter."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, ids):
        h = self.emb(ids)
        h = self.proj(h) * self.scale
        h = self.proj(h) + h  # second call of proj, residual add in the root
        return {"logits": self.head(h), "aux": None}


ZOO = {
    "resnet18": (lambda: tv("resnet18"), lambda: torch.randn(1, 3, 64, 64)),
    "mobilenet_v3_small": (lambda: tv("mobilenet_v3_small"), lambda: torch.randn(2, 3, 64, 64)),
    "shared": (lambda: SharedAndFunctional().eval(), lambda: torch.randint(0, 20, (2, 5))),
    "lstm": (lambda: nn.LSTM(4, 8, 2).eval(), lambda: torch.randn(5, 2, 4)),
    "encoder": (
        lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, enable_nested_tensor=False
        ).eval(),
        lambda: torch.randn(2, 6, 16),
    ),
}


@pytest.mark.parametrize("name", list(ZOO))
def test_leaf_rows_add_up_to_totals(name):
    model_fn, input_fn = ZOO[name]
    model = model_fn()
    r = profile(model, inputs=input_fn(), timing=False)
    df = r.to_dataframe()
    assert list(df.columns) == list(COLUMNS)
    leaves = df[df["leaf"]]
    for k in set(ADDITIVE) - {"output_bytes"}:  # that total: the model's output (below)
        assert int(leaves[k].sum()) == r.totals[k], k
    # the root row aggregates the whole tree: same macs/flops/params as the totals
    root = df.iloc[0]
    assert root["module"] == "" and root["depth"] == 0
    for k in ("params", "macs", "flops", "madd", "read_bytes", "write_bytes", "output_bytes"):
        assert int(root[k]) == r.totals[k], k
    # every distinct parameter of the model took part, each counted once
    assert r.totals["params"] == sum(p.numel() for p in model.parameters())


def test_shared_parameters_and_repeated_calls():
    r = profile(SharedAndFunctional().eval(), inputs=torch.randint(0, 20, (2, 5)), timing=False)
    df = r.to_dataframe()
    proj = df[df["module"] == "proj"]
    assert list(proj["call"]) == [1, 2]
    # params are charged to the first call (8*8 + 8 = 72), so leaf rows add up
    assert list(proj["params"]) == [72, 0]
    head = df[df["module"] == "head"].iloc[0]
    assert head["params"] == 0  # its weight is emb's, charged there (20*8 = 160)
    assert df[df["module"] == "emb"].iloc[0]["params"] == 160
    root_self = df[df["module"] == "(self)"].iloc[0]
    # the root's own parameter "scale" (8) and its ops: 2x5x8 = 80 elements for "* scale" and
    # 80 for "+ h": 160 flops
    assert (root_self["params"], root_self["flops"]) == (8, 160)
    # both proj calls read the weights (72 floats = 288 B) and their input (80 floats = 320 B)
    assert list(proj["read_bytes"]) == [608, 608]


def _views_between() -> nn.Module:
    """Conv2d(3, 4, 3) and Linear(36, 2) with four leaves between that run no op but views
    (Flatten, Unflatten) or none (eval Dropout, Identity)."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Identity(),
        nn.Unflatten(1, (4, 36)),
        nn.Linear(36, 2),
    ).eval()


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_leaf_of_views_only_reads_and_writes_nothing(device):
    r = profile(_views_between(), (3, 8, 8), device=device, timing=False)
    df = r.to_dataframe().set_index("module")
    ts = r.to_dataframe(style="torchstat").set_index("module name")
    for name in "1234":  # each was charged its 1x4x6x6 float32 = 576 B in and out
        assert (df.loc[name, "read_bytes"], df.loc[name, "write_bytes"]) == (0, 0), name
        assert df.loc[name, "output_bytes"] == 576, name  # it still returns the tensor
        assert (ts.loc[name, "MemRead(B)"], ts.loc[name, "MemWrite(B)"]) == (0, 0), name
    # conv reads 1x3x8x8 floats (768 B) + (108 + 4) params (448 B) = 1216, writes 576 B;
    # Linear reads 576 B + (72 + 2) params (296 B) = 872, writes 1x4x2 floats = 32 B
    assert (r.totals["read_bytes"], r.totals["write_bytes"]) == (1216 + 872, 576 + 32)
    # no tensor of their own: saved for the backward (every leaf output) conv's and Linear's
    # 576 + 32 = 608 B (not 5 x 576 + 32); activations: conv's 576 B beyond the inputs,
    # Linear's 576 + 32 = 608 B (not Flatten's 576 + 576)
    est = r.memory_estimate()
    assert est.loc["saved for backward", "training_step"] == 608
    assert est.loc["activations", "inference"] == 608


def test_a_dropout_in_training_still_reads_and_writes():
    # train mode: a mask drawn and multiplied in, ops that touch the tensor: the leaf rule,
    # its 1x4 float32 input (16 B) read and output (16 B) written
    r = profile(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), (4,), training=True, timing=False)
    row = r.to_dataframe().set_index("module").loc["1"]
    assert (row["read_bytes"], row["write_bytes"]) == (16, 16)


def test_outputs_of_every_kind_and_inputs_by_keyword():
    @dataclasses.dataclass
    class Out:
        a: torch.Tensor
        b: list

    class Multi(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x, *, mask=None, extra=None):
            y = self.fc(x * mask)
            return Out(y, [y.sum(), None])

    m = Multi()
    r = profile(m, inputs={"x": torch.randn(2, 4), "mask": torch.ones(2, 4)}, timing=False)
    df = r.to_dataframe()
    assert df.iloc[0]["input_shape"] == "2x4, 2x4"  # both keyword tensors seen
    assert df.iloc[0]["output_shape"] == "2x3, ()"
    # fc: 2*4*3 = 24 MACs
    assert r.totals["macs"] == 24


def test_list_inputs_like_detection_models():
    class Det(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 1, bias=False)

        def forward(self, images):
            return [self.conv(img[None]) for img in images]

    r = profile(Det(), inputs=([torch.randn(3, 4, 4), torch.randn(3, 2, 2)],), timing=False)
    # 1x1 conv 3->2: 16 + 4 = 20 positions x 2 x 3 = 120 MACs
    assert r.totals["macs"] == 120
    assert r.batch_size == 2
    assert list(r.to_dataframe()["call"][r.to_dataframe()["module"] == "conv"]) == [1, 2]


def test_meta_model_from_shapes_alone():
    with torch.device("meta"):
        big = nn.Sequential(nn.Linear(16384, 16384), nn.GELU(), nn.Linear(16384, 16384))
    # 2 x 1 GiB of float32 weights that never exist; 8 tokens: 2 * 8 * 16384^2 = 4294967296
    r = profile(big, (8, 16384), timing=False)
    assert r.device == "meta"
    assert r.totals["macs"] == 2 * 8 * 16384 * 16384


def test_a_model_reading_a_value_on_meta_is_pointed_to_the_cpu():
    # a forward that asks a tensor for its value (.item(), a data-dependent branch) cannot run
    # on meta: the error says why and where it can be counted (a newcomer's GPT-2 with
    # use_cache=False met the bare "Tensor.item() cannot be called on meta tensors")
    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) * 2 if x.sum().item() > 0 else self.fc(x)

    with pytest.raises(ModelProfError, match=r"no values.*device='cpu'") as err:
        profile(Reads(), (4,), device="meta", timing=False)
    assert "use_cache" not in str(err.value)  # (a transformers model's hint only)
    assert profile(Reads(), (4,), timing=False).totals["macs"] == 16  # 4 x 4 on the CPU


def test_dtype_and_device_conversion_leave_the_model_alone():
    model = nn.Sequential(nn.Linear(8, 4)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r64 = profile(model, (8,), dtype=torch.float64, timing=False)
    r_meta = profile(model, (8,), device="meta", timing=False)
    r32 = profile(model, (8,), timing=False)
    # float64: reads input 8*8 B + params 36*8 B = 352, float32 half of that: 176
    assert (r64.totals["read_bytes"], r32.totals["read_bytes"]) == (352, 176)
    # the converted copies' parameters are the ones charged: Linear(8, 4) has 8*4 + 4 = 36
    assert r64.totals["params"] == r32.totals["params"] == 36
    assert r_meta.totals == r32.totals
    assert r64.dtype == "float64"
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- never leave a trace ------------------------------------------------------------------------
def _snapshot(model: nn.Module):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {n: m.training for n, m in model.named_modules()},
        {n: (len(m._forward_hooks), len(m._forward_pre_hooks)) for n, m in model.named_modules()},
        (len(module_mod._global_forward_hooks), len(module_mod._global_forward_pre_hooks)),
        nn.Module.__call__,
        nn.Linear.forward,
        torch.Tensor.__add__,
    )


def _assert_same(model, snap):
    state, flags, hooks, global_hooks, call, linear_fwd, add = _snapshot(model)
    assert state.keys() == snap[0].keys()
    assert all(torch.equal(state[k], snap[0][k]) for k in state)
    assert flags == snap[1]
    assert hooks == snap[2]
    assert global_hooks == snap[3]
    assert (call, linear_fwd, add) == snap[4:]


class Boom(nn.Module):
    def __init__(self, exc: BaseException):
        super().__init__()
        self.ok = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        self.bad = nn.Linear(4, 4)
        self.exc = exc

    def forward(self, x):
        x = self.ok(x)
        if self.exc is not None:
            raise self.exc
        return self.bad(x)


def test_model_untouched_after_success_train_mode_and_mixed_flags():
    model = Boom(None)
    model.train()
    model.ok[1].eval()  # mixed flags must come back mixed
    snap = _snapshot(model)
    profile(model, (4,), batch_size=3, timing=False)
    _assert_same(model, snap)
    profile(model, (4,), batch_size=3, timing=False, training=True)  # BN stats must not move
    _assert_same(model, snap)


@pytest.mark.parametrize("exc", [RuntimeError("kaput"), KeyboardInterrupt()])
def test_model_untouched_after_forward_raises(exc):
    model = Boom(exc).eval()
    snap = _snapshot(model)
    expected = ModelProfError if isinstance(exc, Exception) else KeyboardInterrupt
    with pytest.raises(expected) as info:
        profile(model, (4,), timing=False)
    _assert_same(model, snap)
    if expected is ModelProfError:
        msg = str(info.value)
        assert "'(root)'" in msg and "Boom" in msg and "kaput" in msg
        assert "ok.0, ok.1, ok" in msg  # the modules that ran before it


def test_failing_module_is_named():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(10, 2))
    with pytest.raises(ModelProfError) as info:
        profile(model, (3, 8, 8), timing=False)
    msg = str(info.value)
    assert "in module '2' (Linear, input 1x288)" in msg
    assert "modules that ran before it: 0, 1" in msg


@pytest.mark.parametrize(
    "hooked,where,before",
    [  # modelprof's own hooks (global) run before the module's: its forward had returned
        ("block.0", "'block.0' (Linear, input 2x4), after its forward returned; running: "
         "(root) > block > block.0", "modules that ran before it: pre."),
        ("pre", "'pre' (Linear, input 2x4), after its forward returned; running: (root) > pre",
         "no module finished before it."),
        ("", "'(root)' (Sequential, input 2x4), after its forward returned; running: (root)",
         "modules that ran before it: pre, block.0, block.1, block."),
    ],
)  # fmt: skip
def test_a_forward_hook_that_raises_is_named_on_its_module(hooked, where, before):
    # a user's forward hook on block.0 raising was blamed on its parent 'block', with block.0
    # among the modules that ran; on the root, "before any module ran" beside all of them
    model = nn.Sequential(
        OrderedDict(pre=nn.Linear(4, 4), block=nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    )

    def broke(module, args, output):
        raise RuntimeError("the hook broke")

    model.get_submodule(hooked).register_forward_hook(broke)
    with pytest.raises(ModelProfError) as info:
        profile(model, (4,), batch_size=2, timing=False)
    msg = str(info.value)
    assert f"failed in a forward hook on module {where}; {before}" in msg, msg
    assert "RuntimeError: the hook broke" in msg


def test_running_twice_gives_identical_numbers():
    model = tv("mobilenet_v3_small")
    a = profile(model, (3, 96, 96), timing=False).to_dataframe()
    b = profile(model, (3, 96, 96), timing=False).to_dataframe()
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"input_size": (3, -1, 4)}, "dimension <= 0"),
        ({"input_size": "3,224,224"}, "'3,224,224'"),
        ({"input_size": (3, 2.5)}, "(3, 2.5)"),
        ({"input_size": (4,), "batch_size": 0}, "batch_size=0"),
        ({"input_size": (4,), "dtype": "int8"}, "'int8'"),
        ({"input_size": (4,), "device": "nodevice"}, "'nodevice'"),
        ({}, "exactly one of input_size"),
        ({"input_size": (4,), "inputs": torch.randn(1, 4)}, "exactly one of input_size"),
        ({"inputs": {1: torch.randn(1, 4)}}, "keys must be argument names"),
        ({"input_size": (3, 5, 5)}, "in module '(root)' (Linear, input 1x3x5x5)"),  # model rejects
    ],
)
def test_bad_input_raises_named_error(kwargs, needle):
    with pytest.raises(ModelProfError) as info:
        profile(nn.Linear(4, 2), timing=False, **kwargs)
    assert needle in str(info.value)


def test_non_module_and_bad_style():
    with pytest.raises(ModelProfError, match="function is not a torch.nn.Module"):
        profile(lambda x: x, (4,))
    # a name, as compare() and the command line take: not a hint to time a callable
    with pytest.raises(ModelProfError) as info:
        profile("resnet18", (3, 32, 32))
    assert str(info.value).startswith("model='resnet18' is a name, not a torch.nn.Module")
    assert "load_model('resnet18')[0]" in str(info.value)
    assert "measure_latency" not in str(info.value)
    r = profile(nn.Linear(4, 2), (4,), timing=False)
    with pytest.raises(ModelProfError, match="style='fancy'"):
        r.to_dataframe(style="fancy")


# -- unsupported ops and register_formula -------------------------------------------------------
class QR(nn.Module):
    """A QR decomposition: an op with no formula and no decomposition (FFTs have one now)."""

    def forward(self, x):
        q, _ = torch.linalg.qr(x.reshape(4, 4))
        return q.abs()


def test_unsupported_op_is_reported_never_silent():
    with pytest.warns(ModelProfWarning, match=r"aten.linalg_qr.default \(1 call\)"):
        r = profile(QR(), (16,), timing=False)
    assert r.unsupported == {"aten.linalg_qr.default": 1}
    ops = r.by_operator().set_index("op")
    assert not ops.loc["aten.linalg_qr.default", "supported"]


def test_register_formula_adds_and_replaces_in_a_private_registry():
    reg = REGISTRY.copy()

    @register_formula(torch.ops.aten.linalg_qr, registry=reg)
    def _qr(args, kwargs, out):
        m, n = args[0].shape[-2:]
        # Householder QR: 2 m n^2 - 2 n^3 / 3 flops
        return Cost(0, flops=2 * m * n * n - 2 * n**3 // 3)

    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelProfWarning)
        r = profile(QR(), (16,), timing=False, registry=reg)
    # 2*4*4*4 - 2*64//3 = 128 - 42 = 86 for the QR, plus abs over the 16 outputs: 102
    assert r.totals["flops"] == 102
    with pytest.raises(ModelProfError, match="already registered"):
        register_formula(torch.ops.aten.linalg_qr, registry=reg)(_qr)
    register_formula("aten.linalg_qr", registry=reg, replace=True)(lambda a, k, o: Cost(0, 1))
    assert profile(QR(), (16,), timing=False, registry=reg).totals["flops"] == 1 + 16
    assert torch.ops.aten.linalg_qr not in REGISTRY.ops  # the global registry is untouched


@pytest.mark.parametrize(
    "key,needle",
    [
        (42, "42"),
        ("aten.no_such_op", "'aten.no_such_op'"),
        ("conv", "'conv'"),
        (int, "int"),
    ],
)
def test_register_formula_rejects_bad_keys(key, needle):
    with pytest.raises(ModelProfError) as info:
        register_formula(key, registry=REGISTRY.copy())(lambda a, k, o: Cost())
    assert needle in str(info.value)


def test_module_formula_for_torchstat_view():
    reg = REGISTRY.copy()
    register_formula(nn.ReLU, registry=reg)(lambda m, ins, outs: {"Flops": 7})
    r = profile(nn.Sequential(nn.ReLU()), (4,), timing=False, registry=reg)
    df = r.to_dataframe(style="torchstat")
    assert df.set_index("module name").loc["0", "Flops"] == 7


# -- exports ------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["modelprof", "torchstat"])
def test_csv_round_trip_and_markdown(tmp_path, resnet18_report, style):
    path = resnet18_report.to_csv(tmp_path / f"r18_{style}.csv", style=style)
    back = pd.read_csv(path, keep_default_na=False, na_values=[""] if style == "torchstat" else [])
    df = resnet18_report.to_dataframe(style)
    numeric = [c for c in df.columns if pd.api.types.is_integer_dtype(df[c])]
    for c in numeric:
        assert list(back[c]) == list(df[c]), c
    md = resnet18_report.to_markdown(style=style)
    assert md.count("\n") >= len(df)
    assert "layer1.0.conv1" in md


def test_peak_memory_nesting_with_fake_allocator_stats():
    """The CUDA allocator peak per call, driven by fake stats: a child's reset must not lose
    the parent's peak (CUDA itself is exercised by the cuda-marked test below)."""
    from modelprof.counting.scope import Tracker
    from modelprof.runtime.device import MemoryStats
    from modelprof.runtime.hooks import module_names

    state = {"current": 100, "peak": 100}

    def max_allocated():
        return state["peak"]

    def reset():
        state["peak"] = state["current"]

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tracker = Tracker(module_names(model), memory_stats=MemoryStats(max_allocated, reset))
    tracker.pre(model, (), {})
    state["peak"] = 500  # the parent allocates before any child
    tracker.pre(model[0], (), {})
    state["peak"] = 300  # child 0 peaks at 300
    tracker.post(model[0], (), {}, None)
    tracker.pre(model[1], (), {})
    state["peak"] = 200  # child 1 peaks at 200
    tracker.post(model[1], (), {}, None)
    tracker.post(model, (), {}, None)
    root, first, second = tracker.records
    assert (first.peak_memory_bytes, second.peak_memory_bytes) == (300, 200)
    assert root.peak_memory_bytes == 500  # max(500 before child 0, 300, 200)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_analysed_on_cuda_cpu_and_meta_alike():
    model = tv("resnet18").cuda()
    on_cuda = profile(model, (3, 224, 224), timing=False)
    on_cpu = profile(model, (3, 224, 224), device="cpu", timing=False)
    on_meta = profile(model, (3, 224, 224), device="meta", timing=False)
    assert on_cuda.totals == on_cpu.totals == on_meta.totals
    peaks = [r.peak_memory_bytes for r in on_cuda.rows if not r.is_self]
    assert all(p > 0 for p in peaks)
    assert next(model.parameters()).device.type == "cuda"


def test_torchscript_module_is_one_opaque_row_not_zeros():
    scripted = torch.jit.script(nn.Sequential(nn.Linear(4, 3), nn.ReLU()))
    r = profile(scripted, (4,), timing=False)
    # no Python hook fires inside TorchScript: one row holds the whole call.
    # linear 4*3 = 12 MACs -> 24 flops + 3 bias adds, relu 3: 30 flops; params 15
    assert len(r.rows) == 1
    assert (r.totals["macs"], r.totals["flops"], r.totals["params"]) == (12, 30, 15)


def test_a_traced_module_reads_its_submodules_weights():
    traced = torch.jit.trace(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)), torch.ones(2, 8))
    r = profile(traced, inputs=torch.ones(2, 8), timing=False)
    # one row (the traced graph runs no Python hook inside); it reads its input, 2*8 float32 =
    # 64 B, and its submodules' weights, (8*8 + 8 + 8*4 + 4) * 4 B = 432 B
    assert len(r.rows) == 1
    assert (r.totals["params"], r.totals["read_bytes"]) == (108, 64 + 432)


class _CallsForwardItself(nn.Module):
    """A root whose ``__call__`` runs ``forward`` directly: no hook fires for it, its children's
    do, and the first of them is where the parameters start to be charged."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8, 8))
        self.l, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, x):
        return self.k(self.l(x) @ self.w + F.linear(x, self.k.weight))


def test_parameters_are_charged_alike_whether_or_not_the_model_is_converted():
    model = _CallsForwardItself()
    same = profile(model, (8,), timing=False)
    converted = profile(model, (8,), timing=False, dtype=torch.float64)
    # the root's call is never seen, so the parameters to charge are those of the first call
    # seen, l (8*8 + 8 = 72), in both paths (the converted one runs copies of the parameters)
    assert (
        [(r.module, r.params) for r in same.rows]
        == [(r.module, r.params) for r in converted.rows]
        == [("l", 72), ("k", 0)]
    )
    assert same.model_params == converted.model_params == 64 + 2 * 72  # w, l, k


def test_compiled_module_is_costed_through_the_original():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    compiled = torch.compile(model, backend="eager")
    r = profile(compiled, (4,), timing=False)
    assert list(r.to_dataframe()["module"]) == ["", "0", "1"]
    assert r.totals["macs"] == 12  # 4 * 3


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.emb(x))


@pytest.mark.parametrize("kw", [{"device": "meta"}, {"dtype": "bf16"}, {"training": True}])
def test_tied_weights_survive_conversion(kw):
    r = profile(Tied(), inputs=torch.tensor([[1, 2, 3]]), timing=False, **kw)
    # 40 shared parameters once; head: 3 tokens x 4 x 10 = 120 MACs
    assert (r.totals["params"], r.totals["macs"]) == (40, 120)


def test_ops_in_user_hooks_on_the_root_are_counted():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    handle = m.register_forward_hook(lambda mod, i, o: o * 2 + 1)
    r = profile(m, (4,), timing=False)
    handle.remove()
    # linear 2*16 + 4 bias = 36, relu 4, the hook's mul 4 and add 4: 48
    assert r.totals["flops"] == 48 == int(r.by_operator()["flops"].sum())


def test_parameters_used_without_calling_their_module():
    class Direct(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a.forward(x))  # a's forward without __call__: no hook for a

    r = profile(Direct(), (4,), timing=False)
    assert r.totals["params"] == r.model_params == 40  # 2 x (16 + 4)
    df = r.to_dataframe().set_index("module")
    assert df.loc["(self)", "params"] == 20  # charged to the call whose ops read them


def test_exception_caught_by_a_parent_keeps_the_call_tree():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.lin(x)
            raise ValueError("no fast path")

    class Fallback(nn.Module):
        def __init__(self):
            super().__init__()
            self.fast, self.slow, self.out = Bad(), nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            try:
                x = self.fast(x)
            except ValueError:
                x = self.slow(x)
            return self.out(x)

    df = profile(Fallback(), (4,), timing=False).to_dataframe().set_index("module")
    assert (df.loc["slow", "depth"], df.loc["out", "depth"]) == (1, 1)
    assert df.loc["", "output_shape"] == "1x2"


def test_lazy_modules_are_refused_before_anything_changes():
    model = nn.Sequential(nn.LazyLinear(5))
    with pytest.raises(ModelProfError, match="uninitialised lazy parameters"):
        profile(model, (4,), timing=False)
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"dtpye": "fp16"}, "dtpye"),
        ({"training": "yes"}, "training='yes'"),
        ({"registry": 5}, "registry=5"),
    ],
)
def test_bad_options_fail_loudly_without_timing(kw, needle):
    with pytest.raises(ModelProfError) as info:
        profile(nn.Linear(4, 4), (4,), timing=False, **kw)
    assert needle in str(info.value)


def test_profile_leaves_the_global_rng_and_hook_registries_alone():
    model = nn.Linear(4, 4)  # built first: its initialisation draws from the global RNG
    state = torch.random.get_rng_state()
    kwargs_registry = dict(module_mod._global_forward_hooks_with_kwargs)
    profile(model, (4,), timing=False)
    assert torch.equal(state, torch.random.get_rng_state())
    assert dict(module_mod._global_forward_hooks_with_kwargs) == kwargs_registry


def test_torchstat_view_madd_for_biased_conv_softmax_and_plain_batchnorm():
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, affine=False), nn.Softmax(1))
    ts = profile(model, (2, 5, 5), timing=False).to_dataframe("torchstat").set_index("module name")
    # conv: 27 outputs (3x3x3) of (2*18 - 1) + 1 bias = 36: 972 (torchstat's compute_madd)
    assert ts.loc["0", "MAdd"] == 972
    assert ts.loc["1", "MAdd"] == 4 * 27  # torchstat: 4 per element, affine or not
    # softmax over 3 channels at 9 positions: 9 * (3*3 - 1) = 72
    assert ts.loc["2", "MAdd"] == 72


def test_resnet50_counted_on_meta_equals_the_real_pass_row_by_row():
    # device="meta": a counting-only profile on meta runs no kernels; for resnet50 every row's
    # counts equal the real pass's
    tv = pytest.importorskip("torchvision")
    model = tv.models.resnet50().eval()
    cols = [
        "module",
        "type",
        "params",
        "macs",
        "flops",
        "madd",
        "read_bytes",
        "write_bytes",
        "output_bytes",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = profile(model, (3, 224, 224), timing=False).to_dataframe()[cols]
        meta = profile(model, (3, 224, 224), device="meta", timing=False).to_dataframe()[cols]
    pd.testing.assert_frame_equal(real, meta)
    assert int(real.macs.iloc[0]) == 4_089_184_256  # torchvision's 4.09 GMACs
