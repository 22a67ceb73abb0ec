"""Another thread forwarding the same model while it is profiled: its module calls are not
recorded, they are counted, and the profile is refused with a ``ModelProfError`` that says so
(a model must not be used elsewhere while it is profiled: profiling sets its mode and puts its
state back over the other thread's changes); the other thread's forwards themselves run
unhindered, and other models in other threads pass through untouched. Real threads,
synchronised so the overlap is certain."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch import nn

from modelprof import ModelProfError, profile
from modelprof.runtime.hooks import count_foreign_calls, module_hooks

FORWARDS = 5  # forwards the other thread makes while the profiling thread waits inside its pass


class Server:
    """A second thread that runs ``model`` ``FORWARDS`` times each time it is asked to."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.go, self.done, self.stop = threading.Event(), threading.Event(), False
        self.forwards = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        x = torch.randn(2, 8)
        while True:
            self.go.wait()
            self.go.clear()
            if self.stop:
                return
            with torch.no_grad():
                for _ in range(FORWARDS):
                    self.model(x)
                    self.forwards += 1
            self.done.set()

    def serve_now(self) -> None:
        """Make the other thread run its forwards, and wait until it has."""
        self.done.clear()
        self.go.set()
        assert self.done.wait(timeout=60)

    def close(self) -> None:
        self.stop = True
        self.go.set()
        self.thread.join(timeout=60)


class Gate(nn.Module):
    """In the profiling thread, hands over to the server in the middle of the forward (from its
    ``skip + 1``-th call on): the other thread's forwards of the same model happen while this
    thread's pass runs."""

    def __init__(self, skip: int = 0) -> None:
        super().__init__()
        self.server: Server | None = None
        self.owner = threading.get_ident()
        self.calls = 0
        self.skip = skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.server is not None and threading.get_ident() == self.owner:
            self.calls += 1
            if self.calls > self.skip:
                self.server.serve_now()
        return x


def _model(skip: int = 0) -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 8), Gate(skip), nn.ReLU()).eval()


def test_profile_refuses_while_another_thread_forwards_the_same_model() -> None:
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    server = Server(model)
    model[1].server = server
    try:
        for _ in range(3):
            # the counted pass hands over once: FORWARDS forwards of root, Linear, Gate and
            # ReLU in the other thread, 5 * 4 = 20 calls
            with pytest.raises(
                ModelProfError,
                match=f"another thread called the modules of "
                f"Sequential {4 * FORWARDS} times while modelprof profiled it",
            ):
                profile(model, (8,), timing=False)
    finally:
        server.close()
    assert server.forwards == 3 * FORWARDS  # the overlap really happened, and was not stopped
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not model.training and model[1].calls == 0  # its mode and its counter put back


def test_a_timed_profile_refuses_when_the_other_thread_comes_during_the_timed_passes() -> None:
    # the counted pass runs alone (skip=1); the clean timed passes carry no hooks, so the first
    # per-layer pass (hooked) is where the other thread's calls are seen
    model = _model(skip=1)
    server = Server(model)
    model[1].server = server
    try:
        with pytest.raises(ModelProfError, match="another thread called the modules"):
            profile(model, (8,), repeat=3, warmup=1, roofline=False)
    finally:
        server.close()
    assert server.forwards >= FORWARDS


def test_timed_profile_alone_reports_no_other_thread() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = profile(_model(), (8,), repeat=3, warmup=1, roofline=False)
    assert report.layer_timing is not None
    assert not any("another thread" in n for n in report.timing_notes)
    assert not any("another thread" in str(w.message) for w in caught)


def test_hook_session_counts_the_calls_other_threads_make() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    other = nn.Sequential(nn.Linear(8, 8))  # a different model in the other thread
    seen: list[nn.Module] = []
    server, bystander = Server(model), Server(other)
    try:
        with module_hooks(
            model, lambda m, a, k: seen.append(m), lambda m, o: None, exclusive=False
        ) as session:
            server.serve_now()
            bystander.serve_now()
        assert seen == []  # the profiling thread itself ran nothing
        # each forward of the other thread calls root, Linear and ReLU: 5 * 3 = 15
        assert session.foreign_calls == FORWARDS * 3
        with count_foreign_calls(model) as quiet:
            model(torch.randn(1, 8))  # this thread's own calls are not foreign
        assert quiet.foreign_calls == 0
        # exclusive (the default): the calls are refused when the block ends, in this thread
        with pytest.raises(ModelProfError, match=f"{FORWARDS * 3} times"):
            with module_hooks(model, lambda m, a, k: None, lambda m, o: None):
                server.serve_now()
        with module_hooks(model, lambda m, a, k: None, lambda m, o: None):
            bystander.serve_now()  # another model: nothing to refuse
    finally:
        server.close()
        bystander.close()
    assert server.forwards == 2 * FORWARDS  # its forwards ran to the end both times
    assert bystander.forwards == 2 * FORWARDS  # the other model ran, unhindered


class _Pause(nn.Module):
    """In the first thread's first forward: starts the second thread, then waits until it waits
    to profile the same model, so the two profiles certainly meet."""

    def __init__(self, second: threading.Thread) -> None:
        super().__init__()
        self.__dict__["second"] = second  # a plain attribute, not a submodule
        self.__dict__["owner"] = threading.get_ident()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            threading.get_ident() == self.owner
            and not self.second.is_alive()
            and self.second.ident is None
        ):
            self.second.start()
            assert _waits_for(self.model, 1), "the second profile never waited"
        return x


def _waits_for(model: nn.Module, n: int) -> bool:
    """Wait (at most 60 s) until ``n`` threads wait to profile ``model``."""
    import time

    from modelprof.runtime.exclusive import waiting_for

    deadline = time.monotonic() + 60
    while waiting_for(model) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


@pytest.mark.parametrize("timing", [False, True])
def test_two_threads_profiling_one_model_are_served_one_after_the_other(timing) -> None:
    options = dict(repeat=3, warmup=1, roofline=False) if timing else {}
    results: dict[str, object] = {}

    def second() -> None:
        try:
            results["second"] = profile(model, (8,), timing=timing, **options)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            results["second"] = e

    pause = _Pause(threading.Thread(target=second))
    model = nn.Sequential(nn.Linear(8, 8), pause, nn.ReLU()).eval()
    pause.__dict__["model"] = model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first = profile(model, (8,), timing=timing, **options)
    pause.second.join(timeout=120)
    second_report = results["second"]
    assert not isinstance(second_report, BaseException), second_report
    # both counted the same: Linear(8, 8) at batch 1, 8*8 = 64 MACs
    assert first.totals["macs"] == second_report.totals["macs"] == 64
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_two_threads_waiting_for_each_others_models_are_refused_not_deadlocked() -> None:
    from modelprof.runtime.guard import preserved_state

    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    holds_b = threading.Event()
    outcome: dict[str, object] = {}

    def other() -> None:
        with preserved_state(b):
            holds_b.set()
            assert _waits_for(b, 1)  # this thread waits for b below
            try:
                with preserved_state(a):  # a is held by the test's thread: a cycle
                    outcome["other"] = "ran"
            except ModelProfError as e:
                outcome["other"] = e

    thread = threading.Thread(target=other)
    with preserved_state(a):
        thread.start()
        assert holds_b.wait(timeout=60)
        with preserved_state(b):  # waits until the other thread gives b back
            outcome["main"] = "ran"
    thread.join(timeout=60)
    assert outcome["main"] == "ran"
    assert isinstance(outcome["other"], ModelProfError)
    assert "waits for a model this thread is profiling" in str(outcome["other"])
