"""Another thread forwarding the same model while it is profiled: its module calls are not
recorded, they are counted (and a timed profile says the model ran elsewhere, in a warning and
a timing note), and other models in other threads pass through untouched. Real threads,
synchronised so the overlap is certain."""
from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch import nn

from modelprof import ModelProfWarning, profile
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
    """In the profiling thread, hands over to the server in the middle of the forward: the
    other thread's forwards of the same model happen while this thread's pass is hooked."""

    def __init__(self) -> None:
        super().__init__()
        self.server: Server | None = None
        self.owner = threading.get_ident()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.server is not None and threading.get_ident() == self.owner:
            self.server.serve_now()
        return x


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 8), Gate(), nn.ReLU()).eval()


def test_static_table_ignores_another_threads_forwards_of_the_same_model() -> None:
    model = _model()
    server = Server(model)
    model[1].server = server
    try:
        for _ in range(3):
            report = profile(model, (8,), timing=False)
            # root, Linear, Gate, ReLU: 4 rows; Linear(8, 8) at batch 1: 64 MACs
            assert [r.module for r in report.rows] == ["", "0", "1", "2"]
            assert report.totals["macs"] == 64
    finally:
        server.close()
    assert server.forwards == 3 * FORWARDS  # the overlap really happened, every time


def test_timed_profile_with_another_thread_forwarding_says_so() -> None:
    model = _model()
    server = Server(model)
    model[1].server = server
    try:
        with pytest.warns(ModelProfWarning, match="another thread called the model's modules"):
            report = profile(model, (8,), repeat=3, warmup=1, roofline=False)
    finally:
        server.close()
    assert [r.module for r in report.rows] == ["", "0", "1", "2"]
    layers = report.layer_timing
    assert layers is not None and len(layers.order) == 4
    assert server.forwards >= 3 * FORWARDS
    # every hooked pass (discovery, warm-up and timed instrumented passes: layers.warmup +
    # layers.n) hands over once; each of the FORWARDS other-thread forwards calls root, Linear,
    # Gate and ReLU: 5 * 4 = 20 foreign calls per hooked pass, none from the plain passes
    assert layers.foreign_calls == 4 * FORWARDS * (layers.warmup + layers.n)
    note = f"another thread called the model's modules {layers.foreign_calls} times"
    assert any(n.startswith(note) for n in report.timing_notes)
    assert note in report.summary()


def test_timed_profile_alone_reports_no_other_thread() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = profile(_model(), (8,), repeat=3, warmup=1, roofline=False)
    assert report.layer_timing is not None and report.layer_timing.foreign_calls == 0
    assert not any("another thread" in n for n in report.timing_notes)
    assert not any("another thread" in str(w.message) for w in caught)


def test_hook_session_counts_the_calls_other_threads_make() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    other = nn.Sequential(nn.Linear(8, 8))       # a different model in the other thread
    seen: list[nn.Module] = []
    server, bystander = Server(model), Server(other)
    try:
        with module_hooks(model, lambda m, a, k: seen.append(m), lambda m, o: None) as session:
            server.serve_now()
            bystander.serve_now()
        assert seen == []                        # the profiling thread itself ran nothing
        # each forward of the other thread calls root, Linear and ReLU: 5 * 3 = 15
        assert session.foreign_calls == FORWARDS * 3 and session.ran_elsewhere
        with count_foreign_calls(model) as quiet:
            model(torch.randn(1, 8))              # this thread's own calls are not foreign
        assert quiet.foreign_calls == 0 and not quiet.ran_elsewhere
    finally:
        server.close()
        bystander.close()
    assert bystander.forwards == FORWARDS        # the other model ran, unhindered
