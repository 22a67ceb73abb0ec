"""collect_env: plain JSON, the promised keys, never failing on unreadable items."""
from __future__ import annotations

import json
import subprocess

import torch

from modelprof import env as env_mod
from modelprof.env import collect_env, gpu_state


def test_env_is_json_and_has_the_promised_keys():
    e = collect_env("cpu", dtype=torch.bfloat16, batch_size=8, amp=torch.float16,
                    channels_last=True, compile=None)
    assert json.loads(json.dumps(e)) == e                  # round-trips: plain JSON only
    for key in ("device_name", "torch_version", "cuda_version", "cudnn_version",
                "python_version", "modelprof_version", "torch_num_threads", "cudnn_benchmark",
                "tf32_matmul", "tf32_cudnn"):
        assert key in e, key
    assert e["dtype"] == "torch.bfloat16" and e["batch_size"] == 8
    assert e["mode"] == {"amp": "torch.float16", "channels_last": True, "compile": None}
    assert e["torch_num_threads"] == torch.get_num_threads()
    assert e["torch_version"] == torch.__version__
    assert e["device_name"] == env_mod.cpu_name() != ""


def test_unreadable_gpu_state_is_empty_not_an_error(monkeypatch):
    def boom(*a, **k):
        raise subprocess.TimeoutExpired("nvidia-smi", 2)
    monkeypatch.setattr(subprocess, "run", boom)
    assert gpu_state(0) == {}


def test_nvidia_smi_answer_is_parsed(monkeypatch):
    class Done:
        stdout = "1980, 2619, 1980, 2619, 41, 123.45, P0, 550.54.15\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Done())
    state = gpu_state(0)
    assert state["sm_clock_mhz"] == 1980.0 and state["temperature_c"] == 41.0
    assert state["pstate"] == "P0" and state["source"] == "nvidia-smi"
    assert json.dumps(state)


def test_bad_device_does_not_raise():
    e = collect_env("not-a-device")
    assert e["device"] == "cpu"
