"""What ``profile()`` does differently under a process group, in one context manager.

- the counting view (per rank by default, ``view="global"``);
- a join check: a model that communicates (DDP, FSDP2, DTensor parameters) needs every rank in
  each of its collectives, so all ranks must enter ``profile()``; one that does not is named in
  a ``ModelProfError`` after ``MODELPROF_JOIN_TIMEOUT_S`` (60 s) instead of hanging until the
  process group's own timeout;
- FSDP2 put back as it was: modules whose parameters were sharded on entry are resharded on exit
  (FSDP2 leaves the root unsharded after a forward; the state guard would then restore the
  sharded parameters behind FSDP's back, and the next step would mix DTensor and Tensor);
- a process group that fails mid-profile: ``ModelProfError`` naming it;
- rank, world size, backend, host and view for ``Report.env`` (``group_env``), and a note when
  the ranks of one host time on its CPU at once (``contention_note``).

DDP's gradient all-reduce and its reducer left alone are the counted step's own
(``step.count.count_step``), as they hold for any DDP model.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from modelprof.counting.sharding import ShardView, current_view, shard_view
from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.agree import agreeing, agreement
from modelprof.runtime.group import RankInfo, communicates, current_group, fsdp_modules, one_voice

__all__ = ["contention_note", "group_env", "sharded_session"]

JOIN_TIMEOUT_ENV = "MODELPROF_JOIN_TIMEOUT_S"
_calls = [0]  # profile() calls on communicating models in this process (the join's key)


@contextlib.contextmanager
def sharded_session(model: nn.Module, view: Any = "rank") -> Iterator[None]:
    """One profile() call under a process group (see the module docstring): what it changes is
    read by the passes from the context (the view, the agreement, one voice)."""
    view = ShardView.parse(view)
    group = current_group()
    active = group is not None and communicates(model)
    fsdp = fsdp_modules(getattr(model, "_orig_mod", model))
    if fsdp:
        compat.require("profiling an FSDP2 (fully_shard) model", "torch", compat.FSDP2_PUBLIC)
    sharded_on_entry = [m for m in fsdp if _is_sharded(m)]
    if active and group.world_size > 1 and group.backend != "fake":
        _join(model, group)
    try:
        with shard_view(view), agreeing(agreement() if active else None), one_voice():
            yield
    except ModelProfError:
        raise
    except Exception as e:
        if not active:
            raise
        raise ModelProfError(
            f"profiling {type(model).__name__} failed on rank {group.rank} of "
            f"{group.world_size} ({group.backend}): {type(e).__name__}: {e}. If a "
            "rank exited or the process group failed, every rank stops here"
        ) from e
    finally:
        for m in sharded_on_entry:  # FSDP2 leaves the root unsharded after a forward
            if not _is_sharded(m):
                m.reshard()


def group_env() -> dict[str, Any]:
    """This rank's place in the group and the view, for ``Report.env`` (empty outside one)."""
    group = current_group()
    if group is None:
        return {}
    return {**group.as_dict(), "distributed_view": current_view().value}


def contention_note(model: nn.Module, device: torch.device) -> str | None:
    """Timed on the CPU while the other ranks of this host time too (torchrun's
    ``LOCAL_WORLD_SIZE``): what the numbers then are, for the report's notes."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if device.type != "cpu" or not local.isdigit() or int(local) < 2:
        return None
    if current_group() is None or not communicates(model):
        return None
    return (
        f"{local} ranks timed on this host's CPU at once (LOCAL_WORLD_SIZE={local}): "
        "each rank's latencies are under the others' load, the group's pace rather "
        "than one rank's solo speed, and their intervals cover the sampling, not that "
        "contention"
    )


def _join(model: nn.Module, group: RankInfo) -> None:
    """Every rank of the group must enter profile() for a communicating model."""

    _calls[0] += 1
    key = f"modelprof/profile/{_calls[0]}"
    store = compat.default_store()
    timeout = float(os.environ.get(JOIN_TIMEOUT_ENV, "60"))
    joined = store.add(key, 1)
    deadline = time.monotonic() + timeout
    while joined < group.world_size:
        if time.monotonic() > deadline:
            # withdraw, and leave the number free: this rank's next profile() of a
            # communicating model meets the others' first one again
            store.add(key, -1)
            _calls[0] -= 1
            raise ModelProfError(
                f"profile() of {type(model).__name__} was called on rank "
                f"{group.rank} but only {joined} of {group.world_size} ranks "
                f"joined within {timeout:g} s ({JOIN_TIMEOUT_ENV}): the model's "
                "collectives need every rank, so call profile() on all ranks (under "
                "torchrun, in the script every rank runs)"
            )
        time.sleep(0.01)
        joined = store.add(key, 0)


def _is_sharded(m: nn.Module) -> bool:
    group = compat.fsdp_param_group(m)
    return group is None or group.is_sharded
