"""collect_env: plain JSON, the promised keys, never failing on unreadable items."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from modelprof.runtime import env as env_mod
from modelprof.runtime.env import collect_env, gpu_state


def test_env_is_json_and_has_the_promised_keys():
    e = collect_env(
        "cpu",
        dtype=torch.bfloat16,
        batch_size=8,
        amp=torch.float16,
        channels_last=True,
        compile=None,
    )
    assert json.loads(json.dumps(e)) == e  # round-trips: plain JSON only
    for key in (
        "device_name",
        "torch_version",
        "cuda_version",
        "cudnn_version",
        "python_version",
        "modelprof_version",
        "torch_num_threads",
        "cudnn_benchmark",
        "tf32_matmul",
        "tf32_cudnn",
    ):
        assert key in e, key
    assert e["dtype"] == "torch.bfloat16" and e["batch_size"] == 8
    assert e["mode"] == {"amp": "torch.float16", "channels_last": True, "compile": None}
    assert e["torch_num_threads"] == torch.get_num_threads()
    assert e["torch_version"] == torch.__version__
    assert e["device_name"] == env_mod.cpu_name() != ""


def _without_pynvml(monkeypatch) -> None:
    """``import pynvml`` fails, as on a machine without it: on one with a GPU and pynvml (an
    H200's), gpu_state read the real GPU first and the nvidia-smi fakes below went unread."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


def test_unreadable_gpu_state_is_empty_not_an_error(monkeypatch):
    def boom(*a, **k):
        raise subprocess.TimeoutExpired("nvidia-smi", 2)

    _without_pynvml(monkeypatch)
    monkeypatch.setattr(subprocess, "run", boom)
    assert gpu_state(0) == {}


def test_nvidia_smi_answer_is_parsed(monkeypatch):
    class Done:
        stdout = "1980, 2619, 1980, 2619, 41, 123.45, P0, 550.54.15\n"

    _without_pynvml(monkeypatch)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Done())
    state = gpu_state(0)
    assert state["sm_clock_mhz"] == 1980.0 and state["temperature_c"] == 41.0
    assert state["pstate"] == "P0" and state["source"] == "nvidia-smi"
    assert json.dumps(state)


def test_bad_device_does_not_raise():
    e = collect_env("not-a-device")
    assert e["device"] == "cpu"


class _FakeNvml:
    """pynvml as far as gpu_state uses it: records which handle it was asked for."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def __init__(self) -> None:
        self.asked: list[tuple[str, object]] = []

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.asked.append(("uuid", uuid))
        return uuid

    def nvmlDeviceGetHandleByIndex(self, index):
        self.asked.append(("index", index))
        return index

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, h, kind):
        return 41

    def nvmlDeviceGetPowerUsage(self, h):
        return 120_000

    def nvmlDeviceGetPerformanceState(self, h):
        return 0


def test_gpu_state_finds_the_gpu_by_uuid_not_by_nvml_index(monkeypatch):
    # under CUDA_VISIBLE_DEVICES=3, torch's cuda:0 is NVML's GPU 3: only the UUID names it
    import sys

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    state = gpu_state(0, uuid="GPU-1234")
    assert fake.asked == [("uuid", "GPU-1234")]
    assert state["sm_clock_mhz"] == 1980 and state["power_w"] == 120.0  # 120,000 mW
    gpu_state(2)
    assert fake.asked[-1] == ("index", 2)


def test_gpu_uuid_reads_torchs_device_properties(monkeypatch):
    class Props:
        uuid = "5e5b6c3a-0000-1111-2222-333344445555"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    assert env_mod.gpu_uuid(1) == "GPU-5e5b6c3a-0000-1111-2222-333344445555"

    def missing(i):
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(torch.cuda, "get_device_properties", missing)
    assert env_mod.gpu_uuid(0) is None


def test_tf32_flags_read_the_newer_api_without_raising(monkeypatch):
    from modelprof.runtime.device import tf32_enabled

    class Legacy:
        @property
        def allow_tf32(self):  # what the legacy getter does once fp32_precision is set
            raise RuntimeError("mixed use of the legacy and new TF32 API")

    class NewMatmul(Legacy):
        fp32_precision = "tf32"

    class NewConv(Legacy):
        fp32_precision = "ieee"

    class Cudnn(Legacy):
        fp32_precision = "none"  # not set at the top level: the conv setting decides
        conv = NewConv()

    monkeypatch.setattr(torch.backends.cuda, "matmul", NewMatmul())
    monkeypatch.setattr(torch.backends, "cudnn", Cudnn())
    assert tf32_enabled("matmul") is True
    assert tf32_enabled("conv") is False


def test_tf32_flags_fall_back_to_the_legacy_flags(monkeypatch):
    from modelprof.runtime.device import tf32_enabled

    class OldMatmul:
        allow_tf32 = False

    class OldCudnn:  # a torch before fp32_precision existed
        allow_tf32 = True

    monkeypatch.setattr(torch.backends.cuda, "matmul", OldMatmul())
    monkeypatch.setattr(torch.backends, "cudnn", OldCudnn())
    # PyTorch's defaults: cuBLAS matmuls in full float32, cuDNN convolutions in TF32
    assert tf32_enabled("matmul") is False
    assert tf32_enabled("conv") is True
