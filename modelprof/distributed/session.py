"""What ``profile()`` does differently under a process group, in one context manager.

- the counting view (per rank by default, ``view="global"``);
- a join check: a model that communicates (DDP, FSDP2, DTensor parameters) needs every rank in
  each of its collectives, so all ranks must enter ``profile()``; one that does not is named in
  a ``ModelProfError`` after ``MODELPROF_JOIN_TIMEOUT_S`` (60 s) instead of hanging until the
  process group's own timeout;
- FSDP2 put back as it was: modules whose parameters were sharded on entry are resharded on exit
  (FSDP2 leaves the root unsharded after a forward; the state guard would then restore the
  sharded parameters behind FSDP's back, and the next step would mix DTensor and Tensor);
- DDP: its gradient all-reduce, counted from the reducer's buckets (the counted step runs on
  aliases, so DDP's own hooks do not fire there), and ``no_sync`` around the counted step, so
  the reducer is not prepared for a backward that never reaches it;
- a process group that fails mid-profile: ``ModelProfError`` naming it;
- rank, world size, backend and host for ``Report.env``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from modelprof.counting.collectives import Collective, CollectiveKind, add_collective, merge_comm
from modelprof.counting.sharding import ShardView, shard_view
from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.agree import agreeing, agreement
from modelprof.runtime.group import communicates, current_group, fsdp_modules, is_ddp, one_voice

__all__ = [
    "DistributedSession",
    "communicates",
    "ddp_gradient_collectives",
    "is_ddp",
    "sharded_session",
]

JOIN_TIMEOUT_ENV = "MODELPROF_JOIN_TIMEOUT_S"
_calls = [0]  # profile() calls on communicating models in this process (the join's key)


def ddp_gradient_collectives(model: nn.Module) -> list[Collective]:
    """One all-reduce per bucket of DDP's reducer (its logged bucket sizes, in bytes), over
    DDP's process group: what a backward with the default all-reduce hook runs."""
    sizes = str(model._get_ddp_logging_data().get("bucket_sizes", "")).split(",")
    n = model.process_group.size() if getattr(model, "process_group", None) is not None else 1
    return [
        Collective(CollectiveKind.ALL_REDUCE, n, int(s), int(s))
        for s in sizes
        if s.strip().isdigit()
    ]


class DistributedSession:
    """State of one ``profile()`` call under a process group (see the module docstring)."""

    def __init__(self, model: nn.Module, view: ShardView) -> None:
        self.model = model
        self.view = view
        self.group = current_group()
        self.active = self.group is not None and communicates(model)
        self._fsdp = fsdp_modules(getattr(model, "_orig_mod", model))
        if self._fsdp:
            compat.require("profiling an FSDP2 (fully_shard) model", "torch", compat.FSDP2_PUBLIC)
        self._sharded_on_entry = [m for m in self._fsdp if _is_sharded(m)]

    def env(self) -> dict[str, Any]:
        if self.group is None:
            return {}
        return {
            **{k: v for k, v in self.group.as_dict().items()},
            "distributed_view": self.view.value,
        }

    def contention_note(self, device: torch.device) -> str | None:
        """Timed on the CPU while the other ranks of this host time too (torchrun's
        ``LOCAL_WORLD_SIZE``): what the numbers then are, for the report's notes."""
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        if not self.active or device.type != "cpu" or not local.isdigit() or int(local) < 2:
            return None
        return (
            f"{local} ranks timed on this host's CPU at once (LOCAL_WORLD_SIZE={local}): "
            "each rank's latencies are under the others' load, the group's pace rather "
            "than one rank's solo speed, and their intervals cover the sampling, not that "
            "contention"
        )

    def join(self) -> None:
        """Every rank of the group must enter profile() for a communicating model."""
        if not self.active or self.group.world_size < 2 or self.group.backend == "fake":
            return
        import torch.distributed as dist

        _calls[0] += 1
        key = f"modelprof/profile/{_calls[0]}"
        store = dist.distributed_c10d._get_default_store()
        timeout = float(os.environ.get(JOIN_TIMEOUT_ENV, "60"))
        joined = store.add(key, 1)
        deadline = time.monotonic() + timeout
        while joined < self.group.world_size:
            if time.monotonic() > deadline:
                # withdraw, and leave the number free: this rank's next profile() of a
                # communicating model meets the others' first one again
                store.add(key, -1)
                _calls[0] -= 1
                raise ModelProfError(
                    f"profile() of {type(self.model).__name__} was called on rank "
                    f"{self.group.rank} but only {joined} of {self.group.world_size} ranks "
                    f"joined within {timeout:g} s ({JOIN_TIMEOUT_ENV}): the model's "
                    "collectives need every rank, so call profile() on all ranks (under "
                    "torchrun, in the script every rank runs)"
                )
            time.sleep(0.01)
            joined = store.add(key, 0)

    @contextlib.contextmanager
    def counting_step(self) -> Iterator[None]:
        """Around the counted training step: DDP's ``no_sync`` (its reducer left alone)."""
        if is_ddp(self.model):
            with self.model.no_sync():
                yield
        else:
            yield

    def attach_backward_comm(self, records: list, step_cost: Any) -> None:
        """The backward's collectives onto the call records (DDP's on the root's)."""
        for record, cost in zip(records, step_cost.backward):
            record.backward_comm = cost.comm
        if not records:
            return
        # collectives autograd runs outside any module's node (FSDP2's final callback, a hook
        # on the loss's gradient) and DDP's all-reduce belong to the model: the root's row
        loose = step_cost.loss_backward.comm
        step_cost.loss_backward.comm = None
        extra = list(ddp_gradient_collectives(self.model)) if is_ddp(self.model) else []
        if loose or extra:
            root = records[0]
            root.backward_comm = dict(root.backward_comm or {})
            merge_comm(root.backward_comm, loose or {})
            for c in extra:
                add_collective(root.backward_comm, c)

    def restore_fsdp(self) -> None:
        """Reshard the FSDP2 modules that were sharded on entry and are not now."""
        for m in self._sharded_on_entry:
            if not _is_sharded(m):
                m.reshard()


def _is_sharded(m: nn.Module) -> bool:
    group = m._get_fsdp_state()._fsdp_param_group
    return group is None or group.is_sharded


@contextlib.contextmanager
def sharded_session(model: nn.Module, view: Any = "rank") -> Iterator[DistributedSession]:
    """The session of one profile() call; see the module docstring."""
    session = DistributedSession(model, ShardView.parse(view))
    session.join()
    try:
        with (
            shard_view(session.view),
            agreeing(agreement() if session.active else None),
            one_voice(),
        ):
            yield session
    except ModelProfError:
        raise
    except Exception as e:
        if not session.active:
            raise
        g = session.group
        raise ModelProfError(
            f"profiling {type(model).__name__} failed on rank {g.rank} of "
            f"{g.world_size} ({g.backend}): {type(e).__name__}: {e}. If a "
            "rank exited or the process group failed, every rank stops "
            "here"
        ) from e
    finally:
        session.restore_fsdp()
