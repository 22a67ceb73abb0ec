"""A MIG slice's name is refused wherever a whole GPU's datasheet figure would be taken, in
every form torch names one: the peaks, the memory, fit."""

from __future__ import annotations

import pytest
from torch import nn

from modelprof import ModelProfError
from modelprof.fit import fit
from modelprof.runtime.device import mig_slice
from modelprof.timing.memory_sizes import device_memory
from modelprof.timing.peaks import lookup_peaks

SLICES = [
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
    "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
    "NVIDIA A100-SXM4-40GB MIG 7g.40gb",
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
    "NVIDIA A30 MIG 1g.6gb",
    # a compute instance smaller than its GPU instance: its share of SMs first
    "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb",
]


@pytest.mark.parametrize("name", SLICES)
def test_no_datasheet_figure_is_taken_for_a_mig_slice(name):
    assert mig_slice(name) is not None
    # the whole A100 40GB is 312 TFLOP/s bf16 and 40 GiB: a slice has a share of both
    with pytest.raises(ModelProfError, match="is a MIG slice"):
        lookup_peaks(name, "bfloat16")
    with pytest.raises(ModelProfError, match="is a MIG slice"):
        device_memory(name)
    with pytest.raises(ModelProfError, match="is a MIG slice"):
        fit(nn.Linear(8, 8), device=name, training=False)
    # its own memory, given, is taken
    given = fit(nn.Linear(8, 8), device=name, memory_bytes=5 * 2**30, training=False)
    assert given.table.loc["memory", "inference"] == 5 * 2**30


def test_the_compute_instance_is_named_in_the_refusal():
    assert mig_slice("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb") == "1c.3g.20gb"
    assert mig_slice("NVIDIA A100-SXM4-40GB") is None
    assert lookup_peaks("NVIDIA A100-SXM4-40GB", "bfloat16").peak_flops == 312e12


def test_the_command_line_refuses_a_slice_in_one_line_naming_its_flag(capsys):
    from modelprof.cli import main

    spec = "LlamaConfig:hidden_size=64,intermediate_size=96,num_hidden_layers=1,num_attention_heads=4,vocab_size=101"
    target = "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert main(["fit", spec, "--target", target, "--context", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelprof: error:") and "--memory" in err[0]
    # with the slice's memory given (a 1g.5gb slice holds 4.75 GiB), it answers
    given = str(int(4.75 * 2**30))
    assert main(["fit", spec, "--target", target, "--context", "16", "--memory", given]) == 0
    assert "4.75 GiB" in capsys.readouterr().out
