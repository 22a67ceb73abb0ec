"""``F.scaled_dot_product_attention`` on the meta device, counted as the fused kernel it is on
a real device.

On meta PyTorch runs SDPA's math decomposition (copies, repeated GQA heads, the whole score
matrix materialised), which counts other FLOPs and far more bytes than the fused op the CPU
runs (``aten._scaled_dot_product_flash_attention_for_cpu``). ``FusedMetaSDPA`` sends a meta
SDPA call to that kernel's meta implementation where the CPU would pick it, with the CPU's
preparation; any other call runs as it is (and raises as it would). ``attention_as_on_cpu``
lets ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` take their fused eval fast
paths on meta where the CPU does. ``cpu_outputs`` shapes a meta op's outputs as the CPU's kernel
does where that changes what is counted.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module
from torch.overrides import TorchFunctionMode

from modelprof.runtime import compat
from modelprof.runtime.tensors import PLAIN_TENSORS

__all__ = ["FusedMetaSDPA", "attention_as_on_cpu", "cpu_outputs"]

_SDPA = torch.nn.functional.scaled_dot_product_attention
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = (None, None, None, None, 0.0, False, None, False)
#: the dtypes of the CPU's fused kernel (``use_flash_attention_cpp``)
_FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_CONVOLUTION = torch.ops.aten.convolution.default
_BATCH_NORM = torch.ops.aten.native_batch_norm.default
_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}  # by dimensions


def _bind(args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """SDPA's arguments by name, or None when they are not SDPA's (it then raises itself)."""
    if len(args) > len(_NAMES) or not set(kwargs) <= set(_NAMES[len(args) :]):
        return None  # too many, unknown or given twice
    return {**dict(zip(_NAMES, _DEFAULTS)), **dict(zip(_NAMES, args)), **kwargs}


def _fusable_mask(mask: Any, q: torch.Tensor) -> bool:
    if mask is None:
        return True
    # a 3-D mask only beside 3-D inputs (torch 2.14's CPU runs a 4-D call with one unfused)
    return (
        isinstance(mask, torch.Tensor)
        and mask.dim() in ((2, 3, 4) if q.dim() == 3 else (2, 4))
        and (mask.dtype is torch.bool or mask.dtype == q.dtype)
    )


def _heads_fit(q: tuple, k: tuple, v: tuple, gqa: bool) -> bool:
    """From 4-D shapes: equal batches; equal heads, or with ``enable_gqa`` key/value heads
    dividing the query's (``check_batch_size_and_num_heads_dense``)."""
    if not q[0] == k[0] == v[0]:
        return False
    hq, hk, hv = q[1], k[1], v[1]
    return hq == hk == hv or (bool(gqa) and hk == hv and hk > 0 and hq % hk == 0)


def fused_on_cpu(b: dict[str, Any]) -> bool:
    """Whether the CPU would run this call as its fused kernel (``use_flash_attention_cpp``:
    flash enabled, dense 4-D tensors of one supported dtype, no dropout, one head size, last
    dimension contiguous, non-empty sequences, a 2-D or 4-D mask not combined with
    ``is_causal``), for meta tensors of 4 dimensions, or 3 (a batch of one) where this torch's
    CPU kernel takes them (``compat.cpu_sdpa_fuses_3d``)."""
    q, k, v = b["query"], b["key"], b["value"]
    # plain tensors only: a subclass (DTensor, a fake or nested tensor) runs SDPA its own way
    if not all(
        type(t) in PLAIN_TENSORS
        and t.device.type == "meta"
        and not t.is_nested
        and t.layout is torch.strided
        for t in (q, k, v)
    ):
        return False
    if not (q.dim() == k.dim() == v.dim() and q.dim() in (3, 4)) or not _fusable_mask(
        b["attn_mask"], q
    ):
        return False
    if q.dim() == 3 and not compat.cpu_sdpa_fuses_3d():
        return False
    q4, k4, v4 = (tuple(t.shape) if t.dim() == 4 else (1, *t.shape) for t in (q, k, v))
    return (
        torch.backends.cuda.flash_sdp_enabled()
        and q.dtype == k.dtype == v.dtype
        and q.dtype in _FUSED_DTYPES
        and b["dropout_p"] == 0.0
        and not (b["is_causal"] and b["attn_mask"] is not None)
        and q.shape[-1] == k.shape[-1] == v.shape[-1]
        and all(t.stride(-1) == 1 for t in (q, k, v))
        and q.shape[-2] > 0
        and k.shape[-2] > 0
        and _heads_fit(q4, k4, v4, b["enable_gqa"])
    )


def fused_sdpa(b: dict[str, Any]) -> torch.Tensor:
    """SDPA as the CPU runs it fused: 3-D inputs get a batch of one (a 2-D or 3-D mask leading
    dimensions of one up to four), a boolean mask becomes 0 / -inf in the query's dtype, then
    the fused kernel."""
    q, k, v, mask = b["query"], b["key"], b["value"], b["attn_mask"]
    three_d = q.dim() == 3
    if three_d:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        while mask is not None and mask.dim() < 4:
            mask = mask.unsqueeze(0)
    if mask is not None and mask.dtype is torch.bool:
        mask = torch.where(
            mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=q.dtype, device=mask.device)
        )
    extra = {} if mask is None else {"attn_mask": mask}
    if b["scale"] is not None:
        extra["scale"] = b["scale"]
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, float(b["dropout_p"]), bool(b["is_causal"]), **extra
    )[0]
    return out.squeeze(0) if three_d else out


class FusedMetaSDPA(TorchFunctionMode):
    """Active around a counted forward: a meta SDPA call the CPU would fuse runs as the CPU's
    fused kernel; every other call passes through. A call that raises before any op does
    (``Tensor.numpy()`` of a meta tensor) is added to ``raised``, the counter's list of what
    raised on meta."""

    def __init__(self, raised: list[str] | None = None) -> None:
        super().__init__()
        self.raised = raised
        compat.cpu_sdpa_fuses_3d()  # asked (once) before any counted op, not among them

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if func is _SDPA:
            bound = _bind(args, kwargs)
            if bound is not None and fused_on_cpu(bound):
                return fused_sdpa(bound)
        if self.raised is None:
            return func(*args, **kwargs)
        before = len(self.raised)
        try:
            return func(*args, **kwargs)
        except Exception as e:
            if len(self.raised) == before:  # no op it ran said so
                name = getattr(func, "__qualname__", None) or str(func)
                self.raised.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            raise


def _is_channels_last(t: Any) -> bool:
    """Whether ``t`` is a channels-last 4-D or 5-D tensor that is not contiguous."""
    if type(t) not in PLAIN_TENSORS or t.dim() not in _CHANNELS_LAST or t.is_contiguous():
        return False
    return t.is_contiguous(memory_format=_CHANNELS_LAST[t.dim()])


def cpu_outputs(func: Any, args: tuple, out: Any) -> Any:
    """``out`` of a meta op as the CPU (and CUDA) kernel shapes it: empty saved statistics of a
    batch norm in eval (``(C,)`` on meta); a channels-last output of a convolution whose input or
    weight is channels-last (contiguous on meta)."""
    if func is _BATCH_NORM and len(args) > 5 and not args[5] and type(out) is tuple:
        empty = [torch.empty((0,), dtype=o.dtype, device=o.device) for o in out[1:]]
        return (out[0], *empty)
    if (
        func is _CONVOLUTION
        and type(out) is torch.Tensor
        and out.dim() in (4, 5)
        and any(map(_is_channels_last, args[:2]))  # input or weight
        and out.is_contiguous()
    ):
        layout = _CHANNELS_LAST[out.dim()]
        return torch.empty(out.shape, dtype=out.dtype, device=out.device, memory_format=layout)
    return out


def _fused_or_as_is(*args: Any, **kwargs: Any) -> torch.Tensor:
    """SDPA as ``FusedMetaSDPA`` runs it, for a caller this mode does not see."""
    bound = _bind(args, kwargs)
    if bound is not None and fused_on_cpu(bound):
        return fused_sdpa(bound)
    return _SDPA(*args, **kwargs)


@contextlib.contextmanager
def _fused_inside() -> Iterator[None]:
    """``F.multi_head_attention_forward`` runs with this mode off, so its SDPA call would not
    reach the mode: for the call, the name it looks up is ``_fused_or_as_is``."""
    functional = torch.nn.functional
    before = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _fused_or_as_is
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = before


def _stock_encoder_layer(module: nn.Module) -> bool:
    """An ``nn.TransformerEncoderLayer`` running torch's own forward, whose fast-path test then
    decides what runs (a forward of the user's own may call anything, which the SDPA mode must
    then see)."""
    layer = nn.TransformerEncoderLayer
    return isinstance(module, layer) and type(module).forward is layer.forward


@contextlib.contextmanager
def attention_as_on_cpu(modules: Iterable[nn.Module]) -> Iterator[None]:
    """On meta, each ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` (torch's own
    forward) of ``modules`` called in this thread runs as on the CPU: its own fast-path test
    decides (the SDPA mode off the stack for the call, as a torch-function mode fails that
    test; meta passing the device test), so in eval it runs ``_native_multi_head_attention`` or
    ``_transformer_encoder_layer_fwd`` (one fused op, the layer a leaf) where the CPU and CUDA
    do; on the slow path its SDPA is fused as the CPU fuses it. Nothing of the modules changes.
    A layer's device test reads a module-level name, so during a layer's call here another
    thread's layer on meta passes it too. ``nn.TransformerEncoder``'s own fast path is left to
    fail on meta: it turns a padded batch into a nested tensor by the mask's values."""
    attention = {id(m) for m in modules if isinstance(m, nn.MultiheadAttention)}
    layers = {id(m) for m in modules if _stock_encoder_layer(m)}
    if not attention and not layers:
        yield
        return
    original = compat.mha_device_check()
    device_name = compat.fast_path_device_name()
    # per running call: module, mode, swap, and a layer's device name to put back
    calls: list[tuple[nn.Module, Any, Any, str | None]] = []
    owner, get_ident = threading.get_ident(), threading.get_ident

    def check(x: Any) -> bool:  # (patched for every thread: another's calls pass through)
        if get_ident() != owner or not calls:
            return original(x)
        return original(x) or (x is not None and x.device.type == "meta")

    def pre(module: nn.Module, args: tuple) -> None:
        key = id(module)
        if key not in attention and key not in layers or get_ident() != owner:
            return
        mode = compat.current_function_mode()
        popped = compat.function_stack.pop() if isinstance(mode, FusedMetaSDPA) else None
        swap = _fused_inside()
        swap.__enter__()
        name = compat.fast_path_device_name() if key in layers else None
        if name is not None:
            compat.set_fast_path_device_name("meta")
        calls.append((module, popped, swap, name))

    def post(module: nn.Module, args: tuple, output: Any) -> Any:
        if not calls or calls[-1][0] is not module or get_ident() != owner:
            return None
        _, mode, swap, name = calls.pop()
        if name is not None:
            compat.set_fast_path_device_name(name)
        swap.__exit__(None, None, None)
        if mode is not None:
            compat.function_stack.push(mode)
        weights = output[1] if isinstance(output, tuple) and len(output) == 2 else None
        if isinstance(weights, torch.Tensor) and weights.shape == (0,):
            return (output[0], None)  # no weights asked for: the CPU kernel returns None
        return None

    handles = [
        _module.register_module_forward_pre_hook(pre),
        _module.register_module_forward_hook(post, always_call=True),
    ]
    compat.set_mha_device_check(check)
    try:
        yield
    finally:
        compat.set_mha_device_check(original)
        if device_name is not None:
            compat.set_fast_path_device_name(device_name)
        for handle in handles:
            handle.remove()
