"""The ``compat`` subset: what `.ci/compat` runs on the oldest and latest stacks (and the GPU
machine's). With tests/test_compat.py (every entry of modelprof/runtime/compat.py) these touch
every public entry point once: profile (counted, timed, training step, rendered), compare,
measure_latency / measure_throughput, profile_generation / compare_generation, the sharded
profile on a fake group, sweep, register_formula, token_inputs and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import MLP_NETS

COMPAT = frozenset(
    {
        "test_compare.py::test_closed_form_totals_and_ratios",
        "test_step_profile.py::test_compare_with_backward",
        "test_profile_timing.py::test_known_durations_read_back_per_layer_and_end_to_end",
        "test_timing_latency.py::test_fixed_recipe_calls_exactly_warmup_plus_repeat",
        "test_timing_latency.py::test_input_forms_tensor_tuple_dict_and_size",
        "test_timing_throughput.py::test_stops_when_samples_per_s_plateau",
        "test_step_counting.py::test_linear_stack_with_input_grad_is_twice_the_forward",
        "test_step_counting.py::test_sdpa_backward",
        "test_counting.py::test_torch_decomp_table_is_used_for_ops_without_formula",
        "test_formulas.py::test_conv2d",
        "test_formulas.py::test_sdpa_every_cpu_path",
        "test_formulas.py::test_multihead_attention_fast_and_slow_path_agree",
        "test_render_exporters.py::test_markdown_golden",
        "test_render_exporters.py::test_latex_golden",
        "test_report.py::test_csv_and_json_read_back_into_the_same_dataframe",
        "test_generation.py::test_llama_gqa_kv_bytes_and_decode_macs",
        "test_generation_timing.py::test_ttft_tpot_and_slope_read_back_against_a_plain_loop",
        "test_distributed_fake.py::test_ddp_gradient_all_reduce",
        "test_sweep.py::test_rows_equal_profile_totals",
        "test_cli.py::test_profile_prints_table_and_totals",
        "test_cli.py::test_profile_torchvision_model",
        "test_cli_tokens.py",
    }
)


@pytest.fixture
def nets(tmp_path: Path) -> Path:
    """A model file of ``helpers.MLP_NETS``: two MLPs of closed-form cost on a (10,) input
    (``narrow``, ``wide``) and ``broken`` (a Linear(11, 40)), which fails on it: the command
    line's tests' MODEL words (test_sweep.py has a file of its own by that name)."""
    f = tmp_path / "nets.py"
    f.write_text(MLP_NETS)
    return f


@pytest.fixture
def torch_threads():
    """``torch_threads(n)`` sets torch's intra-op threads for the test; the count before is
    restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def one_thread(torch_threads):
    """torch on one intra-op thread for the test: its CPU time is one thread's
    (``thread_time``), the CPU work that stands for the work under load."""
    torch_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = item.nodeid.split("/")[-1]
        if name in COMPAT or name.split("[")[0] in COMPAT or name.split("::")[0] in COMPAT:
            item.add_marker(pytest.mark.compat)
