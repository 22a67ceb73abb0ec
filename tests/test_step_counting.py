"""``profile(..., backward=True)`` counting: closed forms of the backward per call, the loss and
optimizer rows, saved-tensor bytes, the meta device, AMP, and agreement with FlopCounterMode."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modelprof import ModelProfError, profile

COUNT = dict(timing=False, roofline=False)


def rows(report) -> dict[tuple[str, int], dict]:
    df = report.to_dataframe()
    return {(r.module, r.call): r._asdict() for r in df.itertuples(index=False)}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


# -- linear and conv stacks, with and without input grad ----------------------------------------
def test_linear_stack_without_input_grad():
    r = profile(mlp(), (8,), batch_size=3, backward=True, **COUNT)
    t = rows(r)
    # forward: 3*8*16 = 384 + 3*16*4 = 192 -> 576 MACs
    assert r.totals["macs"] == 576
    # layer 0 sees the input (no grad): weight grad only, [16, 3] @ [3, 8] = 384 MACs;
    # bias grad = sum over the batch of 3x16 = 48 flops -> 2*384 + 48 = 816
    assert (t[("0", 1)]["backward_macs"], t[("0", 1)]["backward_flops"]) == (384, 816)
    # relu: threshold_backward over 3x16 = 48 elements, 1 flop each
    assert (t[("1", 1)]["backward_macs"], t[("1", 1)]["backward_flops"]) == (0, 48)
    # layer 2: input grad [3, 4] @ [4, 16] = 192 + weight grad [4, 3] @ [3, 16] = 192 -> 384
    # MACs = 2x its forward; bias 3*4 = 12 -> 2*384 + 12 = 780
    assert (t[("2", 1)]["backward_macs"], t[("2", 1)]["backward_flops"]) == (384, 780)
    # the root aggregates its children; leaf rows add up to the totals: 384 + 384 = 768
    assert t[("", 1)]["backward_macs"] == r.totals["backward_macs"] == 768
    # (loss) = sum of the 3x4 output: forward 12 flops; backward: ones_like + expand, 0
    assert (t[("(loss)", 1)]["flops"], t[("(loss)", 1)]["backward_flops"]) == (12, 0)
    assert r.totals["backward_flops"] == 816 + 48 + 780


def test_linear_stack_with_input_grad_is_twice_the_forward():
    x = torch.randn(3, 8, requires_grad=True)
    r = profile(mlp(), inputs=x, backward=True, **COUNT)
    t = rows(r)
    # layer 0 now also computes the input grad [3, 16] @ [16, 8] = 384: 768 = 2 x 384
    assert t[("0", 1)]["backward_macs"] == 768
    assert r.totals["backward_macs"] == 2 * r.totals["macs"] == 1152  # 2 x 576
    assert x.grad is None  # the user's input gets no gradient


def conv_stack() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))


@pytest.mark.parametrize("input_grad", [False, True])
def test_conv_stack(input_grad):
    x = torch.randn(2, 3, 8, 8, requires_grad=input_grad)
    t = rows(profile(conv_stack(), inputs=x, backward=True, **COUNT))
    conv1 = 2 * 8 * 64 * 3 * 9  # N*C_out*H*W * C_in*k*k = 27648 forward MACs
    conv2 = 2 * 4 * 64 * 8 * 9  # 36864
    assert (t[("0", 1)]["macs"], t[("2", 1)]["macs"]) == (conv1, conv2)
    # conv1: weight grad (1x forward), + input grad (another 1x) only when the input needs grad
    assert t[("0", 1)]["backward_macs"] == conv1 * (2 if input_grad else 1)
    # its bias grad sums grad_output, 2*8*64 = 1024 elements
    assert t[("0", 1)]["backward_flops"] == 2 * t[("0", 1)]["backward_macs"] + 1024
    # conv2: input and weight grads = 2 x 36864 = 73728; bias 2*4*64 = 512
    assert t[("2", 1)]["backward_macs"] == 2 * conv2
    assert t[("2", 1)]["backward_flops"] == 4 * conv2 + 512


def test_frozen_layers_cost_no_weight_gradient():
    model = conv_stack()
    for p in model[2].parameters():
        p.requires_grad_(False)
    t = rows(profile(model, (3, 8, 8), batch_size=2, backward=True, **COUNT))
    # conv2 frozen: only the input grad it passes back, 36864 MACs, no bias grad
    assert (t[("2", 1)]["backward_macs"], t[("2", 1)]["backward_flops"]) == (36864, 2 * 36864)
    # conv1 trainable, input without grad: weight grad 27648 + bias grad 1024 elements
    assert (t[("0", 1)]["backward_macs"], t[("0", 1)]["backward_flops"]) == (27648, 56320)
    assert all(p.requires_grad is False for p in model[2].parameters())  # flags left as they were

    for p in model[0].parameters():
        p.requires_grad_(False)
    model[2].weight.requires_grad_(True)
    t = rows(profile(model, (3, 8, 8), batch_size=2, backward=True, **COUNT))
    # conv1 frozen and first: no node at all, 0; conv2: weight grad only, 36864
    assert t[("0", 1)]["backward_macs"] == 0
    assert t[("2", 1)]["backward_macs"] == 36864


class Tied(nn.Module):
    """One Linear called twice: a weight shared by two calls."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


def test_weight_tied_across_two_calls():
    r = profile(Tied(), (8,), batch_size=3, backward=True, **COUNT)
    t = rows(r)
    # call 2 (input needs grad): input grad 3*8*8 = 192 + weight grad 192 = 384 MACs
    assert t[("fc", 2)]["backward_macs"] == 384
    assert t[("fc", 2)]["backward_flops"] == 768
    # call 1 (input without grad): weight grad 192 MACs; the sum of the two weight gradients
    # (8x8 = 64 adds) goes to the call that owns the weight, the first: 2*192 + 64 = 448
    assert t[("fc", 1)]["backward_macs"] == 192
    assert t[("fc", 1)]["backward_flops"] == 448
    assert (t[("fc", 1)]["params"], t[("fc", 2)]["params"]) == (64, 0)


def test_lstm_backward_of_the_gates():
    if not torch.backends.mkldnn.is_available():
        pytest.skip("the closed form below is oneDNN's fused LSTM layer (the CPU path here)")
    torch.manual_seed(0)
    lstm = nn.LSTM(8, 16, num_layers=2)
    r = profile(lstm, (3, 8), batch_size=5, backward=True, **COUNT)  # 5 steps x batch 3
    assert "aten.mkldnn_rnn_layer_backward.default" in set(r.by_operator("backward")["op"])
    # 15 tokens; layer 1: 4*16*(8 + 16) = 1536 MACs per token, layer 2: 4*16*(16 + 16) = 2048
    forward = 15 * (1536 + 2048)  # 53760
    assert r.totals["macs"] == forward
    # the fused backward computes the data gradients (input, hidden state) and the weight
    # gradients: 2 x the gate MACs
    assert r.totals["backward_macs"] == 2 * forward


class Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("backend", ["MATH", "FLASH_ATTENTION"])
def test_sdpa_backward(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (
        torch.randn(2, 3, 4, 8, requires_grad=True),
        torch.randn(2, 3, 5, 8, requires_grad=True),
        torch.randn(2, 3, 5, 8, requires_grad=True),
    )
    with sdpa_kernel(getattr(SDPBackend, backend)):
        r = profile(Attention(), inputs=(q, k, v), backward=True, **COUNT)
    scores = 2 * 3 * 4 * 5  # bh * l_q * l_k = 120
    assert r.totals["macs"] == scores * (8 + 8)  # Q K^T and P V: 1920
    if backend == "MATH":
        # bmm backward: dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: 4 x 960 = 2 x forward
        assert r.totals["backward_macs"] == 2 * 1920
    else:
        # the fused kernel recomputes Q K^T: 120 * (3*8 + 2*8) = 4800 = 2.5 x forward
        assert r.totals["backward_macs"] == 4800


def test_resnet18_backward_macs_with_input_grad():
    torchvision = pytest.importorskip("torchvision")
    x = torch.randn(1, 3, 224, 224, requires_grad=True)
    r = profile(torchvision.models.resnet18(), inputs=x, backward=True, **COUNT)
    assert r.totals["macs"] == 1_814_073_344  # torchvision's published 1.814 GMACs
    # every conv and the fc compute input and weight gradients: 2 x 1,814,073,344
    assert r.totals["backward_macs"] == 3_628_146_688
    assert not r.unsupported


def test_meta_device_counts_the_same_backward():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18()
    r = profile(model, (3, 224, 224), device="meta", backward=True, **COUNT)
    # as above, minus conv1's input gradient (the input needs no grad): 118,013,952 MACs
    assert r.totals["backward_macs"] == 3_628_146_688 - 118_013_952
    assert next(model.parameters()).device.type == "cpu"


# -- loss, optimizer, saved bytes, amp ----------------------------------------------------------
def test_cross_entropy_loss_row():
    target = torch.tensor([1, 0, 3])
    r = profile(
        mlp(), (8,), batch_size=3, backward=True, loss_fn=F.cross_entropy, target=target, **COUNT
    )
    loss = rows(r)[("(loss)", 1)]
    assert loss["type"] == "cross_entropy"
    # log_softmax over 3x4 logits (5 per element, 60) + nll_loss's mean over 3 targets (3)
    assert (loss["macs"], loss["flops"]) == (0, 63)
    # backward: nll_loss 1 per target (3) + log_softmax's 4 per element (48)
    assert loss["backward_flops"] == 51
    assert not r.unsupported


@pytest.mark.parametrize(
    "optimizer", [torch.optim.AdamW, "adamw", lambda params: torch.optim.AdamW(params, lr=1e-3)]
)
def test_optimizer_row_by_formula(optimizer):
    r = profile(mlp(), (8,), batch_size=3, backward=True, optimizer=optimizer, **COUNT)
    opt = rows(r)[("(optimizer)", 1)]
    n = 8 * 16 + 16 + 16 * 4 + 4  # 212 parameters, all with a gradient
    assert opt["type"] == "AdamW"
    assert (opt["macs"], opt["flops"]) == (0, 14 * n)  # AdamW: 14 flops per element
    assert (opt["read_bytes"], opt["write_bytes"]) == (4 * n * 4, 3 * n * 4)  # p, g, m, v / p, m, v
    assert (opt["backward_macs"], opt["params"]) == (0, 0)
    # leaf rows still add up to the totals, the step's rows included
    df = r.to_dataframe()
    assert df[df["leaf"]]["flops"].sum() == r.totals["flops"]


def test_optimizer_template_instance_is_never_touched():
    model = mlp()
    user_opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "momentum": 0.9}, {"params": model[2].parameters()}],
        lr=0.1,
    )
    r = profile(model, (8,), batch_size=3, backward=True, optimizer=user_opt, **COUNT)
    # group 1 (layer 0, 144 elements) with momentum (dampening 0): 4 per element; group 2 (68): 2
    assert rows(r)[("(optimizer)", 1)]["flops"] == 4 * 144 + 2 * 68
    assert user_opt.state == {} or all(not s for s in user_opt.state.values())
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("foreach", [False, True])
def test_optimizer_without_formula_is_counted_by_its_ops(foreach):
    # foreach=True (torch's default on CUDA) runs the _foreach_ forms of the same ops, over
    # lists of tensors: they counted 0 (unsupported) until counted per element of their list
    def rmsprop(params):
        return torch.optim.RMSprop(params, foreach=foreach)

    r = profile(mlp(), (8,), batch_size=3, backward=True, optimizer=rmsprop, **COUNT)
    opt = r.training_step.cost.optimizer
    assert opt.counted_by == "ops"
    # single-tensor RMSprop: v.mul_ 1, v.addcmul_(g, g, value=1 - alpha) 3, sqrt 1, add_(eps)
    # 1, p.addcdiv_(g, avg, value=-lr) 3 = 9 per element (the fused ops at their arithmetic,
    # as Adam's formula counts them) over 212 elements, + the 4 tensors' step counters
    assert opt.flops == 9 * 212 + 4
    # written: v twice, the new avg, avg again, p: 5 x 212 float32 (848 B), + the 4 step
    # counters (4 B each); in place, a _foreach_ op writes its first list (it returns None)
    assert opt.write_bytes == 5 * 848 + 4 * 4
    assert not r.unsupported  # (its record_function bookkeeping ops are free, not unknown)


def test_saved_tensor_bytes_per_call():
    t = rows(profile(mlp(), (8,), batch_size=3, backward=True, **COUNT))
    # layer 0 keeps its input for the weight gradient: 3x8 fp32 = 96 B (its weight, a
    # parameter, is not activation memory); relu keeps its output 3x16 = 192 B; layer 2's input
    # is that same tensor, counted once (at relu)
    assert (t[("0", 1)]["saved_bytes"], t[("1", 1)]["saved_bytes"], t[("2", 1)]["saved_bytes"]) == (
        96,
        192,
        0,
    )
    assert t[("", 1)]["saved_bytes"] == 288


def test_amp_bfloat16_step():
    fp32 = profile(mlp(), (8,), batch_size=3, backward=True, **COUNT)
    bf16 = profile(mlp(), (8,), batch_size=3, backward=True, amp=torch.bfloat16, **COUNT)
    # the same contractions in bfloat16
    assert bf16.totals["backward_macs"] == fp32.totals["backward_macs"] == 768
    # autocast casts layer 0's input to bfloat16 before saving it: 3x8x2 = 48 B, not 96
    assert rows(bf16)[("0", 1)]["saved_bytes"] == 48


# -- agreement with torch.utils.flop_counter ----------------------------------------------------
def _flop_counter_backward(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    out = model(x)
    out = out if isinstance(out, torch.Tensor) else out[0]
    loss = out.float().sum()
    with FlopCounterMode(display=False) as fc:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}


def _grouped_overcount(model: nn.Module, report) -> int:
    """FlopCounterMode counts a grouped convolution's weight gradient as if it were not
    grouped: as conv(x^T, grad_out^T) over all C_in x C_out channel pairs, g x the true
    C_in/g x C_out. For every grouped conv whose weight needs grad that adds 2 x (g - 1) x its
    forward MACs (= its weight gradient's MACs)."""
    extra = 0
    df = report.to_dataframe()
    for row in df.itertuples(index=False):
        if row.module.endswith(")"):
            continue
        m = model.get_submodule(row.module)
        if isinstance(m, nn.modules.conv._ConvNd) and m.groups > 1 and m.weight.requires_grad:
            extra += 2 * (m.groups - 1) * int(row.macs)
    return extra


def _assert_agrees(model: nn.Module, x: torch.Tensor) -> None:
    report = profile(model, inputs=x, backward=True, **COUNT)
    ours = report.by_operator("backward")
    theirs = _flop_counter_backward(model, x)
    assert theirs, "FlopCounterMode counted nothing"
    for packet, flops in theirs.items():  # "aten.mm" -> every overload of mm
        mine = ours[ours["op"].str.startswith(packet + ".")]
        expected = 2 * int(mine["macs"].sum())  # FlopCounterMode: 2 flops per MAC
        if packet == "aten.convolution_backward":
            expected += _grouped_overcount(model, report)
        assert expected == flops, packet


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("vit_tiny_patch16_224", {"img_size": 64}),
        ("convnext_atto", {}),
        ("efficientnet_b0", {}),
    ],
)
def test_flop_counter_agreement_timm(name, kwargs):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs)
    _assert_agrees(model, torch.randn(2, 3, 64, 64))


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_flop_counter_agreement_transformers(arch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "gpt2":
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64)
        )
    else:
        model = transformers.BertModel(
            transformers.BertConfig(
                num_hidden_layers=2,
                hidden_size=64,
                num_attention_heads=4,
                intermediate_size=128,
                vocab_size=500,
            )
        )
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(0))

    class Logits(nn.Module):  # first output only, as the FlopCounterMode side takes
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)[0]

    _assert_agrees(Logits(model), ids)


@pytest.mark.parametrize("training, per_element", [(True, 13), (False, 6)])
def test_batch_norm_backward_train_and_eval(training, per_element):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1, bias=False), nn.BatchNorm2d(4))
    r = profile(model, (3, 2, 2), batch_size=2, backward=True, training=training, **COUNT)
    bn = rows(r)[("1", 1)]
    # 2x4x2x2 = 32 elements. Train (batch statistics), all gradients: x_hat 2 + input 7 +
    # g*weight 1 + weight 2 + bias 1 = 13 per element; eval (running statistics): x_hat 2 +
    # input 1 + weight 2 + bias 1 = 6
    assert bn["backward_flops"] == per_element * 32
    assert model[1].training is True  # the user's flags come back (the module was in train mode)


def test_an_optimizer_with_a_formula_that_cannot_step_on_the_cpu_still_counts(monkeypatch):
    # its per-tensor scalar states are read by stepping a tiny CPU copy of its class; a class
    # that cannot step there keeps its formula's states (it failed the whole profile)
    from modelprof.counting.formulas import optim

    class CudaOnly(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

        def step(self, closure=None):
            raise RuntimeError("this optimizer steps on CUDA only")

    # 2 FLOPs per element and 1 state tensor per parameter
    monkeypatch.setitem(optim.OPTIMIZER_FORMULAS, CudaOnly, lambda group: (2, 1))
    model = nn.Linear(4, 3)
    r = profile(model, (4,), backward=True, optimizer=CudaOnly, timing=False)
    cost = r.training_step.cost.optimizer
    # 4 x 3 + 3 = 15 elements with a gradient, float32: one state tensor of 15 x 4 = 60 bytes
    assert cost.elements == 15 and cost.flops == 30 and cost.state_bytes == 60


def test_labels_make_the_loss_the_models_own():
    # a transformers model given labels= computes its loss and returns it beside the logits;
    # the default loss summed both (a (loss) row of 32 x 100 logits' sums), where the user
    # trains on output.loss. With labels the loss is the output's own, named so; its cross
    # entropy runs inside the model, so its forward and backward are the model's rows
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 100, (2, 16))
    own = profile(model, {"input_ids": ids, "labels": ids}, backward=True, **COUNT)
    named = profile(
        model, {"input_ids": ids, "labels": ids}, backward=True, loss_fn=lambda o: o.loss, **COUNT
    )
    loss_row = rows(own)[("(loss)", 1)]
    assert (loss_row["type"], loss_row["flops"], loss_row["backward_flops"]) == (
        "output.loss",
        0,
        0,
    )
    assert own.totals["backward_macs"] == named.totals["backward_macs"] > 0
    assert own.totals["backward_flops"] == named.totals["backward_flops"]
    assert own.training_step.cost.loss_name == "output.loss"
    summed = profile(model, {"input_ids": ids}, backward=True, **COUNT)  # no labels: the sum
    assert rows(summed)[("(loss)", 1)]["type"] == "sum"

    # a forward given labels that returns no `loss` (its scalar loss itself, a tuple, logits):
    # the sum, as without labels (a review: these were refused for a while)
    class TakesLabels(nn.Module):
        def __init__(self, returns: str) -> None:
            super().__init__()
            self.fc, self.returns = nn.Linear(4, 2), returns

        def forward(self, x, labels=None):
            y = self.fc(x)
            loss = F.cross_entropy(y, labels)
            return {"scalar": loss, "tuple": (loss, y), "logits": y}[self.returns]

    given = {"x": torch.randn(3, 4), "labels": torch.tensor([0, 1, 1])}
    for returns in ("scalar", "tuple", "logits"):
        r = profile(TakesLabels(returns), given, backward=True, **COUNT)
        assert rows(r)[("(loss)", 1)]["type"] == "sum"
        assert r.training_step.cost.loss_name == "sum"

    class GivesLabelsBack(nn.Module):  # nothing to differentiate: said as without labels
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x, labels=None):
            return labels

    with pytest.raises(ModelProfError, match="labels= was given, but the output is"):
        profile(GivesLabelsBack(), given, backward=True, **COUNT)


class _MySGD(torch.optim.SGD):
    """A subclass, counted op by op (its step may differ from SGD's)."""


@pytest.mark.parametrize("foreach", [False, True])
def test_a_subclass_of_sgd_reads_as_sgds_formula(foreach):
    # p.add_(g, alpha=-lr) is a multiply and an add an element: 2 x 212 = 424 flops, SGD's
    # formula; with weight decay g.add(p, alpha=wd) 2 more: 4 x 212 = 848 (it read 1 an add:
    # 212 and 424, half the class's own count)
    def plain(params):
        return _MySGD(params, lr=0.1, foreach=foreach)

    def decayed(params):
        return _MySGD(params, lr=0.1, weight_decay=0.01, foreach=foreach)

    for factory, per_element in ((plain, 2), (decayed, 4)):
        r = profile(mlp(), (8,), batch_size=3, backward=True, optimizer=factory, **COUNT)
        opt = r.training_step.cost.optimizer
        assert opt.counted_by == "ops" and opt.flops == per_element * 212
    base = profile(mlp(), (8,), batch_size=3, backward=True, optimizer="sgd", **COUNT)
    assert base.training_step.cost.optimizer.flops == 2 * 212  # the formula's


@pytest.mark.parametrize("foreach", [False, True])
def test_sgd_momentum_formula_equals_its_counted_ops(foreach):
    # SGD's formula against the same step counted op by op (a subclass): torch runs
    # b.mul_(mu).add_(g, alpha=1 - dampening), so the add multiplies only where dampening != 0
    cases = (
        (dict(momentum=0.9), 2 + 1 + 1),  # update 2, b *= mu 1, b += g 1: 4
        (dict(momentum=0.9, dampening=0.1), 2 + 1 + 2),  # b += 0.9*g 2: 5
        (dict(momentum=0.9, nesterov=True), 2 + 1 + 1 + 2),  # g += mu*b 2: 6
        (dict(momentum=0.9, nesterov=True, weight_decay=0.01), 2 + 2 + 2 + 2),  # g += wd*p: 8
        (dict(momentum=0.9, dampening=0.1, weight_decay=0.01), 2 + 2 + 3),  # 7 (no nesterov)
        (dict(maximize=True, momentum=0.9), 1 + 2 + 1 + 1),  # g = -g 1: 5
    )
    for options, per_element in cases:
        counted = []
        for cls in (torch.optim.SGD, _MySGD):  # the formula, then the ops

            def factory(params, cls=cls):
                return cls(params, lr=0.1, foreach=foreach, **options)

            r = profile(mlp(), (8,), batch_size=3, backward=True, optimizer=factory, **COUNT)
            counted.append(r.training_step.cost.optimizer.flops)
        # per_element x the mlp's 212 parameters (4 with dampening 0 was 5 by the formula)
        assert counted == [per_element * 212] * 2, options


def test_the_summary_and_caption_say_autocast_and_channels_last():
    # the counts are of the autocast bfloat16 run in channels_last: the header said float32
    # alone, as for a plain fp32 run
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    r = profile(conv, (3, 8, 8), amp=torch.bfloat16, channels_last=True, **COUNT)
    said = "float32 under bfloat16 autocast, channels_last"
    assert said in r.summary().splitlines()[0] and said in r.to_markdown().splitlines()[0]
    plain = profile(conv, (3, 8, 8), **COUNT)
    assert "(float32, cpu, batch 1)" in plain.summary().splitlines()[0]
    # channels_last converts 4-D tensors: a 2-D input runs as it was, said as it was
    flat = profile(nn.Linear(4, 4), (4,), channels_last=True, **COUNT)
    assert "(float32, cpu, batch 1)" in flat.summary().splitlines()[0]


class _WritesSaved(nn.Module):
    """Writes sigmoid's output, which autograd saved for sigmoid's backward, in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x)
        y.add_(1)
        return y


class _RaisesInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("no gradient here")


class _Custom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RaisesInBackward.apply(x)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_step_whose_saved_tensor_was_written_in_place_is_refused_naming_the_module(
    device,
) -> None:
    # a plain loss.backward() raises here (sigmoid's saved output is at version 1, saved at 0);
    # the counted step's saved-tensor hooks skip autograd's own check, so they make it
    model = nn.Sequential(nn.Linear(4, 4), _WritesSaved(), nn.Linear(4, 2))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        model(torch.ones(1, 4)).sum().backward()
    model.zero_grad(set_to_none=True)
    with pytest.raises(ModelProfError) as info:
        profile(model, (4,), backward=True, timing=False, device=device)
    text = str(info.value)
    assert "failed in the backward of module '1' (_WritesSaved)" in text
    assert "modified by an inplace operation" in text and "version 1; expected version 0" in text


def test_a_backward_failing_in_a_custom_function_names_its_module() -> None:
    model = nn.Sequential(nn.Linear(4, 4), _Custom(), nn.Linear(4, 2))
    with pytest.raises(ModelProfError) as info:
        profile(model, (4,), backward=True, timing=False)
    assert "failed in the backward of module '1' (_Custom): ValueError: no gradient here" in str(
        info.value
    )


def test_a_dynamically_quantized_model_s_refused_step_names_its_packed_weights() -> None:
    float_model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notice that eager quantization moved to torchao
        model = torch.ao.quantization.quantize_dynamic(float_model, {nn.Linear}, torch.qint8)
    # no nn.Parameter is left; the packed weights and biases are 64 x 128 + 128 + 128 x 32 + 32
    # = 12,448 elements, as the table's params column counts them
    with pytest.raises(ModelProfError, match=r"its 12,448 weights are packed quantized weights"):
        profile(model, (64,), backward=True, timing=False)
