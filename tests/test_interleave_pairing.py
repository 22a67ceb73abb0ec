"""A comparison's latency_x interval and its agreement check pair block medians the same way:
by block id (round), through ``stats.paired_block_medians``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modelprof.timing.agreement import judge_ratio
from modelprof.timing.interleave import _ratios, floor_notes, round_ratio, tied_ranks
from modelprof.timing.measurement import Measurement
from modelprof.timing.stats import paired_block_medians, ratio_of_medians

# One sample a block, so each block's median is its sample.
# baseline: rounds 0 1 2 3 -> 1 2 1 1 ms
# cand:     rounds 0 . 2 3 -> 2 . 2 2 ms (no block in round 1)
BASE_MS, BASE_IDS = [1.0, 2.0, 1.0, 1.0], [0, 1, 2, 3]
CAND_MS, CAND_IDS = [2.0, 2.0, 2.0], [0, 2, 3]


def _pair() -> tuple[Measurement, Measurement]:
    return Measurement(CAND_MS, blocks=CAND_IDS), Measurement(BASE_MS, blocks=BASE_IDS)


def test_paired_block_medians_pairs_by_round_not_position():
    # by id the common rounds are 0, 2, 3: cand 2 2 2 against baseline 1 1 1 (round 1,
    # baseline's 2 ms, is left out on both sides); by position it would be 2 2 2 against 1 2 1
    num, den = paired_block_medians(CAND_MS, CAND_IDS, BASE_MS, BASE_IDS)
    assert num.tolist() == [2.0, 2.0, 2.0] and den.tolist() == [1.0, 1.0, 1.0]
    # the pairs follow the ids, not each side's order: a baseline logged out of order
    num, den = paired_block_medians([2.0, 4.0], [0, 1], [3.0, 1.0, 2.0], [2, 0, 1])
    assert num.tolist() == [2.0, 4.0] and den.tolist() == [1.0, 2.0]
    # no round in common: nothing paired
    num, den = paired_block_medians([2.0], [5], BASE_MS, BASE_IDS)
    assert num.size == 0 and den.size == 0


def test_latency_x_interval_and_its_check_use_the_same_rounds():
    cand, base = _pair()
    # ratio = median(cand) / median(baseline) = 2 / 1 = 2. By round the log ratios are
    # ln 2, ln 2, ln 2: no spread, so Yuen's half-width is 0 and the interval is [2, 2]
    ratio, lo, hi = _ratios({"base": base, "cand": cand}, "base")["cand"]
    assert (ratio, lo, hi) == pytest.approx((2.0, 2.0, 2.0))
    # the same rounds in the check: centre exp(mean ln 2) = 2, interval [2, 2], 3 rounds, and
    # the ratio 2 lies inside it
    check = judge_ratio("latency_x", "cand", "base", cand, base)
    assert check.paired == pytest.approx(2.0)
    assert check.paired_ci == pytest.approx((2.0, 2.0))
    assert check.rounds == 3 and check.agree


def test_position_pairing_would_give_another_interval():
    # what pairing by position gave: log ratios ln 2, 0, ln 2 (cand's round 2 against the
    # baseline's round 1); mean 0.462, sd 0.400, se = sqrt(2 * 0.160 / (3 * 2)) = 0.231,
    # half = t(0.975, 2) 4.303 * 0.231 = 0.994, around e^0.462 = 1.587 (none trimmed of 3):
    # [1.587 e^-0.994, 1.587 e^0.994] = [0.587, 4.290]
    cand, base = _pair()
    shifted = ratio_of_medians(cand.samples_ms, base.samples_ms, np.array(CAND_MS),
                               np.array(BASE_MS[:3]), 0.95)  # fmt: skip
    assert shifted == pytest.approx((2.0, 0.587, 4.290), abs=1e-3)
    _, lo, hi = _ratios({"base": base, "cand": cand}, "base")["cand"]
    assert not math.isclose(lo, shifted[1]) and not math.isclose(hi, shifted[2])


def test_rounds_taken_by_both_from_round_zero_pair_alike_either_way():
    # what collect_interleaved yields: every candidate takes rounds 0..R-1 (a candidate at its
    # max_samples stops, it never skips a round and resumes), so by id is the first min(R)
    # blocks of each, which is what pairing by position took
    base = Measurement([1.0, 2.0, 1.5, 1.2], blocks=[0, 1, 2, 3])
    cand = Measurement([2.0, 3.0], blocks=[0, 1])
    num, den = paired_block_medians(cand.samples_ms, cand.blocks, base.samples_ms, base.blocks)
    assert num.tolist() == [2.0, 3.0] and den.tolist() == [1.0, 2.0]


def test_a_second_figure_ties_what_it_cannot_order_or_orders_the_other_way():
    # CPU work: a 10 ms, b 11 ms every round (ratio 1.1, interval [1.1, 1.1]): a then b. The
    # wall beside it (a loaded machine): where it agrees (b 25 against a 20 ms: 1.25) the
    # ranks stand; where it orders them the other way (b 15 against 20: 0.75, its interval
    # [0.75, 0.75] below 1) they tie, as where it cannot order them (b 20 against 20: 1.0)
    blocks = np.arange(8)

    def each(a_ms, b_ms):
        return {
            n: Measurement(np.full(8, ms), blocks=blocks) for n, ms in (("a", a_ms), ("b", b_ms))
        }

    cpu = each(10.0, 11.0)
    assert tied_ranks(cpu, each(20.0, 25.0)) == ({"a": 1, "b": 2}, None)
    for wall_b in (15.0, 20.0):
        ranks, note = tied_ranks(cpu, each(20.0, wall_b))
        assert ranks == {"a": 1, "b": 1} and note.endswith("orders them the other way): a, b")
    assert tied_ranks(cpu) == ({"a": 1, "b": 2}, None)  # the CPU work alone orders them
    # three: CPU work a 10, b 11, c 12 ms; wall a 20, b 30, c 19 ms. c against b's group
    # (30 -> 19) and against a's (20 -> 19: 0.95, below 1) is ordered the other way by the
    # wall: the groups from a's on merge, all three tie; with c's wall at 40 (above both)
    # the three keep their places
    blocks3 = {n: Measurement(np.full(8, ms), blocks=blocks) for n, ms in zip("abc", (10, 11, 12))}

    def wall(c_ms):
        return {
            n: Measurement(np.full(8, ms), blocks=blocks) for n, ms in zip("abc", (20, 30, c_ms))
        }

    ranks, note = tied_ranks(blocks3, wall(19.0))
    assert ranks == {"a": 1, "b": 1, "c": 1} and note.endswith(": a, b, c")
    assert tied_ranks(blocks3, wall(40.0)) == ({"a": 1, "b": 2, "c": 3}, None)


def test_ranks_tie_where_the_rounds_cannot_order_two():
    # per round r: a's median base[r]; b the same within +-2 % (alternating: its log ratios
    # to a are +-0.02, mean 0, so the paired interval holds 1); c 1.5x a (ratio 1.5, interval
    # far from 1); d 1.5x a within +-2 % (holds 1 against c). Ranks 1, 1, 3, 3: a newcomer's
    # three copies of one model were ranked 3, 2, 1 by noise
    base = np.array([10.0, 11.0, 9.5, 10.5, 10.2, 9.8, 10.9, 9.9])
    wobble = np.exp(0.02 * np.array([1, -1] * 4))
    blocks = np.arange(8)
    figures = {
        "a": Measurement(base, blocks=blocks),
        "b": Measurement(base * wobble, blocks=blocks),
        "c": Measurement(1.5 * base, blocks=blocks),
        "d": Measurement(1.5 * base / wobble, blocks=blocks),
    }
    ranks, note = tied_ranks(figures)
    assert ranks == {"a": 1, "b": 1, "c": 3, "d": 3}
    head, _, groups = note.partition(": ")
    assert head == "tied in rank (the interval of their paired ratio holds 1)"
    assert {frozenset(g.split(", ")) for g in groups.split("; ")} == {
        frozenset("ab"),
        frozenset("cd"),
    }
    # three identical copies: one tie; distinct ones keep their order and no note
    same, tie_note = tied_ranks({k: figures["a"] for k in "xyz"})
    assert same == {"x": 1, "y": 1, "z": 1} and "x, y, z" in tie_note
    apart, none = tied_ranks({"a": figures["a"], "c": figures["c"]})
    assert apart == {"a": 1, "c": 2} and none is None


def test_a_figure_of_one_round_cannot_order_two():
    # one round each: the paired ratio 11/10 = 1.1 has no interval (one pair of block
    # medians), so the rounds cannot say b comes after a: they tie; so where the CPU work of
    # eight rounds orders them (interval [1.1, 1.1]) but the wall beside it took one round
    def each(n, a_ms, b_ms):
        return {
            k: Measurement(np.full(n, ms), blocks=np.arange(n))
            for k, ms in (("a", a_ms), ("b", b_ms))
        }

    one = each(1, 10.0, 11.0)
    assert math.isnan(round_ratio(one["b"], one["a"], 0.95)[1])
    assert tied_ranks(one)[0] == {"a": 1, "b": 1}
    ranks, note = tied_ranks(each(8, 10.0, 11.0), one)
    assert ranks == {"a": 1, "b": 1} and note.endswith(": a, b")
    assert tied_ranks(each(8, 10.0, 11.0), each(8, 20.0, 25.0))[0] == {"a": 1, "b": 2}


def test_a_floor_note_says_how_far_the_budget_was_extended():
    # 0.04 s past the budget to reach min_samples=10: said in significant digits (it read
    # "extended by 0.0 s"); none extended: no note
    m = Measurement([1.0] * 10, blocks=list(range(10)), extended_s=0.04, floor_cap_s=60.0,
                    min_samples=10)  # fmt: skip
    assert floor_notes([m]) == [
        "the time budget was extended by 0.04 s (at most 60 s) so that every candidate has "
        "min_samples=10 runs"
    ]
    assert floor_notes([Measurement([1.0] * 10, blocks=list(range(10)))]) == []
