"""Every difference between the releases of torch and transformers that modelprof touches, and
every private name of theirs it uses, in one place.

Nothing else in the package branches on a version or imports a private torch name: it asks here.
Each entry says which releases it was checked on; ``tests/test_compat.py`` calls every entry, so
a release that removes or renames one fails that test with the entry's name instead of a user's
profile. A feature that needs a newer release than the one installed raises
:class:`ModelProfError` through :func:`require`, naming the feature, the installed version and
the version it needs.

Releases checked (the compatibility matrix, ``.ci/compat``): torch 2.4 to 2.14, transformers 4.46
to 5.24 (see the README's "Supported versions").
"""
from __future__ import annotations

import functools
import inspect
import re
from typing import Any

import torch
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes

from modelprof.errors import ModelProfError

__all__ = [
    "CACHE_ARGUMENTS", "FakeTensor", "HigherOrderOperator", "OpOverload", "OpOverloadPacket",
    "TorchDispatchMode", "autocast_enabled", "cache_argument", "current_autograd_node",
    "decomposition_table", "disable_current_modes", "function_stack", "has_composite_kernel",
    "is_fake", "new_hf_cache", "optional_ops", "output_cache", "parse_to", "require",
    "torch_version", "transformers_version", "version_tuple",
]


def version_tuple(text: str) -> tuple[int, ...]:
    """``"2.4.1+cu121"`` -> ``(2, 4, 1)``; ``"5.0.0rc1"`` -> ``(5, 0, 0)``."""
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        match = re.match(r"\d+", piece)
        parts.append(int(match.group()) if match else 0)
    return tuple(parts)


def torch_version() -> tuple[int, ...]:
    return version_tuple(torch.__version__)


@functools.lru_cache(maxsize=1)
def transformers_version() -> tuple[int, ...] | None:
    """The installed transformers' version, None when it is not installed (not imported here:
    the package metadata is read)."""
    from importlib import metadata
    try:
        return version_tuple(metadata.version("transformers"))
    except metadata.PackageNotFoundError:
        return None


def require(feature: str, package: str, needed: tuple[int, ...]) -> None:
    """Raise :class:`ModelProfError` when ``package`` (``"torch"`` or ``"transformers"``) is
    older than ``needed`` for ``feature``."""
    have = torch_version() if package == "torch" else transformers_version()
    if have is None:
        raise ModelProfError(f"{feature} needs {package} >= {'.'.join(map(str, needed))}, "
                             f"which is not installed (pip install '{package}>="
                             f"{'.'.join(map(str, needed))}')")
    if have < needed:
        raise ModelProfError(f"{feature} needs {package} >= {'.'.join(map(str, needed))}; "
                             f"{package} {'.'.join(map(str, have))} is installed")


# -- torch: private classes and functions --------------------------------------------------------
# the private classes below are imported at the top of this module: checked on torch 2.4, 2.6,
# 2.11 and 2.14, all present under these names


def is_fake(t: torch.Tensor) -> bool:
    """A FakeTensor, or a functional tensor wrapping one (``torch.compile``/``export`` tracing).
    Checked on torch 2.4-2.14."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake
    return bool(_is_fake(t))


def current_autograd_node() -> Any:
    """The autograd node whose backward is running in this thread (None outside one); torch
    2.4-2.14: ``torch._C._current_autograd_node``."""
    return torch._C._current_autograd_node()


def has_composite_kernel(op: OpOverload) -> bool:
    """Whether ``op`` decomposes above autograd (a ``CompositeImplicitAutograd`` kernel); torch
    2.4-2.14: ``torch._C._dispatch_has_kernel_for_dispatch_key``."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(),
                                                                "CompositeImplicitAutograd"))


def decomposition_table() -> dict:
    """torch's table of Python decompositions (``torch._decomp``), torch 2.4-2.14."""
    from torch._decomp import decomposition_table as table
    return table


def parse_to(*args: Any, **kwargs: Any) -> tuple:
    """``Tensor.to``'s arguments parsed as torch parses them: ``(device, dtype, non_blocking,
    memory_format)``; torch 2.4-2.14: ``torch._C._nn._parse_to``."""
    return torch._C._nn._parse_to(*args, **kwargs)


class function_stack:  # noqa: N801 - a namespace of the torch-function mode stack's functions
    """The torch-function mode stack (torch 2.4-2.14, ``torch._C``)."""

    @staticmethod
    def length() -> int:
        return int(torch._C._len_torch_function_stack())

    @staticmethod
    def pop() -> Any:
        return torch._C._pop_torch_function_stack()

    @staticmethod
    def push(mode: Any) -> None:
        torch._C._push_on_torch_function_stack(mode)


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` ("cpu", "cuda"). ``torch.is_autocast_enabled``
    takes a device type from torch 2.4 on; before, the CPU had its own function."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:                                   # torch < 2.4
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


def optional_ops(*names: str, namespace: str = "aten") -> list:
    """The ops among ``names`` that exist in the running torch: ops are added and renamed
    between releases (``aten.batch_norm_backward`` is missing on 2.2, ``_fused_rms_norm_backward``
    before 2.7); a formula registers for those present only."""
    ns = getattr(torch.ops, namespace)
    found = []
    for n in names:
        try:
            found.append(getattr(ns, n))
        except (AttributeError, RuntimeError):
            continue
    return found


# -- transformers: the cache argument, its output and its classes ------------------------------
#: a causal LM's cache argument and output field: ``past_key_values`` up to transformers 5.23,
#: ``cache`` from 5.24 on (checked on 4.46, 4.56, 5.17, 5.23, 5.24)
CACHE_ARGUMENTS = ("cache", "past_key_values")


def cache_argument(forward: Any) -> str | None:
    """The name under which ``forward`` takes a KV cache (``"cache"`` or
    ``"past_key_values"``), read from its signature; None when it takes neither."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in CACHE_ARGUMENTS if name in params), None)


def output_cache(out: Any) -> Any:
    """The cache a model's output carries (``out.cache``, ``out.past_key_values`` before
    transformers 5.24), None when it has none."""
    for name in CACHE_ARGUMENTS:
        value = getattr(out, name, None)
        if value is not None:
            return value
    return None


def new_hf_cache(kind: str, config: Any, batch_size: int, max_len: int,
                 device: torch.device, dtype: torch.dtype) -> Any:
    """An empty transformers cache (``kind`` "dynamic" or "static") for ``config``.

    ``DynamicCache(config=...)`` (per-layer types: sliding windows) exists from transformers
    4.56; older releases build it empty. ``StaticCache`` took the batch size, device and dtype
    up to 4.55 and reads them from the first update after. Checked on 4.46, 4.56, 5.17, 5.24."""
    import transformers
    cls = transformers.StaticCache if kind == "static" else transformers.DynamicCache
    params = inspect.signature(cls.__init__).parameters
    kw: dict[str, Any] = {}
    if "config" in params:
        kw["config"] = config
    if kind == "static":
        kw["max_cache_len"] = max_len
        for name, value in (("max_batch_size", batch_size), ("device", device),
                            ("dtype", dtype)):
            if name in params:
                kw[name] = value
    return cls(**kw)


def meta_mask_dropped(model: Any, kwargs: dict[str, Any], device: torch.device
                      ) -> tuple[dict[str, Any], str | None]:
    """Keyword inputs for a transformers model counted on ``device="meta"``.

    transformers reads the values of an ``attention_mask`` to choose its attention path
    (``masking_utils._ignore_causal_mask_sdpa``: an all-ones mask lets SDPA run causal without a
    mask), and meta tensors have none. A mask of all ones, checked here while it still has
    values, means what no mask means, so it is left out and the model takes the same path as
    on the CPU; the note says so. Any other mask is kept (the forward then says it needs
    values). Checked on transformers 4.46, 5.17 and 5.24."""
    mask = kwargs.get("attention_mask")
    if (device.type != "meta" or not isinstance(mask, torch.Tensor) or mask.device.type == "meta"
            or not hasattr(model, "config") or not bool((mask == 1).all())):
        return kwargs, None
    kept = {k: v for k, v in kwargs.items() if k != "attention_mask"}
    return kept, ("attention_mask (all ones) left out on device='meta': transformers reads a "
                  "mask's values, which meta tensors do not have, and treats no mask as all ones")
