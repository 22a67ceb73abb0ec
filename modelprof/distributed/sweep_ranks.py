"""How the ranks of a sweep meet: a barrier, an all-gather of rows and a shared count of
finished configurations. Under ``torchrun`` they meet on its key-value store, not a process
group, so each configuration is profiled as in one process; under a group the caller made,
on that group (gloo), where timing is refused (:func:`open_ranks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from modelprof.errors import ModelProfError
from modelprof.runtime.group import group_up

__all__ = ["Alone", "GroupRanks", "StoreRanks", "SweepRanks", "open_ranks"]

_CALLS = itertools.count()  # every rank calls sweep() in the same order: the same key prefix


@dataclasses.dataclass(frozen=True)
class SweepRanks:
    """Where this process stands: its rank among ``world_size``, its local rank, its host."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    host: str = dataclasses.field(default_factory=socket.gethostname)

    @classmethod
    def here(cls, rank: int = 0, world_size: int = 1) -> SweepRanks:
        """This process at ``rank`` of ``world_size``, its local rank from ``LOCAL_RANK``."""
        return cls(rank, world_size, env_int("LOCAL_RANK", 0))

    def mine(self, items: list[Any]) -> list[Any]:
        """This rank's share: item ``i`` goes to rank ``i % world_size``."""
        return [c for i, c in enumerate(items) if i % self.world_size == self.rank]


class Alone:
    """One process: nothing to meet."""

    def __init__(self) -> None:
        self.ranks = SweepRanks.here()
        self._done = 0

    def barrier(self, name: str) -> None: ...

    def all_gather(self, obj: Any, name: str) -> list[Any]:
        return [obj]

    def add_done(self, n: int) -> None:
        self._done += n

    def done(self) -> int | None:
        return self._done


class StoreRanks:
    """The ranks of a torchrun job, meeting on its key-value store (no process group)."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout_s: float) -> None:
        self.store, self.timeout = store, timedelta(seconds=timeout_s)
        self.ranks = SweepRanks.here(rank, world_size)

    def _wait(self, keys: list[str], what: str) -> None:
        try:
            self.store.wait(keys, self.timeout)
        except Exception as e:  # a peer died or is stuck: say which wait
            raise ModelProfError(
                f"sweep: rank {self.ranks.rank} waited {what} for "
                f"{self.timeout.total_seconds():g} s in vain ({type(e).__name__}:"
                f" {e}); did a rank die? Run the sweep again to resume."
            ) from e

    def barrier(self, name: str) -> None:
        if self.store.add(f"{name}/arrived", 1) == self.ranks.world_size:
            self.store.set(f"{name}/go", "1")
        self._wait([f"{name}/go"], f"at the barrier {name!r}")

    def all_gather(self, obj: Any, name: str) -> list[Any]:
        world = self.ranks.world_size
        self.store.set(f"{name}/{self.ranks.rank}", json.dumps(obj))
        keys = [f"{name}/{r}" for r in range(world)]
        self._wait(keys, "for the other ranks' results")
        parts = [json.loads(self.store.get(k)) for k in keys]
        # rank 0 may host the store: it leaves only once all have read
        if self.store.add(f"{name}/read", 1) == world:
            self.store.set(f"{name}/all-read", "1")
        if self.ranks.rank == 0:
            self._wait([f"{name}/all-read"], "for the other ranks to read the results")
        return parts

    def add_done(self, n: int) -> None:
        self.store.add("done", n)

    def done(self) -> int | None:
        return int(self.store.add("done", 0))


class GroupRanks:
    """The ranks of a process group the caller initialised (collectives over gloo)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.ranks = SweepRanks.here(dist.get_rank(group), dist.get_world_size(group))

    def barrier(self, name: str) -> None:
        dist.barrier(group=self.group)

    def all_gather(self, obj: Any, name: str) -> list[Any]:
        parts: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(parts, obj, group=self.group)
        return parts

    def add_done(self, n: int) -> None: ...

    def done(self) -> int | None:
        return None  # only this rank's count is known here


def env_int(name: str, default: int) -> int:
    """An integer environment variable, checked."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ModelProfError(f"environment variable {name}={value!r} is not an integer") from None


@contextlib.contextmanager
def open_ranks(timeout_s: float, *, timed: bool) -> Iterator[Alone | StoreRanks | GroupRanks]:
    """Meet the other ranks: on the caller's process group, on torchrun's store when
    ``WORLD_SIZE`` > 1, else alone. ``timed`` (the sweep times): refused under a group."""
    if group_up() and dist.get_world_size() > 1:
        if timed:
            raise ModelProfError(
                "sweep: timed configurations cannot run under an initialised process group "
                f"(world size {dist.get_world_size()}): profile() keeps its ranks in step, "
                "while a sweep times different models on different ranks. Call sweep() before "
                "init_process_group (torchrun's environment is all it needs), or without it."
            )
        group = (
            None
            if dist.get_backend() == "gloo"
            else dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        )
        yield GroupRanks(group)
        return
    world = env_int("WORLD_SIZE", 1)
    yield Alone() if world <= 1 else _store_ranks(world, timeout_s)


def _store_ranks(world: int, timeout_s: float) -> StoreRanks:
    rank = env_int("RANK", -1)
    if not 0 <= rank < world:
        raise ModelProfError(
            f"WORLD_SIZE={world} but RANK={os.environ.get('RANK')!r}: launch "
            "the sweep with torchrun, which sets both"
        )
    try:
        store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    except (ValueError, RuntimeError) as e:
        raise ModelProfError(
            f"sweep: rank {rank} of {world} could not meet the others over "
            f"env:// ({e}); are all {world} ranks started? Launch with torchrun "
            "(or set MASTER_ADDR and MASTER_PORT on every rank)"
        ) from e
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"modelprof-sweep/{attempt}/{next(_CALLS)}"
    return StoreRanks(dist.PrefixStore(prefix, store), rank, world, timeout_s)
