"""measure_latency on CPU: known durations, exact counts, warm-up per shape, modes, errors."""

from __future__ import annotations

import json
import time
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from modelprof.errors import (
    DriftWarning,
    FewSamplesWarning,
    LoadedMachineWarning,
    ModelProfError,
    NoisyMeasurementWarning,
)
from modelprof.timing import Measurement, measure_latency
from modelprof.timing.calibration import spin, spin_model
from modelprof.timing.modes import CPU_FLUSH_BYTES, CacheFlusher, last_level_cache_bytes
from modelprof.timing.sampler import FLOOR_EXTEND_S

FAST = dict(warmup_s=0.05, budget_s=1.0)
# microsecond callables with a handful of samples are noisy by nature; one test checks the warning
pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


def test_callable_spinning_1ms_is_never_short_and_its_fastest_sample_exact():
    m = measure_latency(lambda: spin(1.0), **FAST)
    assert isinstance(m, Measurement)
    assert m.device == "cpu" and m.n >= 10
    # the clock brackets the whole spin: no sample reads short (other load only lengthens
    # one), and an un-preempted sample reads the spin to within a few microseconds
    assert (m.samples_ms >= 1.0 - 1e-6).all()
    assert m.min_ms == pytest.approx(1.0, rel=0.03)


def test_spin_model_end_to_end_reads_sum_of_layers():
    model = spin_model((0.5, 1.0, 2.0))
    m = measure_latency(model, torch.zeros(1, 4), **FAST)
    assert (m.samples_ms >= 3.5 - 1e-6).all()  # 0.5 + 1 + 2
    assert m.min_ms == pytest.approx(3.5, rel=0.03)


def test_fixed_recipe_calls_exactly_warmup_plus_repeat():
    calls = []
    m = measure_latency(lambda x: calls.append(x.shape), torch.zeros(2), warmup=7, repeat=11)
    assert len(calls) == 18  # 7 + 11
    assert (m.warmup, m.n, m.stop_reason) == (7, 11, "repeat")
    assert m.precision is None


def test_warmup_again_when_the_shape_changes():
    calls: dict[tuple, int] = {}

    def fn(x: torch.Tensor) -> None:
        calls[tuple(x.shape)] = calls.get(tuple(x.shape), 0) + 1

    a, b = torch.zeros(2, 3), torch.zeros(5, 3)
    opts = dict(warmup_s=0.0, repeat=2)
    # new shape: >= 3 warm-up calls; seen shape: a 1-call refresher
    assert measure_latency(fn, a, **opts).warmup == 3
    assert measure_latency(fn, a, **opts).warmup == 1
    assert measure_latency(fn, b, **opts).warmup == 3
    assert measure_latency(fn, b, **opts).warmup == 1
    assert calls == {(2, 3): (3 + 2) + (1 + 2), (5, 3): (3 + 2) + (1 + 2)}


def test_input_forms_tensor_tuple_dict_and_size():
    seen = []

    def fn(*args, **kwargs):
        seen.append(
            ([tuple(a.shape) for a in args], {k: tuple(v.shape) for k, v in kwargs.items()})
        )

    opts = dict(warmup=0, repeat=1)
    measure_latency(fn, torch.zeros(3), **opts)
    measure_latency(fn, (torch.zeros(1), torch.zeros(2)), **opts)
    measure_latency(fn, {"x": torch.zeros(4)}, **opts)
    m = measure_latency(fn, input_size=(3, 8), batch_size=5, **opts)
    assert seen == [([(3,)], {}), ([(1,), (2,)], {}), ([], {"x": (4,)}), ([(5, 3, 8)], {})]
    assert m.batch_size == 5 and m.device == "cpu"
    # fps = batch / median (s)
    assert m.fps == pytest.approx(5 / (m.median_ms / 1e3))


def test_callable_without_inputs_is_called_with_nothing():
    got = []
    measure_latency(lambda *a, **k: got.append((a, k)), warmup=1, repeat=2)
    assert got == [((), {})] * 3


def test_module_runs_in_eval_no_grad_and_flags_are_restored():
    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)
            self.seen: list[tuple[bool, bool]] = []

        def forward(self, x):
            self.seen.append((self.training, torch.is_grad_enabled()))
            return self.inner(x)

    model = Probe().train()
    model.inner.eval()  # a mixed state must survive
    measure_latency(model, torch.zeros(1, 2), warmup=1, repeat=2)
    assert set(model.seen) == {(False, False)}
    assert model.training is True and model.inner.training is False
    model.seen.clear()
    measure_latency(model, torch.zeros(1, 2), warmup=1, repeat=2, training=True, no_grad=False)
    assert set(model.seen) == {(True, True)}
    model.seen.clear()
    # the old spelling still works, and says which to use instead
    with pytest.warns(
        DeprecationWarning, match=r"eval_mode=False\) is deprecated: pass training=True"
    ):
        measure_latency(
            model, torch.zeros(1, 2), warmup=1, repeat=2, eval_mode=False, no_grad=False
        )
    assert set(model.seen) == {(True, True)}


def test_training_true_runs_every_module_in_train_mode_as_the_counted_pass_does():
    # one run mode for every pass: train mode is every module's, as profile()'s counted
    # forward sets it; each module's own flag comes back afterwards
    class Seen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[bool] = []

        def forward(self, x):
            self.seen.append(self.training)
            return x

    model = nn.Sequential(nn.Linear(2, 2), Seen()).eval()
    measure_latency(model, torch.zeros(1, 2), warmup=1, repeat=2, training=True)
    assert model[1].seen == [True] * 3  # 1 warm-up call + 2 samples
    assert not any(m.training for m in model.modules())


def test_training_flag_restored_when_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("kaboom")

    model = nn.Sequential(nn.Linear(2, 2), Boom()).train()
    # the message names the innermost running module (its index in the Sequential and its type)
    with pytest.raises(
        ModelProfError, match=r"end-to-end timing in module .1. \(Boom\).*RuntimeError: kaboom"
    ) as info:
        measure_latency(model, torch.zeros(1, 2), warmup=1, repeat=1)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert all(mod.training for mod in model.modules())


def test_amp_autocasts_the_call():
    dtypes = []
    lin = nn.Linear(4, 4)

    def fn(x):
        y = lin(x)
        dtypes.append(y.dtype)
        return y

    measure_latency(fn, torch.zeros(2, 4), warmup=1, repeat=1, amp=torch.bfloat16)
    assert dtypes == [torch.bfloat16] * 2
    assert lin.weight.dtype == torch.float32


def test_channels_last_converts_a_copy_and_the_inputs():
    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.layouts: list[bool] = []

        def forward(self, x):
            self.layouts.append(x.is_contiguous(memory_format=torch.channels_last))
            return self.conv(x)

    model = Conv()
    weight = model.conv.weight
    measure_latency(model, input_size=(3, 8, 8), warmup=1, repeat=1, channels_last=True)
    assert model.layouts == []  # the copy ran, not the user's model
    assert model.conv.weight is weight
    assert not weight.is_contiguous(memory_format=torch.channels_last)
    layouts = []
    measure_latency(
        lambda x: layouts.append(x.is_contiguous(memory_format=torch.channels_last)),
        input_size=(3, 8, 8),
        warmup=0,
        repeat=2,
        channels_last=True,
    )
    assert layouts == [True, True]


def test_cold_cache_flush_is_outside_the_timed_span():
    flusher = CacheFlusher(torch.device("cpu"))
    llc = last_level_cache_bytes() or 0
    assert flusher.nbytes >= max(2 * llc, CPU_FLUSH_BYTES)
    # the flush itself, timed here: writing >= 64 MiB at <= 100 GB/s takes >= 0.67 ms
    flush_ms = min(_timed_ms(flusher) for _ in range(5))
    assert flush_ms > 0.3
    # were the flush inside the timed span, no sample of a 0.5 ms spin could read below
    # 0.5 + flush_ms; outside it, the fastest sample is the spin and what re-fetching the
    # evicted interpreter state costs (~20 us here), far below half a flush
    m = measure_latency(lambda: spin(0.5), cold_cache=True, warmup=2, repeat=20)
    assert (m.samples_ms >= 0.5 - 1e-6).all()
    assert m.min_ms < 0.5 + flush_ms / 2
    assert m.env["mode"]["cold_cache"] is True


def _timed_ms(fn) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e6


def test_compile_reports_compile_time_apart():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    m = measure_latency(
        model,
        torch.zeros(2, 8),
        compile=True,
        compile_kwargs={"backend": "eager"},
        warmup=2,
        repeat=5,
    )
    assert m.compile_ms is not None and m.compile_ms > 0
    assert m.n == 5 and m.env["mode"]["compile"] == "default"
    assert isinstance(model, nn.Sequential)  # the user's model is not replaced


def test_result_carries_env_and_exports_json():
    m = measure_latency(lambda: None, warmup=1, repeat=3, label="noop")
    d = json.loads(json.dumps(m.to_dict()))
    assert d["label"] == "noop" and d["n"] == 3
    assert d["env"]["torch_version"] == torch.__version__
    assert d["env"]["mode"]["transfer"] is False
    assert "noop" in repr(m)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(repeat=-5), "repeat=-5"),
        (dict(precision=2.0), "precision=2.0"),
        (dict(precision=0.0), "precision=0.0"),
        (dict(warmup=-1), "warmup=-1"),
        (dict(transfer=True), "transfer=True needs a CUDA device"),
        (dict(cuda_graph=True), "cuda_graph=True needs a CUDA device"),
        (dict(amp=torch.float32), "amp=torch.float32"),
        (dict(compile="fastest"), "compile='fastest'"),
        (dict(clock="wall"), "clock='wall'"),
        (dict(device="nonsense"), "device='nonsense'"),
    ],
)
def test_bad_options_raise_modelprof_error_naming_the_value(kwargs, needle):
    calls = []
    with pytest.raises(ModelProfError, match=needle.replace("(", r"\(")):
        measure_latency(lambda x: calls.append(1), torch.zeros(1), **kwargs)
    assert calls == []  # rejected before any call


def test_not_callable_is_rejected():
    with pytest.raises(ModelProfError, match="int"):
        measure_latency(3)


def test_a_model_given_no_inputs_says_so_where_it_wants_one():
    from modelprof import measure_latencies

    # a newcomer's measure_latency(model) raised the model's own "forward() missing 1
    # required positional argument" with no word that no inputs were given
    model = nn.Linear(4, 4)
    for measure in (measure_latency, lambda m: measure_latencies({"a": m})):
        with pytest.raises(ModelProfError, match="(?s)missing 1 required.*no inputs were given"):
            measure(model)
    # a module whose pre-hook supplies its argument, and a closure over its data, run as given
    fed = nn.Linear(4, 4)
    fed.register_forward_pre_hook(lambda module, args: (torch.zeros(4),))
    assert measure_latency(fed, warmup=0, repeat=3).n == 3
    assert measure_latency(lambda: None, warmup=0, repeat=3).n == 3

    # a forward of no arguments whose own code misses one is the user's bug, not hinted
    def scaled(x):
        return 2 * x

    class _Buggy(nn.Module):
        def forward(self):
            return scaled()

    with pytest.raises(ModelProfError, match="missing 1 required") as err:
        measure_latency(_Buggy(), warmup=0, repeat=2)
    assert "no inputs were given" not in str(err.value)
    # what is not callable is refused as such first
    with pytest.raises(ModelProfError, match="fn_or_model=int is not callable"):
        measure_latency(3)


def test_a_shape_given_as_inputs_is_named_input_size_once_it_fails():
    # measure_latency's second argument is inputs (profile's is input_size): a newcomer's
    # measure_latency(model, (32,)) raised Linear's "must be Tensor, not int" alone
    model = nn.Linear(32, 4)
    with pytest.raises(ModelProfError, match=r"(?s)not int.*pass input_size=\(32,\)"):
        measure_latency(model, (32,), warmup=0, repeat=2)
    # a function that takes ints runs on them as given, and its own TypeError is not hinted
    assert measure_latency(lambda n: torch.zeros(n), (32,), warmup=0, repeat=3).n == 3
    with pytest.raises(ModelProfError, match="unsupported operand") as err:
        measure_latency(lambda n: torch.zeros(n) + None, (32,), warmup=0, repeat=2)
    assert "input_size=" not in str(err.value)


def test_noisy_run_warns_once():
    # samples of 0.3 or 1.0 ms at random: IQR/median far above the noise threshold, on any
    # machine. One warning, of the first reason in warn_if_noisy's order: on a quiet machine
    # the noise itself; where the run also read the machine as loaded (other work beside the
    # suite), the load, which names the cause and is a NoisyMeasurementWarning too
    rng = np.random.default_rng(0)
    durations = iter(rng.choice([0.3, 1.0], size=10_000))

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        m = measure_latency(lambda: spin(next(durations)), warmup=0, repeat=40)
    assert m.noisy and m.n == 40
    expected = (
        FewSamplesWarning
        if m.undersampled
        else DriftWarning
        if m.stable is False
        else LoadedMachineWarning
        if m.loaded
        else NoisyMeasurementWarning
    )
    got = [w for w in rec if issubclass(w.category, NoisyMeasurementWarning)]
    assert [w.category for w in got] == [expected]
    if expected is NoisyMeasurementWarning:
        assert "noisy timing" in str(got[0].message) and "IQR/median" in str(got[0].message)
    assert m.warn_if_noisy() is False  # once


def test_model_inputs_are_used_as_given():
    from modelprof.runtime.inputs import make_inputs

    seen = []
    model = nn.Linear(3, 2)
    mi = make_inputs(model, inputs={"input": torch.zeros(4, 3)})

    def fn(**kwargs):
        seen.append({k: tuple(v.shape) for k, v in kwargs.items()})

    m = measure_latency(fn, mi, warmup=0, repeat=1)
    assert seen == [{"input": (4, 3)}] and m.batch_size == 4
    with pytest.raises(ModelProfError, match="not both"):
        measure_latency(fn, mi, input_size=(3,))


def test_a_budget_that_runs_out_below_min_samples_is_extended_to_the_floor_and_says_so():
    # a 20 ms call with a 0.05 s budget: the budget stops after 1 or 2 samples (checked against
    # the next call's expected end); the floor then takes one run per block up to
    # min_samples=10 (8-9 x ~20 ms, far inside the 30 s cap), and the text states it
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        m = measure_latency(lambda: spin(20.0), warmup=1, budget_s=0.05)
    assert m.stop_reason == "budget" and m.n == 10 and m.min_samples == 10
    assert not m.undersampled and m.short_reason is None and m.has_interval
    assert 0 < m.extended_s < FLOOR_EXTEND_S and m.n_blocks >= 9
    assert "past the budget for min_samples=10" in repr(m)
    assert not [w for w in rec if issubclass(w.category, FewSamplesWarning)]


def test_a_floor_its_cap_cannot_reach_warns_once_naming_n_and_the_cap(monkeypatch):
    # a cap of 0.03 s leaves room for at most one more 20 ms run: n stays below 10; the
    # Measurement quotes no median and one warning names n and the cap
    import modelprof.timing.sampler as sampler

    monkeypatch.setattr(sampler, "FLOOR_EXTEND_S", 0.03)
    with pytest.warns(FewSamplesWarning) as rec:
        m = measure_latency(lambda: spin(20.0), warmup=1, budget_s=0.05)
    assert m.stop_reason == "budget" and m.n < 10
    assert m.undersampled and m.min_samples == 10 and m.floor_cap_s == 0.03
    few = [w for w in rec if issubclass(w.category, FewSamplesWarning)]
    assert len(few) == 1
    assert f"n={m.n} sample" in str(few[0].message) and "at most 0.03 s" in str(few[0].message)
    assert "no median to quote" in repr(m)


def test_repeat_below_min_samples_is_asked_for_and_does_not_warn():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        m = measure_latency(lambda: spin(0.2), warmup=1, repeat=3)
    assert (m.n, m.stop_reason, m.undersampled, m.min_samples) == (3, "repeat", False, None)
    assert not [w for w in rec if issubclass(w.category, FewSamplesWarning)]


def test_contradicting_batch_size_is_an_error_naming_both():
    calls = []
    with pytest.raises(ModelProfError, match="batch_size=8 contradicts .* batch is 4"):
        measure_latency(lambda x: calls.append(1), torch.zeros(4, 3), batch_size=8)
    assert calls == []


def test_fps_uses_the_batch_that_ran():
    m = measure_latency(lambda x: spin(0.2), torch.zeros(4, 3), warmup=1, repeat=5)
    assert m.batch_size == 4  # from the tensor, not a default of 1
    assert m.fps == pytest.approx(4 / (m.median_ms / 1e3))


def test_model_inputs_with_a_contradicting_batch_size_are_refused():
    from modelprof.runtime.inputs import make_inputs

    mi = make_inputs(nn.Linear(3, 2), (3,), batch_size=4)
    calls = []
    with pytest.raises(ModelProfError, match="batch_size=8.*4"):
        measure_latency(lambda x: calls.append(1), mi, batch_size=8)
    assert calls == []
    assert measure_latency(lambda x: None, mi, batch_size=4, warmup=0, repeat=1).batch_size == 4


class _SlowFirst(nn.Module):
    """Spins ``first_ms`` on its first call (a one-off set-up), 1 ms on every later one; keeps
    when each call began."""

    def __init__(self, first_ms: float) -> None:
        super().__init__()
        self.first_ms, self.began = first_ms, []

    def forward(self, x):
        self.began.append(time.perf_counter())
        spin(self.first_ms if len(self.began) == 1 else 1.0)
        return x


def test_a_slow_first_call_leaves_the_model_its_warm_up():
    # the first call spins 600 ms, past warmup_s=0.5 alone: counted in the time rule it ended
    # the warm-up after 3 calls, 2 of them plain. The rule runs >= 0.5 s after it: the plain
    # calls span 0.5 s at least, so more than 3 calls whatever the load (a 1 ms spin each)
    m = _SlowFirst(600.0)
    got = measure_latency(m, torch.zeros(1), warmup_s=0.5, repeat=1)
    warm = m.began[: got.warmup + 1]  # the warm-up's calls, then the first sample's
    assert got.warmup > 3 and warm[-1] - warm[1] >= 0.5
