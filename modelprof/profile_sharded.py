"""The per-rank table without the ranks: ``profile_sharded(build, input_size, world_size=8,
rank=3)`` starts PyTorch's fake process group (collectives move nothing; every op has rank 3's
shapes), calls the user's ``build()`` (sharding or parallelising as under torchrun) under
``torch.device("meta")`` and profiles the result with ``timing=False``, a model left on meta
as fake tensors (FSDP2 refuses meta parameters). A model too large for any machine, sized per
rank from a laptop.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from modelprof.errors import ModelProfError, check_int, is_int
from modelprof.profile import profile
from modelprof.runtime import compat

__all__ = ["profile_sharded"]


def _check(world_size: Any, rank: Any, build: Any, kwargs: dict) -> tuple[int, int]:
    """``(world_size, rank)`` as ints, or a ModelProfError naming what is wrong."""
    if not callable(build):
        raise ModelProfError(
            f"build={build!r} must be a callable that returns the model "
            "(sharded or parallelised as under torchrun)"
        )
    world_size = check_int("world_size", world_size)
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ModelProfError(f"rank={rank!r} must be an int in [0, {world_size})")
    if kwargs.get("timing"):
        raise ModelProfError(
            "timing=True: a fake process group has no clock (its collectives "
            "move nothing); time the model under torchrun"
        )
    return world_size, int(rank)


def _plan_mismatch(caught: list) -> None:
    """A plan entry ``parallelize_module`` skipped is an error: the table would be wrong."""
    for w in caught:
        text = str(w.message)
        if "Parallelize plan key" in text and "skipping" in text:
            raise ModelProfError(f"the parallel plan does not match the model: {text}")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _on_meta(model: nn.Module) -> bool:
    return any(compat.local_tensor(p).is_meta for p in (*model.parameters(), *model.buffers()))


def profile_sharded(
    build: Callable[[], nn.Module],
    input_size: Any = None,
    *,
    world_size: int,
    rank: int = 0,
    inputs: Any = None,
    device: str = "meta",
    **profile_options: Any,
) -> Any:
    """Profile rank ``rank`` of ``world_size`` from one process (see the module docstring).

    ``build()`` runs under ``torch.device(device)`` (``"meta"``: no memory; DDP needs
    ``device="cpu"``). ``inputs`` may be a callable, called in the model's device and
    fake-tensor context. Other options go to ``profile`` (``backward=True``, ``view="global"``...).
    """
    world_size, rank = _check(world_size, rank, build, profile_options)
    if dist.is_initialized():
        raise ModelProfError(
            "profile_sharded() starts a fake process group of its own, but one "
            f"is active already (backend {dist.get_backend()!r}): under a real "
            "group, call profile() on every rank instead"
        )
    dist.init_process_group("fake", store=compat.fake_store(), rank=rank, world_size=world_size)
    try:
        try:
            # FSDP's default mesh follows the GPU; a model on meta or the CPU runs on the CPU
            pin = (
                compat.default_mesh_on_cpu()
                if torch.device(device).type in ("meta", "cpu")
                else contextlib.nullcontext()
            )
            with torch.device(device), pin, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = build()
            _plan_mismatch(caught)
        except ModelProfError:
            raise
        except Exception as e:
            raise ModelProfError(
                f"build() failed under torch.device({device!r}) with a fake "
                f"group of {world_size}: {type(e).__name__}: {e}"
                + (" (DDP needs real values: pass device='cpu')" if "meta" in str(e) else "")
            ) from e
        if not isinstance(model, nn.Module):
            raise ModelProfError(f"build() returned {type(model).__name__}, not a module")
        on_meta = _on_meta(model)
        fake = compat.FakeTensorMode(allow_non_fake_inputs=True) if on_meta else None
        with fake or contextlib.nullcontext():
            run_device = "cpu" if on_meta else device
            if on_meta:
                model.to_empty(device="cpu")  # fake tensors: shapes on cpu, no memory
            if callable(inputs):
                with torch.device(run_device):
                    inputs = inputs()
            return profile(
                model,
                input_size,
                inputs=inputs,
                device=run_device,
                **{**profile_options, "timing": False},
            )
    finally:
        dist.destroy_process_group()
