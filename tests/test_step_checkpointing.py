"""A training step with reentrant activation checkpointing
(``torch.utils.checkpoint(..., use_reentrant=True)``), whose function runs again inside the
backward, after the forward: its gradients go to the step's aliases (the optimizer counts every
parameter with one, the user's ``.grad`` untouched) and its backward is charged to the calls it
reran; the recomputation itself to the call whose checkpoint node ran it (docs/utilization.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from modelprof import profile, token_inputs

COUNT = dict(timing=False, roofline=False)


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a, self.act, self.b = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


class _Net(nn.Module):
    """8 -> 16, two residual blocks 16 -> 64 -> 16 (each checkpointed unless ``ckpt`` is None),
    16 -> 4."""

    def __init__(self, ckpt: bool | None) -> None:
        super().__init__()
        self.inp, self.out, self.ckpt = nn.Linear(8, 16), nn.Linear(16, 4), ckpt
        self.blocks = nn.ModuleList([_Block(16) for _ in range(2)])

    def forward(self, x):
        x = self.inp(x)
        for blk in self.blocks:
            x = x + (blk(x) if self.ckpt is None else checkpoint(blk, x, use_reentrant=self.ckpt))
        return self.out(x)


def _net(ckpt: bool | None) -> nn.Module:
    torch.manual_seed(0)
    return _Net(ckpt)


def _state(model: nn.Module) -> dict[str, torch.Tensor | None]:
    out: dict[str, torch.Tensor | None] = {}
    for n, p in model.named_parameters():
        out[n] = p.detach().clone()
        out[n + ".grad"] = None if p.grad is None else p.grad.clone()
    out.update((n, b.clone()) for n, b in model.named_buffers())
    return out


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (x is None and y is None)
        or (x is not None and y is not None and torch.equal(x, y) and x.dtype == y.dtype)
        for x, y in ((a[k], b[k]) for k in a)
    )


def _backward(report) -> dict[str, int]:
    df = report.to_dataframe()
    return dict(zip(df["module"], df["backward_macs"]))


def test_reentrant_checkpoint_backward_rows_optimizer_and_the_users_grad():
    model = _net(True)
    model.inp.weight.grad = torch.full_like(model.inp.weight, 0.5)  # one the user had
    before = _state(model)
    seen: list[bool] = []

    def sgd(params):  # called after the counted backward: the user's .grad as it was then
        seen.append(all(p.grad is None for p in model.blocks.parameters()))
        return torch.optim.SGD(params, lr=0.1)

    r = profile(model, (8,), batch_size=4, backward=True, optimizer=sgd, **COUNT)
    assert seen == [True] and _same(before, _state(model))  # bit for bit, .grad included
    got, plain = (
        _backward(r),
        _backward(profile(_net(None), (8,), batch_size=4, backward=True, **COUNT)),
    )
    # each block's backward is charged to the calls it reran, as without checkpointing: at
    # batch 4, a (16 -> 64) and b (64 -> 16) each 4 x 16 x 64 = 4,096 MACs forward, twice
    # that backward (weight and input gradients): 8,192 each, 16,384 a block
    for name in ("blocks.0", "blocks.0.a", "blocks.0.b", "blocks.1", "blocks.1.a", "blocks.1.b"):
        assert got[name] == plain[name] == (16_384 if name.count(".") == 1 else 8_192)
    # the recomputation (both blocks' forwards again, 2 x 8,192 MACs) to the root's own row,
    # where the checkpoint nodes were made; the loss (a plain sum) has no MACs
    assert got["(self)"] - plain["(self)"] == 16_384 and got["(loss)"] == plain["(loss)"] == 0
    assert got[""] == plain[""] + 16_384 == 33_792 + 16_384  # plain: 2 x 16,384 + 512 + 512
    # SGD: 2 FLOPs per element of every parameter, all of which get a gradient:
    # inp 8 x 16 + 16 = 144, a block 16 x 64 + 64 + 64 x 16 + 16 = 2,128 (two), out 16 x 4 + 4
    # = 68: 4,468 elements, 8,936 FLOPs (before the fix: 424, inp's and out's alone)
    optimizer = r.to_dataframe().set_index("module").loc["(optimizer)", "flops"]
    assert optimizer == 2 * sum(p.numel() for p in model.parameters()) == 2 * 4_468


def test_reentrant_against_non_reentrant():
    # both variants charge each block's own backward to its rows; they differ only in what
    # reran and where
    ours, other = (
        _backward(profile(_net(c), (8,), batch_size=4, backward=True, **COUNT))
        for c in (True, False)
    )
    for name in ("inp", "out", "(loss)"):
        assert ours[name] == other[name]  # 512, 512, 0: no checkpoint touches them
    # non-reentrant reruns only what the backward unpacks (a's addmm, 4,096 MACs a block,
    # charged inside the block); reentrant the whole block (8,192) to the root's (self)
    assert ours["blocks.0"] + 4_096 == other["blocks.0"] == 20_480
    assert ours["(self)"] == 2 * 8_192 and other["(self)"] == 0


def test_timed_step_times_the_blocks_backward_and_keeps_the_users_model():
    model = _net(True)
    before = _state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = profile(
            model,
            (8,),
            batch_size=4,
            backward=True,
            optimizer="sgd",
            budget_s=0.2,
            correct_overhead=False,  # the stretches as read: each holds at least its stamp
        )
    assert _same(before, _state(model))
    df = r.to_dataframe().set_index("module")
    assert df.loc["(optimizer)", "flops"] == 2 * 4_468
    # the nodes the rerun made have their stamps: each layer of a block has a backward time
    # of its own (before, none: the whole rerun and its backward were the root's (self))
    for name in ("blocks.0.a", "blocks.0.b", "blocks.1.a", "blocks.1.b"):
        assert df.loc[name, "backward_latency_ms"] > 0, name


def test_hf_gpt2_with_reentrant_gradient_checkpointing():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000)

    def run(reentrant: bool | None):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        with warnings.catch_warnings():
            # transformers: use_cache off with checkpointing; in 5.x a rename announced
            warnings.simplefilter("ignore")
            if reentrant is not None:
                kw = {"use_reentrant": reentrant}
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
            model.train()
            ids = token_inputs(model, 16, 2)
            before = _state(model)
            r = profile(
                model,
                inputs={**ids, "labels": ids["input_ids"]},
                backward=True,
                optimizer="sgd",
                **COUNT,
            )
        assert _same(before, _state(model))
        return model, r.to_dataframe().set_index("module")

    model, ours = run(True)
    _, plain = run(None)
    # every distinct parameter gets a gradient (wte tied to lm_head counts once): SGD's 2 FLOPs
    # per element; 64 x 1000 + 1024 x 64 + 2 x (12 x 64^2 + 13 x 64) + 2 x 64 = 229,632 elements
    params = sum(p.numel() for p in model.parameters())
    assert params == 229_632
    assert ours.loc["(optimizer)", "flops"] == 2 * params == 459_264
    # each layer's backward is charged to its own rows, as without checkpointing; the
    # recomputation (the whole layer's forward again) to the layer's (self) row: transformers
    # makes the checkpoint's node inside the layer's call
    diff = ours["backward_macs"] - plain["backward_macs"]
    layers = [f"transformer.h.{i}" for i in range(2)]
    again = {f"{n}.(self)": plain.loc[n, "macs"] for n in layers}  # 1,638,400 each
    assert sum(again.values()) == 2 * 1_638_400
    for name in diff.index:
        if name.startswith("transformer.h.") and name not in layers:
            assert diff[name] == again.get(name, 0), name
    assert ours.loc["(loss)", "backward_macs"] == plain.loc["(loss)", "backward_macs"]
    # the whole step: the plain one plus both layers' forward MACs once more
    assert diff[""] == diff["transformer"] == sum(again.values())


def test_meta_device_counts_the_same_step():
    # on meta the rerun ran on the user's CPU parameters before (a device mismatch, refused);
    # on the aliases it counts as on the CPU, row by row
    cpu, meta = (
        profile(_net(True), (8,), batch_size=4, backward=True, optimizer="sgd", **COUNT, **kw)
        .to_dataframe()
        .set_index("module")[["backward_macs", "flops"]]
        for kw in ({}, {"device": "meta"})
    )
    assert meta.equals(cpu) and meta.loc["blocks.0.a", "backward_macs"] == 8_192


class _Matmul(nn.Module):
    """x @ w, relu: a checkpointed function that calls no module (its rerun starts no call)."""

    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.w, self.ckpt = nn.Parameter(torch.randn(16, 16)), ckpt

    def f(self, t):
        return (t @ self.w).relu()

    def forward(self, x):
        return checkpoint(self.f, x, use_reentrant=True) if self.ckpt else self.f(x)


class _Checkpointed(nn.Module):
    """``a`` (a module-free function) and ``b`` (a Linear), each under its own checkpoint, after
    a Linear (a reentrant checkpoint's output needs an input that requires grad)."""

    def __init__(self, order: str, ckpt: bool = True) -> None:
        super().__init__()
        self.a, self.b, self.order = _Matmul(ckpt), nn.Linear(16, 16), order
        self.inp, self.ckpt = nn.Linear(16, 16), ckpt

    def forward(self, x):
        x = self.inp(x)
        for name in self.order:
            part = getattr(self, name)
            run = name == "b" and self.ckpt
            x = checkpoint(part, x, use_reentrant=True) if run else part(x)
        return x


@pytest.mark.parametrize("order", ["ab", "ba", "a"])
def test_a_rerun_that_calls_no_module_is_charged_to_its_own_checkpoint(order):
    # batch 4, 16 -> 16: a's backward is x.grad (4*16*16 = 1,024 MACs) and w.grad (1,024),
    # its rerun 1,024 more; b's backward the same 2,048, its rerun (1,024) on the root's (self),
    # whose forward made b's checkpoint. a's backward went to the last checkpoint that reran a
    # module (that (self)), or to (loss) where none had
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = profile(_Checkpointed(order), (16,), batch_size=4, backward=True, **COUNT)
    rows = dict(zip(r.to_dataframe()["module"], r.to_dataframe()["backward_macs"]))
    assert rows["a"] == 2 * 1024 + 1024 and rows.get("(loss)", 0) == 0
    if "b" in order:
        assert rows["b"] == 2 * 1024 and rows["(self)"] == 1024


class _Relu(nn.Module):
    """Linear(16, 64), a block [Linear(64, 128), ReLU, Linear(128, 64)], Linear(64, 4)."""

    def __init__(self, ckpt: bool | None) -> None:
        super().__init__()
        self.inp, self.out, self.ckpt = nn.Linear(16, 64), nn.Linear(64, 4), ckpt
        self.l1, self.l2 = nn.Linear(64, 128), nn.Linear(128, 64)

    def block(self, h):
        return self.l2(torch.relu(self.l1(h)))

    def forward(self, x):
        h = self.inp(x)
        if self.ckpt is None:
            return self.out(self.block(h))
        return self.out(checkpoint(self.block, h, use_reentrant=self.ckpt))


def test_a_non_reentrant_rerun_lands_on_the_row_whose_backward_ran_it():
    # docs/training.md: each layer's own backward as without checkpointing, the rerun forward
    # on the first layer whose backward unpacks a saved tensor (the block's last), counts and
    # time on one row. Batch 8: l1's forward 8*64*128 = 65,536 MACs, l2's 8*128*64 = 65,536;
    # each backward 2x (input and weight gradients) = 131,072. Non-reentrant checkpointing
    # reruns the block from l2's backward until l2's saved input exists: l1's forward (65,536)
    # on l2's row, 196,608; l1's row keeps its own 131,072
    torch.manual_seed(0)
    plain = _backward(profile(_Relu(None), (16,), batch_size=8, backward=True, **COUNT))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's use_reentrant default warning, old releases)
        ckpt = profile(_Relu(False), (16,), batch_size=8, backward=True, **COUNT)
    rows = _backward(ckpt)
    assert plain["l1"] == plain["l2"] == rows["l1"] == 131_072
    assert rows["l2"] == 131_072 + 65_536
    # the root row holds the whole backward: the plain one's and the rerun
    assert ckpt.totals["backward_macs"] == rows[""] == plain[""] + 65_536
