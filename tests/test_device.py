"""The device module on a CPU-only machine, GPU paths faked: device names normalised once, no copy
of a model already in place, out-of-memory errors found anywhere in the chain, the allocator-peak
tracker's nesting."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import FakeAllocator
from torch import nn

import modelprof.runtime.placement as placement_mod
from modelprof.errors import ModelProfError
from modelprof.runtime.device import (
    MemoryStats,
    PeakTracker,
    device_synchronize,
    is_oom,
    normalize_device,
    same_device,
)
from modelprof.runtime.inputs import parse_device
from modelprof.runtime.placement import moved_model


@pytest.fixture
def current_cuda(monkeypatch):
    """``torch.cuda.current_device()`` answers what the test sets, and CUDA claims to be
    there (nothing here runs on it)."""
    state = {"index": 1}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["index"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return state


def test_cuda_without_an_index_is_the_current_device(current_cuda):
    assert normalize_device("cuda") == torch.device("cuda", 1)
    assert normalize_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert normalize_device("cuda:0") == torch.device("cuda", 0)  # an index given is kept
    current_cuda["index"] = 0
    assert normalize_device("cuda") == torch.device("cuda", 0)
    # torch itself does not equate the two spellings; modelprof compares normalised devices
    assert torch.device("cuda") != torch.device("cuda:0")
    assert same_device("cuda", "cuda:0") and same_device(torch.device("cuda"), "cuda:0")
    assert not same_device("cuda", "cuda:1")
    assert parse_device("cuda") == torch.device("cuda", 0)


def test_cpu_and_meta_have_no_index_to_add():
    assert normalize_device("cpu") == torch.device("cpu")
    assert normalize_device("cpu").index is None
    assert normalize_device("meta") == torch.device("meta")
    assert same_device("cpu", torch.device("cpu"))


def test_a_backend_that_cannot_answer_leaves_the_name_as_given(monkeypatch):
    def no_driver() -> int:
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.cuda, "current_device", no_driver)
    assert normalize_device("cuda") == torch.device("cuda")


def test_a_model_already_on_the_device_is_not_copied(monkeypatch, current_cuda):
    # the model "lives" on cuda:0 (faked); asked for "cuda" while 0 is current, it is returned
    # itself: no deep copy (that doubled GPU memory, at every batch point of a throughput search)
    current_cuda["index"] = 0
    model = nn.Linear(3, 3)
    monkeypatch.setattr(
        placement_mod, "model_placement", lambda m: (torch.device("cuda", 0), torch.float32)
    )

    def no_copy(obj, memo=None):
        raise AssertionError("deepcopy of a model already in place")

    monkeypatch.setattr(copy, "deepcopy", no_copy)
    assert moved_model(model, torch.device("cuda"), None) is model
    assert moved_model(model, parse_device("cuda"), torch.float32) is model
    assert (
        moved_model(model, torch.device("cuda", 0), None, memory_format=torch.channels_last)
        is model
    )  # no 4-D weight to convert


def test_a_model_elsewhere_is_converted_as_a_copy():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Linear(4, 4))
    w = model[0].weight
    moved = moved_model(
        model, torch.device("cpu"), torch.float64, memory_format=torch.channels_last
    )
    assert moved is not model
    assert moved[0].weight.dtype == torch.float64 and moved[1].weight.dtype == torch.float64
    assert moved[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model[0].weight is w and w.dtype == torch.float32  # the user's is untouched
    assert not w.is_contiguous(memory_format=torch.channels_last)
    # already float32 on the CPU: itself
    assert moved_model(model, torch.device("cpu"), torch.float32) is model


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001
        return e


def test_oom_is_found_directly_and_through_cause_and_context():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert is_oom(oom)
    # raise ... from oom: __cause__
    wrapped = ModelProfError("forward of Net failed")
    wrapped.__cause__ = oom
    assert is_oom(wrapped)
    # an error raised while handling the OOM (a cleanup that failed): __context__ only
    try:
        try:
            raise oom
        except torch.OutOfMemoryError:
            raise ValueError("cleanup failed")
    except ValueError as e:
        assert e.__cause__ is None and e.__context__ is oom
        assert is_oom(e)
    # two levels down
    outer = ModelProfError("throughput point failed")
    outer.__cause__ = wrapped
    assert is_oom(outer)


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "CUDA error: out of memory",
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried "
        "to allocate 1099511627776 bytes",
        "HIP out of memory. Tried to allocate 20.00 MiB",
    ],
)
def test_allocation_failures_by_message_are_oom(message):
    assert is_oom(RuntimeError(message))
    wrapped = ModelProfError("timing failed")
    wrapped.__cause__ = RuntimeError(message)
    assert is_oom(wrapped)


def test_memory_error_is_oom_and_other_errors_are_not():
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied (1x3 and 4x4)"))
    assert not is_oom(ValueError("bad value"))
    assert not is_oom(None)
    e = RuntimeError("shape mismatch")
    e.__context__ = e  # a cycle in the chain ends the walk
    assert not is_oom(e)


def test_oom_type_of_a_torch_without_torch_out_of_memory_error(monkeypatch):
    # torch < 2.5 has only torch.cuda.OutOfMemoryError: its type alone must be recognised
    # (the message below says nothing about memory)
    class CudaOom(RuntimeError):
        pass

    monkeypatch.delattr(torch, "OutOfMemoryError")
    monkeypatch.setattr(torch.cuda, "OutOfMemoryError", CudaOom)
    assert is_oom(CudaOom("CUDA error 2"))
    assert not is_oom(RuntimeError("CUDA error 2"))


def test_synchronize_is_a_no_op_on_cpu_and_meta(monkeypatch):
    # a no-op: it asks no backend to synchronise (a CUDA call here would fail without a GPU)
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(a))
    assert device_synchronize(torch.device("cpu")) is None
    assert device_synchronize(torch.device("meta")) is None
    assert calls == []
    # the contrast, so the fake is known to be the one reached: cuda asks torch.cuda once
    device_synchronize(torch.device("cuda", 0))
    assert calls == [(torch.device("cuda", 0),)]


def test_peak_tracker_hands_child_peaks_to_parents():
    fake = FakeAllocator()
    t = PeakTracker(fake.stats())
    t.enter(0)
    fake.alloc(10)
    t.enter(1)  # resets the peak: call 0 keeps the 10 it saw
    fake.alloc(5)
    fake.free(5)
    assert t.exit() == 1  # call 1: 10 in use at its start + 5 = 15, handed up to call 0
    t.enter(2)  # a sibling: another reset
    assert t.exit() == 2  # nothing allocated: the 10 in use
    fake.free(10)
    assert t.exit() == 0
    assert t.peak == {0: 15, 1: 15, 2: 10}
    assert t.stack == []


def test_peak_tracker_keeps_a_parents_spike_between_and_after_children():
    fake = FakeAllocator(base=100)
    t = PeakTracker(fake.stats())
    t.enter(0)
    t.enter(1)
    fake.alloc(50)
    fake.free(50)
    t.exit()  # call 1: 100 + 50
    fake.alloc(1000)  # the parent's own spike, after its child's reset
    fake.free(1000)
    t.enter(2)  # entering a child folds the spike into the parent first
    fake.alloc(7)
    t.exit()  # call 2: 100 + 7
    t.exit()
    assert t.peak == {0: 1100, 1: 150, 2: 107}


def test_memory_stats_only_on_cuda():
    assert MemoryStats.for_device(torch.device("cpu")) is None
    assert MemoryStats.for_device(torch.device("meta")) is None
    stats = MemoryStats.for_device(torch.device("cuda", 0))  # built lazily, nothing called
    assert isinstance(stats, MemoryStats)
