"""Every difference between torch and transformers releases that modelprof touches, and every
private name of theirs it uses: nothing else branches on a version or imports a private name.

Each entry says which releases it was checked on; ``tests/test_compat.py`` calls every entry, so
a release that removes one fails there by name. A name some release lacks is imported inside its
entry, so ``import modelprof`` works on every supported release (``.ci/compat``: torch 2.4 to
2.14, transformers 4.46 to 5.24).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import os
import re
import sys
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.nn.modules import activation
from torch.utils import _python_dispatch as pd
from torch.utils._python_dispatch import TorchDispatchMode

from modelprof.errors import ModelProfError

__all__ = [
    "storage_identity",
    "cache_argument",
    "CACHE_ARGUMENTS",
    "cache_attributes",
    "cache_layer_tensors",
    "call_kwargs",
    "call_layout",
    "compile_in_place_like",
    "compiled_in_place",
    "compiled_like",
    "compiled_original",
    "cpu_sdpa_fuses_3d",
    "cuda_sleep",
    "fast_range",
    "fast_path_device_name",
    "finish_collective",
    "forget_global_hook",
    "GLOBAL_HOOKS_SEE_KWARGS",
    "profiler_events",
    "profiler_running",
    "current_autograd_node",
    "current_function_mode",
    "ddp_bucket_sizes",
    "decomposition_table",
    "default_mesh_on_cpu",
    "default_store",
    "dispatch_stack_state",
    "DTENSOR_MODULES",
    "eager_calls",
    "eager_flex_attention",
    "fake_store",
    "FakeTensor",
    "FakeTensorMode",
    "forget_dynamo_skips",
    "FSDP2_PUBLIC",
    "fsdp_module_class",
    "fsdp_param_group",
    "fully_shard",
    "function_stack",
    "getitem_to_index",
    "group_named",
    "has_composite_kernel",
    "HigherOrderOperator",
    "is_checkpoint_node",
    "is_dtensor_class",
    "is_fake",
    "is_module_cache",
    "local_tensor",
    "meta_autocast",
    "meta_failure_hint",
    "mask_optional",
    "meta_mask_dropped",
    "mha_device_check",
    "module_stack_type_name",
    "new_encoder_decoder_cache",
    "new_hf_cache",
    "next_sequence_nr",
    "node_sequence_nr",
    "oom_errors",
    "op_schema",
    "overload_name",
    "OpOverload",
    "OpOverloadPacket",
    "optional_ops",
    "output_cache",
    "PLAIN_TENSOR_TYPES",
    "queue_backward_callback",
    "reparametrized",
    "require",
    "restore_dispatch_stack",
    "set_mha_device_check",
    "set_fast_path_device_name",
    "STATIC_CACHE_REWINDS",
    "static_cache_per_run",
    "tensor_version",
    "tensor_versions",
    "torch_version",
    "TORCHSTAT_NORM",
    "TORCHSTAT_POOLS",
    "TorchDispatchMode",
    "transformers_version",
    "version_tuple",
    "view_base",
    "wait_functional_collective",
]


def version_tuple(text: str) -> tuple[int, ...]:
    """``"2.4.1+cu121"`` -> ``(2, 4, 1)``; ``"5.0.0rc1"`` -> ``(5, 0, 0)``."""
    pieces = text.split("+")[0].split(".")[:3]
    return tuple(int(re.match(r"\d*", piece).group() or 0) for piece in pieces)  # leading digits


def torch_version() -> tuple[int, ...]:
    return version_tuple(torch.__version__)


@functools.lru_cache(maxsize=1)
def transformers_version() -> tuple[int, ...] | None:
    """The installed transformers' version from its metadata (not imported), None if absent."""
    from importlib import metadata

    try:
        return version_tuple(metadata.version("transformers"))
    except metadata.PackageNotFoundError:
        return None


def require(feature: str, package: str, needed: tuple[int, ...]) -> None:
    """Raise :class:`ModelProfError` when ``package`` is older than ``needed`` for ``feature``."""
    have = torch_version() if package == "torch" else transformers_version()
    if have is not None and have >= needed:
        return
    want = ".".join(map(str, needed))
    raise ModelProfError(
        f"{feature} needs {package} >= {want}"
        + (
            f", which is not installed (pip install '{package}>={want}')"
            if have is None
            else f"; {package} {'.'.join(map(str, have))} is installed"
        )
    )


# -- torch: private classes and functions --------------------------------------------------------
# (the private classes imported above: present under these names in torch 2.4, 2.6, 2.11, 2.14)


def is_fake(t: torch.Tensor) -> bool:
    """A fake, functional or fake-wrapping tensor: no values to read. torch 2.4-2.14."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake
    from torch._subclasses.functional_tensor import FunctionalTensor

    return bool(_is_fake(t)) or isinstance(t, FunctionalTensor)


def getitem_to_index() -> Any:
    """The context in which ``flex_attention``'s score functions run eagerly on 0-d tensors;
    torch 2.5-2.14: ``torch._dynamo._trace_wrapped_higher_order_op`` (2.4 lacks both)."""
    try:
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    except ImportError:
        require("flex_attention's score functions", "torch", (2, 5))
        raise
    return TransformGetItemToIndex()


# the flags a dispatch mode sets on entry and puts back on exit (the third from torch 2.8)
_MODE_FLAGS = (
    "_is_in_torch_dispatch_mode",
    "_is_in_non_infra_torch_dispatch_mode",
    "_is_in_any_mode_without_ignore_compile_internals",
)


def dispatch_stack_state() -> tuple[int, dict[str, Any]]:
    """The depth of torch's dispatch-mode stack and its mode flags."""
    return (
        len(pd._get_current_dispatch_mode_stack()),
        {name: getattr(pd, name) for name in _MODE_FLAGS if hasattr(pd, name)},
    )


def restore_dispatch_stack(depth: int, flags: dict[str, Any]) -> None:
    """Pop every dispatch mode above ``depth`` and put torch's mode flags back."""
    while len(pd._get_current_dispatch_mode_stack()) > depth:
        pd._pop_mode()
    for name, value in flags.items():
        setattr(pd, name, value)
    setter = getattr(pd, "set_is_in_mode_without_ignore_compile_internals", None)
    name = "_is_in_any_mode_without_ignore_compile_internals"
    if setter is not None and name in flags:
        setter(flags[name])


def forget_dynamo_skips() -> int:
    """Reset dynamo's state of every code object in ``torch/_higher_order_ops`` it has met; the
    number reset. ``torch.cond`` and kin run through ``torch.compile`` of a wrapper, whose frame
    dynamo declines under a dispatch mode and, on torch 2.11.0 (not 2.14.1), keeps declining:
    later eager calls fail. Private: ``convert_frame.input_codes``, ``eval_frame.reset_code``."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    hops = sys.modules.get("torch._higher_order_ops")
    seen = getattr(getattr(convert_frame, "input_codes", None), "seen", None)
    if not seen or hops is None:
        return 0
    hop_dir = os.path.dirname(hops.__file__) + os.sep
    try:  # a torch without dynamo's C hooks
        from torch._C._dynamo.eval_frame import reset_code
    except ImportError:
        return 0
    codes = [
        c
        for c in (ref() for ref in list(seen))
        if c is not None and c.co_filename.startswith(hop_dir)
    ]
    for code in codes:
        reset_code(code)
    return len(codes)


@functools.lru_cache(maxsize=1)
def cpu_sdpa_fuses_3d() -> bool:
    """Whether the CPU's fused SDPA kernel takes unbatched (3-D) query, key and value: torch 2.14
    does; 2.11 runs them through the math decomposition ("All fused kernels requires query, key
    and value to be 4 dimensional"). Asked of torch's own choice (``torch._fused_sdp_choice``,
    private; checked on 2.11 and 2.14) on tiny CPU tensors, with flash and math allowed and no
    mode of the caller's (a counter, a fake or meta context) in the way."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes(), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
            q = torch.zeros(1, 1, 8, device="cpu")
            return torch._fused_sdp_choice(q, q, q) == int(SDPBackend.FLASH_ATTENTION)
    except Exception:  # a release without the chooser: counted as the math path
        return False


def mha_device_check() -> Any:
    """``nn.MultiheadAttention``'s fast-path device test (``activation._check_arg_device``,
    torch 2.4-2.14), which the meta count lets meta pass."""
    return activation._check_arg_device


def set_mha_device_check(check: Any) -> None:
    """Put ``check`` in place of the fast path's device test (and the original back)."""
    activation._check_arg_device = check


def fast_path_device_name() -> str | None:
    """The device type the eval fast paths of ``nn.TransformerEncoderLayer`` and
    ``nn.TransformerEncoder`` (and ``nn.MultiheadAttention``'s device test) take beside the CPU
    and CUDA: ``torch.utils.backend_registration._privateuse1_backend_name`` (private), read
    from the module at each call; checked on torch 2.14. None on a release without the name (the
    meta count then keeps the slow path there)."""
    from torch.utils import backend_registration

    return getattr(backend_registration, "_privateuse1_backend_name", None)


def set_fast_path_device_name(name: str) -> None:
    """Put ``name`` in place of that device type (and the original back); a release without
    the name is left as it is."""
    from torch.utils import backend_registration

    if hasattr(backend_registration, "_privateuse1_backend_name"):
        backend_registration._privateuse1_backend_name = name


def current_function_mode() -> Any:
    """The innermost torch-function mode (None when none), torch 2.4-2.14."""
    return torch.overrides._get_current_function_mode()


def next_sequence_nr() -> int:
    """The sequence number of this thread's next autograd node; torch 2.4-2.14."""
    return torch.autograd._get_sequence_nr()


def node_sequence_nr(node: Any) -> int:
    """An autograd node's creation order in its thread; torch 2.4-2.14."""
    return node._sequence_nr()


def reparametrized(
    module: torch.nn.Module, state: dict[str, torch.Tensor]
) -> contextlib.AbstractContextManager:
    """``module`` running on ``state`` (its parameters and buffers by name, tied ones kept tied)
    for the block: ``torch.func.functional_call``'s swap held open past the call, so that a
    reentrant checkpoint's recomputation in the backward runs on ``state`` too; torch 2.4-2.14."""
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, state, tie_weights=True, strict=False)


def queue_backward_callback(fn: Any) -> None:
    """Run ``fn`` when the running backward finishes, after every node; torch 2.4-2.14."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def cuda_sleep(cycles: int) -> None:
    """Keep the current GPU busy ``cycles`` clock cycles; torch 2.4-2.14."""
    torch.cuda._sleep(cycles)


_GLOBAL_HOOK = inspect.signature(torch.nn.modules.module.register_module_forward_hook).parameters
#: global forward hooks take ``with_kwargs=`` and ``always_call=`` (see the call's kwargs, run
#: when the forward raises): torch 2.6-2.14; 2.4-2.5 neither
GLOBAL_HOOKS_SEE_KWARGS = "with_kwargs" in _GLOBAL_HOOK and "always_call" in _GLOBAL_HOOK


def forget_global_hook(handle: Any) -> None:
    """Drop a removed global forward hook from the ``with_kwargs`` registry, which
    ``RemovableHandle.remove`` leaves behind (torch 2.6-2.14; none before)."""
    getattr(torch.nn.modules.module, "_global_forward_hooks_with_kwargs", {}).pop(handle.id, None)


def _call_frames(error: BaseException) -> Iterator[Any]:
    """The frames of ``Module._call_impl`` in the traceback of ``error``, outermost first:
    torch 2.4-2.14."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_call_impl":
            yield tb.tb_frame
        tb = tb.tb_next


def call_kwargs(error: BaseException, module: Any) -> dict[str, Any]:
    """The keyword arguments ``module`` was called with, read from the frame of its
    ``Module._call_impl`` in the traceback of ``error`` raised inside it (an always-call forward
    hook is not given them when the forward raises); {} where none is found."""
    found = {}
    for frame in _call_frames(error):  # outermost first: the innermost call of ``module`` wins
        if frame.f_locals.get("self") is module:
            found = frame.f_locals.get("kwargs") or {}
    return found if isinstance(found, dict) else {}


def innermost_call(error: BaseException) -> Any:
    """The module whose call ``error`` was raised in, innermost (its forward, or a hook its
    ``Module._call_impl`` ran); None outside any."""
    frames = list(_call_frames(error))
    return frames[-1].f_locals.get("self") if frames else None


def fast_range(name: str) -> Any:
    """A profiler range named ``name``, as cheap as torch offers: ``_RecordFunctionFast``
    (torch 2.4-2.14, about 1 us with the profiler off against ``record_function``'s 8)."""
    return torch._C._profiler._RecordFunctionFast(name)


def profiler_running() -> bool:
    """Whether a profiler session is on (a second would cancel it); torch 2.4-2.14."""
    return bool(torch._C._autograd._profiler_enabled())


def profiler_events(prof: Any) -> list:
    """The raw kineto events of a finished ``torch.profiler.profile``; a GPU event's
    ``device_resource_id()`` is its stream and ``linked_correlation_id()`` the correlation id of
    the CPU op that launched it (0 on CPU ops). torch 2.4-2.14."""
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    return list(results.events()) if results is not None else []


def wait_functional_collective(t: torch.Tensor) -> torch.Tensor:
    """Wait for a functional collective's output (any other tensor as it is); torch 2.4-2.14."""
    return torch.ops._c10d_functional.wait_tensor(t)


@functools.cache
def _async_collective_tensor() -> type | None:
    try:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
    except ImportError:  # a build without torch.distributed
        return None
    return AsyncCollectiveTensor


def finish_collective(t: torch.Tensor) -> None:
    """Wait for the collective that ``t`` still waits for: a functional collective's output (an
    ``AsyncCollectiveTensor``, also as a DTensor's local tensor: a tensor-parallel layer's
    all-reduce returns one before its data has moved), marked done so that no later use waits
    again; any other tensor as it is. torch 2.4-2.14 (``trigger_wait``)."""
    act = _async_collective_tensor()
    t = local_tensor(t)
    if act is not None and isinstance(t, act):
        t.trigger_wait()


def is_checkpoint_node(node: Any) -> bool:
    """Whether ``node`` is a reentrant checkpoint's (``torch.utils.checkpoint`` with
    ``use_reentrant=True``: its ``CheckpointFunction``'s backward, which runs the function
    again); torch 2.4-2.14."""
    return type(node).__name__ == "CheckpointFunctionBackward"


def current_autograd_node() -> Any:
    """The autograd node whose backward runs in this thread (None outside one); torch 2.4-2.14."""
    return torch._C._current_autograd_node()


def has_composite_kernel(op: OpOverload) -> bool:
    """Whether ``op`` has a ``CompositeImplicitAutograd`` kernel; torch 2.4-2.14. An op the
    dispatcher does not know (2.11's ``aten.dim`` from a jagged nested tensor) has none."""
    try:
        return bool(
            torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
        )
    except RuntimeError as e:
        if "does not exist" in str(e):
            return False
        raise


def decomposition_table() -> dict:
    """torch's table of Python decompositions (``torch._decomp``), torch 2.4-2.14."""
    from torch._decomp import decomposition_table as table

    return table


#: the torch-function mode stack, ``length()``, ``pop()`` and ``push(mode)`` (torch 2.4-2.14)
function_stack = types.SimpleNamespace(
    length=torch._C._len_torch_function_stack,
    pop=torch._C._pop_torch_function_stack,
    push=torch._C._push_on_torch_function_stack,
)


#: the classes of a plain tensor (no subclass): a parameter, and ``nn.Buffer`` from torch 2.5
PLAIN_TENSOR_TYPES: tuple[type, ...] = (torch.Tensor, torch.nn.Parameter) + (
    (torch.nn.Buffer,) if hasattr(torch.nn, "Buffer") else ()
)


def call_layout(program: Any) -> tuple[list[int], list[tuple[str, int]]] | None:
    """How an ``ExportedProgram`` is called, from its call spec's input tree ``(args, kwargs)``:
    the leaves (tensors) of each positional argument, and each keyword argument's name with
    its leaves; None where the tree is not so. Reads ``TreeSpec``'s fields (``type``,
    ``context``, ``num_leaves``, and its children: ``children()`` where it has it, 2.14
    deprecating ``children_specs``; ``torch.utils._pytree``; 2.4-2.14)."""
    spec = getattr(getattr(program, "call_spec", None), "in_spec", None)
    try:
        args, kwargs = _tree_children(spec)
        if args.type is not tuple or kwargs.type is not dict:
            return None
        return [c.num_leaves for c in _tree_children(args)], [
            (str(k), c.num_leaves) for k, c in zip(kwargs.context, _tree_children(kwargs))
        ]
    except (AttributeError, TypeError, ValueError):  # no spec, or another tree
        return None


def dim_range(program: Any, dim: Any) -> tuple[int, int | None] | None:
    """The sizes an ``ExportedProgram`` takes at a dynamic dimension (a ``SymInt`` of a
    placeholder's recorded value): ``(low, high)``, ``high`` None where unbounded, from its
    ``range_constraints`` (keyed by the symbol, ``SymInt.node.expr``; unbounded: an infinity,
    no sympy Integer; 2.4-2.14); None where the dimension is an expression they do not key."""
    bounds = program.range_constraints.get(getattr(getattr(dim, "node", None), "expr", None))
    if bounds is None:
        return None
    high = bounds.upper  # unbounded: int_oo, no sympy Integer (2.4: sys.maxsize - 1)
    return int(bounds.lower), int(high) if high.is_Integer and high < sys.maxsize - 1 else None


def _tree_children(spec: Any) -> list[Any]:
    """A ``TreeSpec``'s child specs."""
    children = getattr(spec, "children", None)
    return list(children() if callable(children) else spec.children_specs)


def module_stack_type_name(kind: Any) -> str:
    """The class name in a node's ``nn_module_stack`` (a class or a name, both in 2.4-2.14)."""
    return kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1]


@functools.lru_cache(maxsize=1)
def meta_autocast() -> bool:
    """Whether this torch enters ``torch.autocast("meta")`` (transformers' rotary embeddings
    do): 2.4 and 2.6 raise "unsupported scalarType" (pytorch#130067), 2.11 and 2.14 enter."""
    try:
        with torch.autocast("meta", enabled=False):
            return True
    except RuntimeError:
        return False


def meta_failure_hint(error: BaseException, device: torch.device) -> str:
    """Why a forward failed on meta when this torch cannot enter autocast there, else ""."""
    if device.type != "meta" or meta_autocast() or "unsupported scalarType" not in str(error):
        return ""
    return (
        f" (torch {torch.__version__} cannot enter torch.autocast on the meta device, "
        "which this model's code does: count it on device='meta' with a newer torch "
        "(2.11 does), or on the CPU)"
    )


def optional_ops(*names: str, namespace: str = "aten") -> list:
    """The ops among ``names`` that exist in the running torch (they vary between releases)."""
    ns = getattr(torch.ops, namespace)
    found = []
    for n in names:
        try:
            found.append(getattr(ns, n))
        except (AttributeError, RuntimeError):
            continue
    return found


# -- torch.compile: the module it returns ------------------------------------------------------
def compiled_original(module: Any) -> torch.nn.Module | None:
    """The module that ``torch.compile(module)`` wraps (an ``OptimizedModule``'s ``_orig_mod``),
    None for anything else. Checked on torch 2.4-2.14 (``torch._dynamo.eval_frame``; not
    imported here: where dynamo was never loaded, nothing was compiled)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    if wrapper is None or not isinstance(module, wrapper):
        return None
    return module._orig_mod


def compiled_like(compiled: torch.nn.Module, module: torch.nn.Module) -> torch.nn.Module:
    """``module`` compiled as ``compiled`` (a ``torch.compile``'d module) is: the same backend,
    mode and options (its ``dynamo_ctx``), for a copy of its original to run as the user's
    runs. Checked on torch 2.4-2.14 (``OptimizedModule(mod, dynamo_ctx)``)."""
    if compiled_original(compiled) is None:
        raise TypeError(f"{type(compiled).__name__} is not a torch.compile'd module")
    return type(compiled)(module, compiled.dynamo_ctx)


def compiled_in_place(module: Any) -> bool:
    """Whether ``module.compile()`` compiled ``module``'s call in place (its
    ``_compiled_call_impl``, which ``Module.__call__`` runs instead of ``_call_impl``, hooks
    included, a dynamo wrapper: ``_torchdynamo_orig_callable``; not with ``disable=True``).
    Checked on torch 2.4-2.14."""
    if not isinstance(module, torch.nn.Module):
        return False
    impl = module.__dict__.get("_compiled_call_impl")
    # dynamo's wrapper keeps what it wraps; ``compile(disable=True)`` leaves the bound
    # ``_call_impl`` itself, which runs eager
    return impl is not None and hasattr(impl, "_torchdynamo_orig_callable")


def compile_in_place_like(compiled: torch.nn.Module, module: torch.nn.Module) -> None:
    """Compile ``module``'s call in place as ``module.compile()`` compiled ``compiled``'s (the
    same backend, mode and options): a copy of it (``copy.deepcopy`` drops the compiled call;
    ``Module.__getstate__``) runs as the user's does. The dynamo context is the compiled call's
    closure variable ``self`` (torch 2.4-2.14); where a release has none, ``ModelProfError``."""
    impl = compiled.__dict__.get("_compiled_call_impl")
    code, cells = getattr(impl, "__code__", None), getattr(impl, "__closure__", None) or ()
    names = code.co_freevars if code is not None else ()
    context = cells[names.index("self")].cell_contents if "self" in names else None
    if not callable(context):
        raise ModelProfError(
            f"cannot compile a copy of {type(compiled).__name__} as module.compile() compiled "
            f"it (torch {torch.__version__} keeps its options where modelprof does not look): "
            "pass torch.compile(module) instead, or profile the module as it is"
        )
    module._compiled_call_impl = context(module._call_impl)


@contextlib.contextmanager
def eager_calls(modules: Any) -> Iterator[None]:
    """In the block, each of ``modules`` compiled in place (``module.compile()``) runs its eager
    call, where hooks fire and are not traced; its compiled call put back after."""
    saved = [(m, m.__dict__["_compiled_call_impl"]) for m in modules if compiled_in_place(m)]
    for m, _ in saved:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, impl in saved:
            m._compiled_call_impl = impl


# -- torch.distributed: FSDP2 and DTensor moved out of _composable / _tensor in torch 2.6 -------
#: FSDP2 is public from torch 2.6; on 2.4 a sharded profile fails (its parameters read as lazy)
FSDP2_PUBLIC = (2, 6)


def _fsdp2(name: str) -> Any:
    """A name of FSDP2's, in ``_composable.fsdp`` before torch 2.6 (checked on 2.4, 2.14)."""
    import torch.distributed.fsdp as public

    if hasattr(public, name):
        return getattr(public, name)
    from torch.distributed._composable import fsdp as composable  # torch < 2.6

    return getattr(composable, name)


def fsdp_module_class() -> type:
    """FSDP2's ``FSDPModule``."""
    return _fsdp2("FSDPModule")


def fully_shard(module: torch.nn.Module, **kwargs: Any) -> Any:
    """FSDP2's ``fully_shard``."""
    return _fsdp2("fully_shard")(module, **kwargs)


# -- errors and switches -------------------------------------------------------------------------
def oom_errors() -> tuple[type[BaseException], ...]:
    """torch's allocation failures (``torch.OutOfMemoryError`` from 2.5; checked on 2.4, 2.14)."""
    kinds = [getattr(module, "OutOfMemoryError", None) for module in (torch, torch.cuda)]
    return tuple(k for k in kinds if isinstance(k, type))


def eager_flex_attention(value: Any) -> Any:
    """Set the switch that makes ``flex_attention`` skip its internal ``torch.compile`` (which
    refuses a dispatch mode); returns the previous value, None where there is no switch (torch
    < 2.5; checked on 2.4 and 2.14)."""
    try:
        import torch.nn.attention.flex_attention as fa
    except ImportError:  # torch without flex_attention
        return None
    if not hasattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG") or value is None:
        return None
    previous = fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = value
    return previous


# -- torch.distributed: private names of the store, DTensor, FSDP2's state and DDP's reducer ----
# (each checked on torch 2.4 and 2.14)
def default_store() -> Any:
    """The default process group's key-value store (``distributed_c10d._get_default_store``)."""
    return dist.distributed_c10d._get_default_store()


def group_named(name: str) -> Any:
    """The process group an op's ``group_name`` argument names."""
    return dist.distributed_c10d._resolve_process_group(name)


def fake_store() -> Any:
    """A store for the in-process ``"fake"`` backend (``torch.testing._internal``)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def storage_identity(t: torch.Tensor) -> tuple[int, int]:
    """The identity of the memory ``t`` keeps alive (its storage object's address: meta
    included, where a data pointer is 0) and its bytes; without a storage, its own id and
    elements. Checked on torch 2.4-2.14 (``StorageBase._cdata``)."""
    try:
        storage = t.untyped_storage()
        return storage._cdata, storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return id(t), t.numel() * t.element_size()


def tensor_version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (each in-place write adds one; autograd refuses a backward that
    reads a saved tensor written since), None for an inference tensor, which has none.
    Checked on torch 2.4-2.14 (``Tensor._version``)."""
    try:
        return t._version
    except RuntimeError:
        return None


_VERSION = operator.attrgetter("_version")


def tensor_versions(ts: list[torch.Tensor]) -> list[int | None]:
    """:func:`tensor_version` of each tensor, read all at once (``map`` over the C getter) where
    none is an inference tensor."""
    try:
        return list(map(_VERSION, ts))
    except RuntimeError:  # "Inference tensors do not track version counter"
        return list(map(tensor_version, ts))


def op_schema(func: OpOverload) -> Any:
    """``func``'s schema: its name (``"aten::addmm_"``) and arguments (types, alias info).
    Checked on torch 2.4-2.14 (``OpOverload._schema``)."""
    return func._schema


def overload_name(func: OpOverload) -> str:
    """``func``'s overload in its packet (``"default"``, ``"Tensor"``). Checked on torch
    2.4-2.14 (``OpOverload._overloadname``)."""
    return func._overloadname


#: the classes torchstat's formulas are registered on: every batch norm (``_NormBase``), every
#: pooling layer. Checked on torch 2.4-2.14 (``torch.nn.modules.batchnorm``/``pooling``).
TORCHSTAT_NORM = torch.nn.modules.batchnorm._NormBase
TORCHSTAT_POOLS = (
    torch.nn.modules.pooling._MaxPoolNd,
    torch.nn.modules.pooling._AvgPoolNd,
    torch.nn.modules.pooling._AdaptiveAvgPoolNd,
    torch.nn.modules.pooling._AdaptiveMaxPoolNd,
)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, without the autograd of ``to_local()``; any other tensor."""
    return getattr(t, "_local_tensor", t)


def view_base(t: torch.Tensor) -> torch.Tensor | None:
    """The tensor ``t`` is a view of (a linear layer's ``weight.t()``: the weight), None for
    one that is no view. Checked on torch 2.14 (``Tensor._base``, older than 2.4)."""
    return t._base


def fsdp_param_group(module: torch.nn.Module) -> Any:
    """A ``fully_shard``-ed module's parameter group (``None`` for one that owns none)."""
    return module._get_fsdp_state()._fsdp_param_group


def ddp_bucket_sizes(model: torch.nn.Module) -> list[int]:
    """The bytes of each gradient bucket of a DDP model's reducer, as DDP logs them."""
    sizes = str(model._get_ddp_logging_data().get("bucket_sizes", "")).split(",")
    return [int(s) for s in sizes if s.strip().isdigit()]


@contextlib.contextmanager
def default_mesh_on_cpu() -> Iterator[None]:
    """Inside the block, ``fully_shard`` without a ``mesh`` shards over a CPU mesh: the
    accelerator probes FSDP2 asks (``torch._C._get_accelerator()`` on 2.11-2.14, earlier
    ``torch.cuda.is_available()``) answer "cpu"."""
    with contextlib.ExitStack() as patched:
        patched.enter_context(mock.patch.object(torch.cuda, "is_available", lambda: False))
        if hasattr(torch._C, "_get_accelerator"):
            patched.enter_context(
                mock.patch.object(torch._C, "_get_accelerator", lambda: torch.device("cpu"))
            )
        yield


#: the modules DTensor is defined in (``torch.distributed._tensor`` before 2.5)
DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")


def is_dtensor_class(cls: type) -> bool:
    """Whether ``cls`` is DTensor itself (found without importing torch.distributed)."""
    return cls.__name__ == "DTensor" and cls.__module__.startswith(DTENSOR_MODULES)


# -- transformers: the cache argument, its output and its classes ------------------------------
#: a causal LM's cache argument and output field: ``past_key_values`` up to transformers 5.23,
#: ``cache`` from 5.24 on (checked on 4.46, 4.56, 5.17, 5.23, 5.24); a state-space model's
#: (Mamba, Mamba2, FalconMamba) ``cache_params`` before the same rename (checked on 5.17, where
#: it is already a ``DynamicCache`` of recurrent layers, and 5.24). Tried in this order.
CACHE_ARGUMENTS = ("cache", "past_key_values", "cache_params")


def cache_argument(forward: Any) -> str | None:
    """The name under which ``forward`` takes a KV cache, from its signature; None if none."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in CACHE_ARGUMENTS if name in params), None)


def output_cache(out: Any) -> Any:
    """The cache a model's output carries (under either name), None when it has none."""
    found = (getattr(out, name, None) for name in CACHE_ARGUMENTS)
    return next((value for value in found if value is not None), None)


def new_hf_cache(
    kind: str, config: Any, batch_size: int, max_len: int, device: torch.device, dtype: torch.dtype
) -> Any:
    """An empty cache (``kind`` "dynamic" or "static") for ``config``: ``DynamicCache(config=)``
    from 4.56, ``StaticCache``'s size, device, dtype up to 4.55. Checked on 4.46-5.24."""
    import transformers

    cls = transformers.StaticCache if kind == "static" else transformers.DynamicCache
    params = inspect.signature(cls.__init__).parameters
    wanted: dict[str, Any] = {"config": config}
    if kind == "static":
        wanted.update(max_batch_size=batch_size, device=device, dtype=dtype)
    kw = {name: value for name, value in wanted.items() if name in params}
    if kind == "static":
        kw["max_cache_len"] = max_len
    return cls(**kw)


def new_encoder_decoder_cache() -> Any:
    """An empty ``EncoderDecoderCache`` of two dynamic caches. Not from the config: in 5.24 a T5
    decoder config reports the encoder's layer count; 4.46 takes none. Checked on 4.46, 5.24."""
    import transformers

    return transformers.EncoderDecoderCache(
        transformers.DynamicCache(), transformers.DynamicCache()
    )


def cache_attributes(cache: Any) -> dict[str, Any]:
    """The attributes of a cache object, the caches it holds among them (up to 4.46 a ``Cache``
    is an ``nn.Module`` and keeps them in ``_modules``). Checked on 4.46 and 5.24."""
    attrs = dict(getattr(cache, "__dict__", None) or {})
    if isinstance(cache, torch.nn.Module):
        attrs.update(attrs.pop("_modules", None) or {})
    return attrs


def is_module_cache(o: Any) -> bool:
    """Whether ``o`` is a ``Cache`` that is an ``nn.Module`` (up to 4.46): the user's data."""
    return isinstance(o, torch.nn.Module) and any(
        c.__name__ == "Cache" and c.__module__.startswith("transformers") for c in type(o).__mro__
    )


#: from this release a StaticCache keeps a ``cumulative_length`` per layer to put back
STATIC_CACHE_REWINDS = (4, 56)

#: what ``generate()`` keeps on a model to size a later call's static cache: the cache itself,
#: reused while it is large enough (``_cache``, 4.56), the largest length yet
#: (``_previous_max_cache_length``, 5.24)
_GENERATE_CACHE_STATE = ("_cache", "_previous_max_cache_length")


@contextlib.contextmanager
def static_cache_per_run(model: Any) -> Iterator[None]:
    """``generate()``'s static cache sized by the calls in the block alone (``max_length - 1``
    each, and the largest of them): what earlier calls on ``model`` left to size it from set
    aside meanwhile, and put back after (what the block's calls left, dropped). Checked on 4.56
    and 5.24; up to 4.46 a ``Cache`` is an ``nn.Module`` (:func:`is_module_cache`), which the
    model keeps among its ``_modules``: set aside from there too."""
    places = [getattr(model, "__dict__", {})]
    if isinstance(places[0].get("_modules"), dict):
        places.append(places[0]["_modules"])
    kept = [{k: d.pop(k) for k in _GENERATE_CACHE_STATE if k in d} for d in places]
    try:
        yield
    finally:
        for d, was in zip(places, kept):
            for k in _GENERATE_CACHE_STATE:
                d.pop(k, None)
            d.update(was)


def cache_layer_tensors(cache: Any) -> list[list[torch.Tensor]] | None:
    """Per layer, the tensors of a cache with ``key_cache`` lists (up to 4.55; checked on 4.46)."""
    keys, values = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if getattr(cache, "layers", None) is not None or not (
        isinstance(keys, list) and isinstance(values, list)
    ):
        return None
    return [
        [t for t in (k, v) if isinstance(t, torch.Tensor) and t.numel() > 1]
        for k, v in zip(keys, values)
    ]


def mask_optional(model: Any) -> bool:
    """Whether ``model`` is a transformers model whose forward takes no ``attention_mask`` as
    all ones: one with a ``config`` whose forward's ``attention_mask`` has a default (a model
    of one's own that keeps a config and requires a mask is not). Checked on transformers
    4.46, 5.17 and 5.24."""
    if not hasattr(model, "config"):
        return False
    try:
        mask = inspect.signature(model.forward).parameters.get("attention_mask")
    except (TypeError, ValueError):
        return False
    return mask is not None and mask.default is not inspect.Parameter.empty


def meta_mask_dropped(
    model: Any, kwargs: dict[str, Any], device: torch.device
) -> tuple[dict[str, Any], str | None]:
    """Keyword inputs for a transformers model counted on meta, and the note: an all-ones
    ``attention_mask`` (whose values transformers reads) means no mask, so it is left out
    (:func:`mask_optional`). Checked on transformers 4.46, 5.17 and 5.24."""
    mask = kwargs.get("attention_mask")
    if (
        device.type != "meta"
        or not isinstance(mask, torch.Tensor)
        or mask.device.type == "meta"
        or not mask_optional(model)
        or not bool((mask == 1).all())
    ):
        return kwargs, None
    kept = {k: v for k, v in kwargs.items() if k != "attention_mask"}
    return kept, (
        "attention_mask (all ones) left out on device='meta': transformers reads a "
        "mask's values, which meta tensors do not have, and treats no mask as all ones"
    )
