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
