"""``measure_latency``, ``measure_latencies`` and ``measure_throughput`` give back what
``profile`` and ``compare`` give back: the module they call (parameters, buffers, attributes),
the inputs (and every call sees them as they went in) and the global RNG, also when the
callable raises or is interrupted; compared bit for bit."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers import Clamps, WritesLate, picture
from torch import nn

from modelprof import (
    ModelProfError,
    ModelProfWarning,
    measure_latencies,
    measure_latency,
    measure_throughput,
)
from modelprof.timing.measurement import Measurement

QUICK = dict(warmup=2, repeat=3, warn=False)  # 2 untimed calls, then 3 timed ones
POINT = dict(max_batch=2, warmup=1, repeat=2)  # batch 1 and 2, 3 calls each


def rng_picture() -> bytes:
    return bytes(torch.get_rng_state().numpy().tobytes())


def no_in_place_warning(caught: list) -> bool:
    return not [w for w in caught if "in place" in str(w.message)]


class Writes(nn.Module):
    """Adds 1 to its input and to a buffer in place and counts its calls in an attribute,
    noting the input's first value (in a list outside the model); ``fail_at``: the call that
    raises ``error`` (after its writes)."""

    def __init__(self, seen: list[float], fail_at: int = 0, error: Any = None) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.n = 0
        self.note = lambda v: seen.append(v)
        self.fail_at, self.error = fail_at, error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.note(float(x.reshape(-1)[0]))
        x.add_(1.0)
        self.calls += 1
        self.n += 1
        if self.n == self.fail_at:
            raise self.error
        return self.l(x) + torch.rand_like(x)  # draws from the global RNG


@pytest.mark.parametrize(
    "make,inputs",
    [
        (Clamps, torch.randn(2, 4)),
        (lambda: nn.Embedding(10, 4, max_norm=0.5), torch.tensor([[1, 2, 3]])),
    ],
    ids=["clamp", "embedding-max-norm"],
)
@pytest.mark.parametrize("warmup", [2, 0])  # (0: one untimed call all the same, watched)
def test_measure_latency_puts_back_a_module_that_writes_its_weights(
    make, inputs, warmup: int
) -> None:
    model = make()
    before, given, rng = picture(model), picture(inputs), rng_picture()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measure_latency(model, inputs, warmup=warmup, repeat=3, warn=False)
    assert no_in_place_warning(caught)  # copied before the first write: nothing to say
    assert picture(model) == before and picture(inputs) == given
    assert rng_picture() == rng


@pytest.mark.parametrize("warmup", [2, 0])
def test_every_call_sees_the_inputs_as_they_went_in_and_all_comes_back(warmup: int) -> None:
    seen: list[float] = []
    model, x = Writes(seen), torch.zeros(2, 4)
    before, given, rng = picture(model), picture(x), rng_picture()
    m = measure_latency(model, x, warmup=warmup, repeat=3, warn=False)
    # the watched first call is the first warm-up call; warmup=0 makes it one more (said in
    # `warmup`): 2 + 3 or 1 + 3 calls, each seeing the zeros (a call's writes put back)
    assert m.warmup == max(warmup, 1) and seen == [0.0] * (m.warmup + 3)
    assert picture(x) == given and picture(model) == before  # the buffer and `n` too
    assert rng_picture() == rng


@pytest.mark.parametrize("warmup", [2, 0])
def test_a_plain_callable_gets_its_inputs_and_the_rng_back(warmup: int) -> None:
    seen: list[float] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(float(x[0, 0]))
        return x.add_(1.0) + torch.rand_like(x)

    x = torch.zeros(2, 4)
    given, rng = picture(x), rng_picture()
    measure_latency(fn, x, warmup=warmup, repeat=3, warn=False)
    # warmup + 3 calls, none more (nothing to watch), each on the zeros
    assert seen == [0.0] * (warmup + 3)
    assert picture(x) == given and rng_picture() == rng


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
@pytest.mark.parametrize("fail_at", [1, 4])  # in the first (watched) call, in a timed one
def test_all_comes_back_when_the_forward_raises_or_is_interrupted(error, fail_at: int) -> None:
    model, x = Writes([], fail_at=fail_at, error=error), torch.zeros(2, 4)
    before, given, rng = picture(model), picture(x), rng_picture()
    with pytest.raises(ModelProfError if isinstance(error, Exception) else KeyboardInterrupt):
        measure_latency(model, x, **QUICK)
    assert picture(x) == given and picture(model) == before
    assert rng_picture() == rng


def test_a_write_only_later_calls_make_is_named_with_them() -> None:
    model = WritesLate(scale=2.0)  # its first call writes nothing: no copy of the weight kept
    with pytest.warns(ModelProfWarning) as caught:
        measure_latency(model, torch.randn(2, 4), **QUICK)
    text = [str(w.message) for w in caught if "in place" in str(w.message)]
    assert text and "l.weight in place during the later calls" in text[0]
    assert "the first-write watch of the first call" in text[0]


def test_a_model_writing_nothing_runs_nothing_between_its_calls() -> None:
    """The timing loop of the plain case is the one it was: nothing runs between the calls,
    which a pipelined run (calls back to back) needs; one that writes its input is refused."""
    measure_latency(nn.Linear(4, 4), torch.randn(2, 4), latency_mode="pipelined", **QUICK)
    with pytest.raises(ModelProfError, match="the inputs it writes"):
        measure_latency(Writes([]), torch.zeros(2, 4), latency_mode="pipelined", **QUICK)
    # warmup=0 alike: a first untimed call finds the write (it ran, on drifting inputs); a
    # plain callable (a lambda, no module to watch) too
    cold = dict(QUICK, warmup=0)
    with pytest.raises(ModelProfError, match="the inputs it writes"):
        measure_latency(Writes([]), torch.zeros(2, 4), latency_mode="pipelined", **cold)
    with pytest.raises(ModelProfError, match="the inputs it writes"):
        measure_latency(lambda t: t.add_(1), torch.zeros(2), latency_mode="pipelined", **cold)
    m = measure_latency(nn.ReLU(), torch.zeros(2), latency_mode="pipelined", **cold)
    assert m.warmup == 1  # the first untimed call, which a writing callable is refused after


def test_a_compiled_run_watches_an_eager_first_call() -> None:
    seen: list[float] = []
    model, x = Writes(seen), torch.zeros(2, 4)
    before, given = picture(model), picture(x)
    compiled = dict(compile=True, compile_kwargs={"backend": "eager"})
    measure_latency(model, x, **compiled, **QUICK)
    # one eager first call, the compiling call, 2 warm-up calls, 3 timed ones: all on the zeros
    assert seen == [0.0] * 7
    assert picture(x) == given and picture(model) == before


@pytest.mark.parametrize("warmup", [0, 2])
@pytest.mark.parametrize("how", ["compiled_module", "compile_option"])
def test_warmup_counts_every_call_a_compiled_run_made_before_its_samples(how, warmup) -> None:
    # torch.compile with the "eager" backend: dynamo captures the graph, no C compiler needed
    seen: list[float] = []
    model, x = Writes(seen), torch.zeros(2, 4)
    eager = {"backend": "eager"}
    cold = dict(warmup=warmup, repeat=3, warn=False)
    if how == "compiled_module":  # the eager first call; with warmup=0 the first sample compiles
        m = measure_latency(torch.compile(model, **eager), x, **cold)
        untimed = 1 + warmup
    else:  # the eager first call and the compiling one, then the warm-up
        m = measure_latency(model, x, compile=True, compile_kwargs=eager, **cold)
        untimed = 2 + warmup
    assert len(seen) == untimed + m.n and m.warmup == untimed


def test_measure_latencies_gives_back_what_measure_latency_gives_back() -> None:
    """Interleaved candidates through the same machinery: a BatchNorm in train mode (its
    running statistics and call count), a function writing its input in place and one drawing
    from the global RNG; every call, of any candidate, sees the input as it went in."""
    seen: list[float] = []

    def writes(x: torch.Tensor) -> torch.Tensor:
        seen.append(float(x[0, 0]))
        return x.add_(1.0)

    def draws(x: torch.Tensor) -> torch.Tensor:  # warmed up after `writes`
        seen.append(float(x[0, 0]))
        return x * torch.rand_like(x)

    bn, x = nn.BatchNorm1d(4), torch.arange(32.0).reshape(8, 4)
    before, given, rng = picture(bn), picture(x), rng_picture()
    measure_latencies({"bn": bn, "writes": writes, "draws": draws}, x, training=True, **QUICK)
    assert picture(bn) == before  # running_mean, running_var, num_batches_tracked
    assert picture(x) == given and rng_picture() == rng
    assert seen == [0.0] * 2 * (2 + 3)  # each: 2 warm-up calls and 3 timed ones, on the zeros


def test_measure_throughput_puts_back_the_model_and_the_rng() -> None:
    model = nn.Sequential(nn.Embedding(10, 4, max_norm=0.5), Writes([]))
    before, rng = picture(model), rng_picture()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measure_throughput(model, tokens=3, **POINT)
    assert no_in_place_warning(caught)
    assert picture(model) == before and rng_picture() == rng


def test_measure_throughput_gives_back_what_a_measure_of_ones_own_changes() -> None:
    def measure(model: nn.Module, batch: int, device: Any, opts: Any) -> Measurement:
        model.train()  # a flag and an attribute: the state guard puts them back
        model.batch = batch
        return Measurement(1.0 + torch.rand(3).numpy(), batch_size=batch)  # draws from the RNG

    model = nn.Linear(4, 4).eval()
    before, rng = picture(model), rng_picture()
    measure_throughput(model, (4,), measure=measure, **POINT)
    assert picture(model) == before and rng_picture() == rng


def test_the_copies_kept_are_counted_as_held_bytes() -> None:
    """What a throughput point's peak leaves out (on CUDA): the bytes of the copies kept."""
    from modelprof.timing.latency import given_back, held_bytes, resolve_call

    model, x = Clamps(), torch.zeros(2, 4)
    target, mi = resolve_call(model, x)
    with given_back(model, target, x, mi) as given:
        guard, _ = given
        assert held_bytes(given, torch.device("cpu")) == 2 * 4 * 4  # the input's copy
        with guard.watch_writes():
            model(x)  # clamps l.weight: copied just before
        # the input's copy and the weight's (4 x 4 float32); none on a CUDA device
        assert held_bytes(given, torch.device("cpu")) == 2 * 4 * 4 + 4 * 4 * 4
        assert held_bytes(given, torch.device("cuda")) == 0
