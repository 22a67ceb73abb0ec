"""Issue 38 item 5's class: an EmbeddingBag counts only the entries it combines. Entries equal
to ``padding_idx`` are skipped by torch (out of the bag, out of the mean's count), and with
``include_last_offset`` the indices past the last offset are in no bag; on the meta device the
index values are unknown, so every index counts and the report says it is an upper bound."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelprof import profile

# 3 bags of 4 (offsets 0, 4, 8), half of each bag padding (index 0): 6 real entries
IDX = torch.tensor([1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0, 0])
OFFSETS = torch.tensor([0, 4, 8])


def _report(bag, *inputs, device="cpu"):
    return profile(bag, inputs=inputs, timing=False, device=device)


@pytest.mark.parametrize("padding_idx", [0, -20])  # -20 of 20 rows is row 0
def test_padding_entries_are_not_combined(padding_idx):
    flops = {}
    for mode in ("sum", "mean", "max"):
        bag = nn.EmbeddingBag(20, 16, mode=mode, padding_idx=padding_idx)
        report = _report(bag, IDX, OFFSETS)
        flops[mode] = report.totals["flops"]
        assert report.notes == {}
    # 6 non-padding rows of width 16: 6 x 16 = 96 combined (an add for sum and mean, a
    # comparison for max); mean then divides each of the 3 x 16 = 48 outputs: 96 + 48 = 144
    # (the padded rows' 6 x 16 = 96 more were counted: 192, 240, 192)
    assert flops == {"sum": 96, "mean": 144, "max": 96}
    # torch agrees: the mean of bag 0 is over its 2 real rows, not 4
    bag = nn.EmbeddingBag(20, 16, mode="mean", padding_idx=padding_idx)
    out = bag(IDX, OFFSETS)
    assert torch.allclose(out[0], bag.weight[1:3].mean(0))
    # per_sample_weights: each of the 96 real elements multiplied first, 2 x 96 = 192 (was 384)
    weighted = nn.EmbeddingBag(20, 16, mode="sum", padding_idx=padding_idx)
    assert _report(weighted, IDX, OFFSETS, torch.rand(12)).totals["flops"] == 192


def test_two_dimensional_bags_with_padding():
    # [3, 4] indices are 3 bags of 4, the same 6 real entries: mean 6 x 16 + 3 x 16 = 144
    bag = nn.EmbeddingBag(20, 16, mode="mean", padding_idx=0)
    assert _report(bag, IDX.view(3, 4)).totals["flops"] == 144


def test_include_last_offset_leaves_the_tail_out():
    # offsets [0, 4, 8] with include_last_offset: 2 bags, [0, 4) and [4, 8); indices 8..11 are
    # in no bag: 8 x 16 = 128 combined (was 12 x 16 = 192); torch's output has 2 rows
    bag = nn.EmbeddingBag(20, 16, mode="sum", include_last_offset=True)
    idx = torch.arange(1, 13)
    assert bag(idx, OFFSETS).shape == (2, 16)
    assert _report(bag, idx, OFFSETS).totals["flops"] == 128


def test_on_meta_every_index_counts_and_the_report_says_so():
    bag = nn.EmbeddingBag(20, 16, mode="mean", padding_idx=0)
    report = _report(bag, IDX, OFFSETS, device="meta")
    # no index values: all 12 x 16 = 192 combined + 48 divisions = 240, an upper bound
    assert report.totals["flops"] == 240
    ((op, notes),) = report.notes.items()
    assert "embedding_bag" in op and list(notes.values()) == [1]
    assert "padding_idx" in next(iter(notes)) and "upper bound" in next(iter(notes))
    # without padding (nor include_last_offset) the count is exact on meta: no note
    plain = _report(nn.EmbeddingBag(20, 16, mode="mean"), IDX, OFFSETS, device="meta")
    assert (plain.totals["flops"], plain.notes) == (240, {})


def test_quantized_bag_include_last_offset():
    from modelprof.counting.formulas.registry import REGISTRY

    formula = REGISTRY.lookup(torch.ops.quantized.embedding_bag_byte_rowwise_offsets.default)
    packed, idx, out = torch.zeros(20, 24, dtype=torch.uint8), torch.arange(12), torch.empty(2, 16)
    # (weight, indices, offsets, scale_grad_by_freq, mode, pruned_weights, per_sample_weights,
    #  compressed_indices_mapping, include_last_offset): 2 bags of 4, 8 x 16 = 128 (was 192)
    args = (packed, idx, OFFSETS, False, 0, False, None, None, True)
    assert formula(args, {}, out).flops == 128
