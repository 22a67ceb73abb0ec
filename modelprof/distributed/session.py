"""What ``profile()`` does differently under a process group, in one context manager: the
counting view (per rank, or ``view="global"``); a join check (a communicating model needs every
rank in its collectives: a rank missing after ``MODELPROF_JOIN_TIMEOUT_S``, 60 s, is an error,
not a hang); FSDP2 modules sharded on entry resharded on exit (else the state guard restores
sharded parameters behind FSDP's back); a failing group named in a ``ModelProfError``; and the
group's place for ``Report.env`` (``group_env``, ``contention_note``).
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
from modelprof.runtime.compiled import eager_module
from modelprof.runtime.group import RankInfo, communicates, current_group, fsdp_modules, one_voice

__all__ = ["contention_note", "group_env", "sharded_session"]

JOIN_TIMEOUT_ENV = "MODELPROF_JOIN_TIMEOUT_S"
_calls = [0]  # profile() calls on communicating models in this process (the join's key)


@contextlib.contextmanager
def sharded_session(model: nn.Module, view: Any = "rank") -> Iterator[None]:
    """One profile() call under a process group (see the module docstring)."""
    view = ShardView.parse(view)
    group = current_group()
    active = group is not None and communicates(model)
    fsdp = fsdp_modules(eager_module(model))
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
    """A note when the ranks of this host (``LOCAL_WORLD_SIZE``) time on its CPU at once."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    alone = device.type != "cpu" or not local.isdigit() or int(local) < 2
    if alone or current_group() is None or not communicates(model):
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
            # withdraw, leaving the number free for this rank's next profile()
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
