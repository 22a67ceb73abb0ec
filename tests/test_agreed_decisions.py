"""Under a process group every timing decision is agreed across ranks, so all ranks run
the same passes. Here the other rank is simulated: ``Peer`` is an ``Agreement`` whose all-reduce
(``least``) takes the minimum of this rank's values and what a scripted peer sends. The same
paths run on two real gloo ranks in tests/test_distributed_ranks.py."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from modelprof.runtime.agree import Agreement, agreeing
from modelprof.timing.sampler import (
    Sampled,
    StopRule,
    WarmupPolicy,
    collect,
    collect_interleaved,
    extend,
    warm_up,
)
from modelprof.timing.throughput import ThroughputPoint, search_batches


class Peer(Agreement):
    """One simulated peer rank: ``peer(call index, this rank's values)`` is what it sends."""

    def __init__(self, peer: Callable[[int, list[int]], list[int]]) -> None:
        super().__init__()
        self.peer = peer
        self.sent: list[list[int]] = []

    def least(self, values: list[int]) -> list[int]:
        other = self.peer(len(self.sent), list(values))
        self.sent.append(list(values))
        self.rounds += 1
        return [min(a, b) for a, b in zip(values, other)]


def constant(ms: float, taken: list[int]) -> Callable[[int], np.ndarray]:
    """A sampler that returns ``k`` samples of ``ms`` and notes each block's size."""

    def sample(k: int) -> np.ndarray:
        taken.append(k)
        return np.full(k, ms)

    return sample


def clock(step_s: float) -> Callable[[], float]:
    """A fake clock that advances ``step_s`` per reading: no test depends on the machine."""
    t = [0.0]

    def now() -> float:
        t[0] += step_s
        return t[0]

    return now


def test_blocks_are_the_smallest_any_rank_wants():
    # the peer wants one sample per block, is precise and never stops: constant samples make
    # this rank precise at min_samples = 10 in >= 2 blocks, so 10 blocks of 1 sample
    taken: list[int] = []
    rule = StopRule(precision=0.05, budget_s=1e6, min_samples=10, min_blocks=2)
    with agreeing(Peer(lambda i, v: [1, 1, 1])):
        got = collect(constant(1.0, taken), rule, est_ms=0.001, now=clock(1e-6))
    alone: list[int] = []
    collect(constant(1.0, alone), rule, est_ms=0.001, now=clock(1e-6))
    assert taken == [1] * 10 and got.n == 10 and got.stop_reason == "precision"
    assert max(alone) > 1  # on its own this rank takes bigger blocks: the peer decided


def test_a_peer_whose_budget_is_spent_stops_every_rank():
    # calls: 0 = the first block's size, 1.. = one per block; the peer says stop at call 3, so
    # this rank stops after its 3rd block, far from its own budget and precision
    taken: list[int] = []
    rule = StopRule(precision=0.001, budget_s=1e6, min_samples=10_000, min_blocks=2)
    peer = Peer(lambda i, v: [v[0], 1, 0 if i == 3 else 1] if len(v) == 3 else v)
    with agreeing(peer):
        got = collect(constant(1.0, taken), rule, est_ms=1.0, now=clock(1e-6))
    assert len(taken) == 3 and got.stop_reason == "budget"


def test_repeat_blocks_are_capped_so_an_interval_has_two_blocks():
    # repeat = 6, min_blocks = 2: blocks of at most ceil(6 / 2) = 3 even when the peer would
    # take 1000, so the 6 samples come in 2 blocks
    taken: list[int] = []
    rule = StopRule(repeat=6, min_blocks=2)
    with agreeing(Peer(lambda i, v: [1000] * len(v))):
        got = collect(constant(1.0, taken), rule, est_ms=1e-4, now=clock(1e-6))
    assert taken == [3, 3] and got.n == 6


def test_extension_stops_when_any_rank_would_not_run_the_next_pass():
    # this rank could extend to 100 passes within its cap; the peer says no at its 3rd call,
    # so exactly 2 more passes run (one per call that every rank agreed to)
    taken: list[int] = []
    base = Sampled(np.ones(4), np.arange(4), np.zeros(4), "budget", 0.1)
    with agreeing(Peer(lambda i, v: [0 if i == 2 else 1])):
        got, _ = extend(constant(1.0, taken), base, need=100, cap_s=1e6, now=clock(1e-6))
    assert taken == [1, 1] and got.n == 6


def test_warm_up_goes_on_until_every_rank_is_warm():
    # this rank is warm after its policy's 1 call; the peer wants 5 calls in all
    calls = []
    policy = WarmupPolicy(count=None, seconds=0.0)
    with agreeing(Peer(lambda i, v: [0 if i < 5 else 1])):
        n, _ = warm_up(lambda: calls.append(1), policy, already_warm=True, now=clock(1e-6))
    assert n == len(calls) == 5


def test_interleaved_rounds_share_order_blocks_and_stop():
    # the peer sends seed 0 (the smallest: every rank shuffles with default_rng(0)), wants one
    # sample per block, is never precise, and its budget is spent after round 4
    order: list[str] = []

    def sampler(name: str) -> Callable[[int], np.ndarray]:
        def sample(k: int) -> np.ndarray:
            order.extend([name] * k)
            return np.full(k, 1.0)

        return sample

    def peer(i: int, v: list[int]) -> list[int]:
        if i == 0:
            return [0]  # the seed
        if len(v) == 2 and (i - 1) % 2 == 0:
            return [1, 1]  # the blocks of round (i - 1) / 2
        return [0, 0 if i == 8 else 1]  # (precise, on time) after round (i - 2) / 2

    rule = StopRule(precision=0.05, budget_s=1e6, min_samples=2, min_blocks=2)
    with agreeing(Peer(peer)):
        got = collect_interleaved(
            [sampler("a"), sampler("b")],
            rule,
            [1e-3, 1e-3],
            np.random.default_rng(12345),
            now=clock(1e-6),
        )
    rng = np.random.default_rng(0)
    expected = [["a", "b"][j] for _ in range(4) for j in rng.permutation(2)]
    assert order == expected  # 4 rounds of one sample each, the agreed order
    assert [s.stop_reason for s in got] == ["budget", "budget"] and got[0].n == 4


def linear_points(calls: list[int]) -> Callable[[int], ThroughputPoint]:
    """A throughput point per batch ``b`` at 100 * b samples/s (every doubling helps), each
    batch noted in ``calls``."""

    def measure(b: int) -> ThroughputPoint:
        calls.append(b)
        return ThroughputPoint(batch_size=b, latency_ms=1.0, samples_per_s=100.0 * b)

    return measure


def test_throughput_search_agrees_on_out_of_memory_and_on_stopping():
    # this rank fits every batch; the peer runs out of memory at 4: doubling 1, 2, then 4 fails
    # there -> the binary search tries 3, which fits everywhere -> max fit 3, out of memory at 4
    calls: list[int] = []
    checked = [0]
    measure = linear_points(calls)

    def peer(i: int, v: list[int]) -> list[int]:
        if len(calls) > checked[0]:  # the first agreement after a batch: did it fit?
            checked[0] = len(calls)
            return [0] if calls[-1] == 4 else [1]  # any(failed) sends int(not failed)
        return [1]  # the stop check: the peer's batches still help

    with agreeing(Peer(peer)):
        points, reason, fit, oom = search_batches(measure, max_batch=64, gain=0.05, patience=2)
    assert calls == [1, 2, 4, 3]
    assert (reason, fit, oom) == ("oom", 3, 4) and [p.batch_size for p in points] == [1, 2, 3]
    # alone, every batch fits and helps (100 samples/s per sample of batch): doubling to 64
    calls.clear()
    _, reason, fit, _ = search_batches(measure, max_batch=64, gain=0.05, patience=2)
    assert calls == [1, 2, 4, 8, 16, 32, 64] and (reason, fit) == ("max_batch", 64)


def test_throughput_search_stops_when_the_peers_batches_stop_helping():
    # the peer's stop check says stop after batch 2 (its 2nd stop check): every rank stops
    calls: list[int] = []
    checks = [0]
    measure = linear_points(calls)

    def peer(i: int, v: list[int]) -> list[int]:
        if i % 2 == 0:
            return [1]  # fits on the peer
        checks[0] += 1
        return [0 if checks[0] == 2 else 1]

    with agreeing(Peer(peer)):
        _, reason, fit, _ = search_batches(measure, max_batch=64, gain=0.05, patience=2)
    assert calls == [1, 2] and (reason, fit) == ("no_improvement", 2)


@pytest.mark.parametrize(
    "flag,peer,every,any_",
    [
        (True, 1, True, True),
        (True, 0, False, True),
        (False, 1, False, True),
        (False, 0, False, False),
    ],
)
def test_every_and_any(flag, peer, every, any_):
    assert Peer(lambda i, v: [peer]).every(flag) is every
    # any(flag) sends int(not flag); the peer's flag is `peer`, so it sends int(not peer)
    assert Peer(lambda i, v: [int(not peer)]).any(flag) is any_
