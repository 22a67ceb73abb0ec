"""Where this process runs under a process group, the device ``"cuda"`` means under torchrun,
and who speaks: only rank 0 prints and writes, unless ``MODELPROF_ALL_RANKS=1`` (or
``all_ranks=True``) asks every rank to.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import socket
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from modelprof.errors import ModelProfWarning, NoisyMeasurementWarning
from modelprof.runtime import compat
from modelprof.runtime.compiled import eager_module
from modelprof.runtime.tensors import is_dtensor

__all__ = [
    "RankInfo",
    "all_ranks_speak",
    "communicates",
    "current_group",
    "fsdp_modules",
    "group_up",
    "is_ddp",
    "is_speaker",
    "local_device",
    "one_voice",
    "own_work",
]

ALL_RANKS_ENV = "MODELPROF_ALL_RANKS"


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """This process's place in the default process group (recorded in ``Report.env``)."""

    rank: int
    world_size: int
    backend: str
    host: str
    local_rank: int | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def group_up() -> bool:
    """A default process group is initialised in this process (a collective can run)."""
    return dist.is_available() and dist.is_initialized()


def current_group() -> RankInfo | None:
    """The default process group as seen from this rank, or None outside one."""
    if not group_up():
        return None
    local = os.environ.get("LOCAL_RANK")
    return RankInfo(
        dist.get_rank(),
        dist.get_world_size(),
        str(dist.get_backend()),
        socket.gethostname(),
        int(local) if local is not None and local.isdigit() else None,
    )


def all_ranks_speak() -> bool:
    """Whether ``MODELPROF_ALL_RANKS`` asks every rank to print and write."""
    return os.environ.get(ALL_RANKS_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def is_speaker(all_ranks: bool | None = None) -> bool:
    """Whether this process prints and writes: alone, on rank 0, or every rank when asked."""
    if all_ranks if all_ranks is not None else all_ranks_speak():
        return True
    if group_up():
        # a fake group (profile_sharded) is one process: it always speaks
        return dist.get_rank() == 0 or str(dist.get_backend()) == "fake"
    rank = os.environ.get("RANK")  # launched by torchrun, group not (yet) initialised
    return rank is None or rank == "0"


#: set by :func:`own_work`: what runs is this rank's alone, its warnings no repeat of rank 0's
_OWN_WORK: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "modelprof_own_work", default=False
)


@contextlib.contextmanager
def own_work() -> Iterator[None]:
    """Within it this rank runs work of its own, not the work every rank runs alike (a sweep's
    configuration, whose warnings its row records): :func:`one_voice` silences nothing, since
    no other rank says them."""
    token = _OWN_WORK.set(True)
    try:
        yield
    finally:
        _OWN_WORK.reset(token)


@contextlib.contextmanager
def one_voice(all_ranks: bool | None = None) -> Iterator[bool]:
    """Silence modelprof's warnings on every rank but the speaker (every rank would say the
    same), but in :func:`own_work`; yields whether it speaks."""
    if is_speaker(all_ranks) or _OWN_WORK.get():
        yield True
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ModelProfWarning)
        warnings.simplefilter("ignore", NoisyMeasurementWarning)
        yield False


def local_device(device: Any) -> Any:
    """``cuda`` without an index as ``cuda:LOCAL_RANK`` under torchrun; anything else as it is."""
    if isinstance(device, str) and device.strip() == "cuda":
        device = torch.device("cuda")
    if not isinstance(device, torch.device) or device.type != "cuda" or device.index is not None:
        return device
    local = os.environ.get("LOCAL_RANK")
    if local is None or not local.isdigit():
        return device
    return torch.device("cuda", int(local))


def is_ddp(model: nn.Module) -> bool:
    """Whether ``model`` is a DistributedDataParallel wrapper."""
    return isinstance(model, DistributedDataParallel)


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The ``fully_shard``-ed (FSDP2) modules of ``model``."""
    if not any(type(m).__name__.startswith("FSDP") for m in model.modules()):
        return []
    fsdp = compat.fsdp_module_class()
    return [m for m in model.modules() if isinstance(m, fsdp)]


def communicates(model: nn.Module) -> bool:
    """Whether running ``model`` issues collectives (DDP, FSDP2, DTensor parameters)."""
    model = eager_module(model)
    return (
        is_ddp(model) or bool(fsdp_modules(model)) or any(is_dtensor(p) for p in model.parameters())
    )
