"""Everything the user passes comes back exactly as it went in, and every pass sees it as it
went in: the inputs (a HuggingFace cache, a tensor the forward writes), the target, the loss
module, the model (also under ``backward=True`` and ``compare()``), the optimizer and the global
RNG; compared bit for bit."""

from __future__ import annotations

import threading
import warnings
from typing import Any

import pytest
import torch
from helpers import Clamps, WritesLate, picture
from torch import nn

from modelprof import ModelProfError, ModelProfWarning, compare, profile
from modelprof.runtime import compat

QUICK = dict(repeat=3, warmup=1, roofline=False, warn=False)  # a timed profile, kept short


# -- bit-for-bit pictures ---------------------------------------------------------------------


def rng_picture() -> bytes:
    return bytes(torch.get_rng_state().numpy().tobytes())


def assert_same(before: Any, after: Any, what: str) -> None:
    assert before == after, f"{what} changed"


# -- inputs -------------------------------------------------------------------------------------


def _tiny_lm(kind: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=64,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        return transformers.GPT2LMHeadModel(cfg).eval()
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


class SeenLengths(nn.Module):
    """The language model, noting the cache length every forward sees (in a list outside the
    model, which the state guard does not put back)."""

    def __init__(self, lm: nn.Module, seen: list[int]) -> None:
        super().__init__()
        self.lm = lm
        self.seen = seen

    def forward(self, input_ids: torch.Tensor, **cache_kw: Any) -> Any:
        (cache,) = cache_kw.values()  # under either name: cache= or past_key_values=
        self.seen.append(cache.get_seq_length())
        own = compat.cache_argument(self.lm.forward)  # the name this transformers uses
        return self.lm(input_ids=input_ids, use_cache=True, **{own: cache}).logits


@pytest.mark.parametrize("name", compat.CACHE_ARGUMENTS)
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_cache_passed_in_does_not_grow_and_a_second_call_counts_the_same(
    kind: str, name: str
) -> None:
    lm = _tiny_lm(kind)
    with torch.no_grad():
        cache = compat.output_cache(lm(torch.randint(0, 64, (1, 4)), use_cache=True))
    assert cache.get_seq_length() == 4
    inputs = {"input_ids": torch.randint(0, 64, (1, 1)), name: cache}
    before, rng = picture(inputs), rng_picture()
    seen: list[int] = []
    first = profile(SeenLengths(lm, seen), inputs=inputs, timing=False)
    assert cache.get_seq_length() == 4
    second = profile(SeenLengths(lm, seen), inputs=inputs, timing=False)
    assert first.totals["macs"] == second.totals["macs"]
    timed = profile(SeenLengths(lm, seen), inputs=inputs, **QUICK)
    assert timed.totals["macs"] == first.totals["macs"]
    assert_same(before, picture(inputs), "the inputs (cache included)")
    assert rng == rng_picture()
    # every pass, counted and timed (warm-up, clean, per layer), saw the 4 cached tokens
    assert len(seen) > 10 and set(seen) == {4}


class WritesInput(nn.Module):
    """Adds 1 to its input in place, noting the value it found first."""

    def __init__(self, seen: list[float]) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        # a function: copies of the model (a timed training step runs on one) note here too
        self.note = lambda v: seen.append(v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.note(float(x[0, 0]))
        x.add_(1.0)
        return self.lin(x)


@pytest.mark.parametrize("backward", [False, True])
def test_a_forward_writing_its_input_leaves_the_users_tensor_and_every_pass_sees_it(
    backward: bool,
) -> None:
    x = torch.zeros(2, 4)
    seen: list[float] = []
    model = WritesInput(seen)
    before, rng = picture(x), rng_picture()
    profile(model, inputs=x, backward=backward, **QUICK)
    assert_same(before, picture(x), "the input")
    assert rng == rng_picture()
    assert len(seen) > 10 and set(seen) == {0.0}  # every pass saw the zeros


def test_a_loss_writing_its_target_leaves_it_and_every_step_sees_it() -> None:
    target = torch.zeros(2, 4)
    seen: list[float] = []

    def loss_fn(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        seen.append(float(t[0, 0]))
        t.add_(1.0)
        return ((out - t) ** 2).mean()

    before = picture(target)
    profile(
        nn.Linear(4, 4),
        inputs=torch.randn(2, 4),
        backward=True,
        loss_fn=loss_fn,
        target=target,
        **QUICK,
    )
    assert_same(before, picture(target), "the target")
    assert len(seen) > 5 and set(seen) == {0.0}


def test_snapshot_puts_back_tensors_containers_and_attributes_and_knows_when_nothing_changed() -> (
    None
):
    class Holder:
        def __init__(self) -> None:
            self.t = torch.arange(3.0)
            self.items = [torch.ones(2)]

    from modelprof.runtime.snapshot import Snapshot

    h = Holder()
    obj = {"h": h, "xs": [torch.zeros(2)], "n": 3}
    before = picture(obj)
    snap = Snapshot(obj)
    assert snap.between_passes() is None  # nothing changed: nothing to run
    h.t = h.t + 1  # an attribute rebound (as a cache's layer.keys is)
    h.items.append(torch.ones(1))  # a list grown
    obj["xs"][0].add_(5)  # a tensor written in place
    obj["new"] = 1  # a key added
    obj["xs"][0].data = torch.ones(7)  # swapped storage and shape
    assert snap.changed()
    snap.reset()
    assert_same(before, picture(obj), "the object graph")
    assert not snap.changed()


def test_ordinary_inputs_run_nothing_between_passes() -> None:
    """The timed passes of a model that writes nothing of its inputs get no reset to run (the
    timing loop is the one it was); the snapshot's one-off cost is a copy of the inputs."""
    from modelprof.runtime.inputs import make_inputs
    from modelprof.runtime.snapshot import Snapshot
    from modelprof.timing.latency import TimedCall
    from modelprof.timing.options import TimingOptions

    model = nn.Linear(4, 4)
    mi = make_inputs(model, inputs=torch.randn(2, 4))
    snap = Snapshot(mi.args, mi.kwargs)
    model(*mi.args)
    mi.reset = snap.between_passes()
    assert mi.reset is None
    with TimedCall(model, model, mi, TimingOptions.parse(repeat=2, warmup=0)) as tc:
        assert tc.between is None and tc.fresh_call is tc.call


# -- the model under backward=True and compare() ------------------------------------------------


class Renorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e = nn.Embedding(10, 4, max_norm=0.5)  # renormalises the rows it looks up
        self.l = nn.Linear(4, 2)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.l(self.e(idx))


@pytest.mark.parametrize("timing", [False, True])
@pytest.mark.parametrize(
    "make,inputs",
    [(Clamps, torch.randn(2, 4)), (Renorms, torch.tensor([[1, 2, 3]]))],
    ids=["clamp", "embedding-max-norm"],
)
def test_backward_puts_back_the_forwards_in_place_writes(make, inputs, timing: bool) -> None:
    model = make()
    before, rng = picture(model), rng_picture()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profile(model, inputs=inputs, backward=True, timing=timing, **(QUICK if timing else {}))
    assert not [w for w in caught if "in place" in str(w.message)]  # restored: nothing to say
    assert_same(before, picture(model), "the model")
    assert rng == rng_picture()


class _WriteInBackward(torch.autograd.Function):
    """Identity whose backward scales a tensor in place (a write no forward watch sees)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.w = w
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        with torch.no_grad():
            ctx.w.mul_(2.0)
        return grad, None


class WritesInBackward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _WriteInBackward.apply(self.l(x), self.scale)


def test_an_unrestorable_write_is_named_with_the_pass_that_made_it() -> None:
    model = WritesInBackward()
    with pytest.warns(ModelProfWarning) as caught:
        profile(model, inputs=torch.randn(2, 4), backward=True, timing=False)
    messages = [str(w.message) for w in caught if "scale" in str(w.message)]
    assert messages and "during the counted backward" in messages[0]
    assert "timing" not in messages[0]


def test_a_write_only_the_timed_passes_make_is_named_with_them() -> None:
    with pytest.warns(ModelProfWarning, match="l.weight in place during the timed forward passes"):
        profile(WritesLate(), inputs=torch.randn(2, 4), **QUICK)


class Counts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.n = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n += 1
        return self.l(x)


@pytest.mark.parametrize("backward", [False, True])
def test_compare_puts_the_models_and_inputs_back(backward: bool) -> None:
    c, d = Counts(), WritesInput([])
    x = torch.zeros(2, 4)
    before, rng = picture((c, d, x)), rng_picture()
    compare({"c": c, "d": d}, inputs=x, backward=backward, **QUICK)
    assert c.n == 0
    assert_same(before, picture((c, d, x)), "the models and the inputs")
    assert rng == rng_picture()


# -- the loss side and the optimizer --------------------------------------------------------------


class LearnedLoss(nn.Module):
    """A loss with a parameter and a train-mode batch norm (its buffers move when it runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((self.norm(out) * self.w - target) ** 2).mean()


@pytest.mark.parametrize("timing", [False, True])
def test_the_loss_module_and_a_target_that_requires_grad_get_nothing(timing: bool) -> None:
    loss, model = LearnedLoss(), nn.Linear(4, 4)
    target, x = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    before, rng = picture((loss, target)), rng_picture()
    profile(
        model,
        inputs=x,
        backward=True,
        loss_fn=loss,
        target=target,
        timing=timing,
        **(QUICK if timing else {}),
    )
    assert loss.w.grad is None and target.grad is None
    assert_same(before, picture((loss, target)), "the loss module and the target")
    assert rng == rng_picture()


def test_an_optimizer_factory_that_ignores_its_params_is_refused_before_any_step() -> None:
    model = nn.Linear(4, 4)
    made: list[torch.optim.Optimizer] = []

    def factory(params: Any) -> torch.optim.Optimizer:
        made.append(torch.optim.SGD(model.parameters(), lr=10.0, momentum=0.9))
        return made[-1]

    before = picture(model)
    with pytest.raises(ModelProfError, match="not one of the parameters it was given"):
        profile(model, inputs=torch.randn(2, 4), backward=True, optimizer=factory, **QUICK)
    assert made and all(opt.state == {} for opt in made)  # never stepped
    assert_same(before, picture(model), "the model")


def test_a_users_optimizer_template_is_left_as_it_was() -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()  # a state to keep: exp_avg, exp_avg_sq, step
    before = picture((model, opt))
    profile(model, inputs=torch.randn(2, 4), backward=True, optimizer=opt, **QUICK)
    assert_same(before, picture((model, opt)), "the model and its optimizer")


# -- models that cannot be deep-copied, other threads, inference tensors -----------------------


class Locked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.lock = threading.Lock()  # copy.deepcopy refuses it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock:
            return self.l(x)


def _spectral() -> nn.Module:
    # old-style spectral norm: its weight is a computed non-leaf attribute deepcopy refuses
    return nn.Sequential(torch.nn.utils.spectral_norm(nn.Linear(4, 4)), nn.ReLU())


@pytest.mark.parametrize("make", [Locked, _spectral], ids=["lock", "spectral_norm"])
def test_timing_a_training_step_of_a_model_deepcopy_refuses(make) -> None:
    model, x = make(), torch.randn(2, 4)
    before, rng = picture(model), rng_picture()
    report = profile(model, inputs=x, backward=True, optimizer="sgd", **QUICK)
    assert report.backward_latency is not None
    assert_same(before, picture(model), "the model")
    assert rng == rng_picture()


class Handover(nn.Module):
    """In the profiling thread, lets another thread run the same model mid-forward."""

    def __init__(self, model_ref: list[nn.Module]) -> None:
        super().__init__()
        self.ref = model_ref
        self.owner = threading.get_ident()
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed and threading.get_ident() == self.owner:
            t = threading.Thread(target=lambda: self.ref[0](torch.randn(2, 4)))
            t.start()
            t.join(timeout=60)
        return x


@pytest.mark.parametrize(
    "kw",
    [dict(timing=False), dict(backward=True, timing=False), QUICK],
    ids=["counted", "step", "timed"],
)
def test_another_thread_using_the_model_while_profiled_is_refused(kw: dict) -> None:
    ref: list[nn.Module] = []
    model = nn.Sequential(nn.Linear(4, 4), Handover(ref))
    ref.append(model)
    model[1].armed = True
    before = picture(model)
    with pytest.raises(ModelProfError, match="another thread called the modules of Sequential"):
        profile(model, inputs=torch.randn(2, 4), **kw)
    assert_same(before, picture(model), "the model")


@pytest.mark.parametrize(
    "kw",
    [
        dict(timing=False),
        dict(training=True, timing=False),
        QUICK,
        dict(backward=True, optimizer="adam", **QUICK),
    ],
    ids=["counted", "train", "timed", "step"],
)
def test_a_model_of_inference_tensors(kw: dict) -> None:
    with torch.inference_mode():
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    assert model[0].weight.is_inference()
    before = picture(model)
    report = profile(model, inputs=torch.randn(3, 4), **kw)
    # 4*4 weights per sample of 3: 48 MACs
    assert report.totals["macs"] == 48
    assert_same(before, picture(model), "the model")
