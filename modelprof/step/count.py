"""The training step, counted: one forward (grad on), the loss and the backward, every op charged
to a module call, and the optimizer's step.

The forward is charged as in the static pass; its module hooks also note autograd's sequence
numbers (``autograd_scope``), so that every op the backward runs is charged, by the same
``OpCounter``, to the call whose forward created the autograd node running it. The loss is charged
to a ``(loss)`` entry, the optimizer's step to an ``(optimizer)`` one (``formulas/optim.py``).
``saved_tensors_hooks`` charge the bytes autograd keeps for the backward to the call that saved
them (each storage once; parameters and buffers not counted).

The user's model, inputs and optimizer are never touched: the pass runs on aliases (``.grad``
lands on the alias), held in the model until its backward is done (a reentrant checkpoint runs
the forward again there: ``Recomputed`` tags what it makes), and under a forked RNG.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from modelprof.counting.collectives import add_collective, ddp_gradient_collectives, merge_comm
from modelprof.counting.counter import FixedScope, OpCounter, OpStats
from modelprof.counting.formulas.optim import OptimizerCost, optimizer_cost
from modelprof.counting.formulas.quantized import module_packed_weights
from modelprof.counting.formulas.registry import FormulaRegistry
from modelprof.counting.forward import (
    StaticResult,
    counted_module,
    forward_error,
    meta_attention,
    refuse_lazy,
)
from modelprof.counting.scope import CallRecord, Tracker
from modelprof.counting.sharding import ParamView, held
from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.compiled import eager_view
from modelprof.runtime.device import MemoryStats, same_device
from modelprof.runtime.execution import RunMode, amp_context, random_kept, running
from modelprof.runtime.failure import refused_as
from modelprof.runtime.group import communicates, is_ddp
from modelprof.runtime.guard import preserved_state
from modelprof.runtime.hooks import module_hooks, module_names
from modelprof.runtime.inputs import ModelInputs
from modelprof.runtime.placement import model_placement, refuse_valueless, to_placement
from modelprof.runtime.tensors import iter_tensors, map_tensors, tensor_shape
from modelprof.step.autograd_scope import LOSS, NodeTags, Recomputed, SeqMarks, tag_graph
from modelprof.step.optimizer_state import scalar_state_bytes
from modelprof.step.spec import StepSpec

__all__ = [
    "BackwardScope",
    "PassCost",
    "SavedBytes",
    "StepCost",
    "add_pass",
    "backward_of",
    "count_step",
    "failing_nodes",
    "grad_leaves",
    "move_target",
    "step_guard",
    "step_state",
    "trainable_check",
]


@dataclasses.dataclass(slots=True)
class PassCost:
    """One call's share of a pass (the fields ``OpCounter`` charges into)."""

    macs: int = 0
    flops: int = 0
    madd: int = 0
    op_read_bytes: int = 0
    op_write_bytes: int = 0
    collect_op_bytes: bool = False
    ops: dict[str, int] = dataclasses.field(default_factory=dict)  # FLOPs by op
    comm: dict | None = None  # collectives: (kind, group size) -> CommStats


@dataclasses.dataclass(eq=False)
class StepCost:
    """What the step costs beyond the forward records: per call record (exclusive, by index)
    the backward and the saved-tensor bytes; the loss's forward and backward; the optimizer."""

    backward: list[PassCost]
    saved_bytes: list[int]
    loss_forward: PassCost
    loss_backward: PassCost
    loss_saved_bytes: int
    loss_name: str
    loss_input_shapes: list[tuple[int, ...]]
    loss_output_bytes: int
    optimizer: OptimizerCost | None
    by_op: dict[str, OpStats]  # the backward's ops (the loss's included)
    loss_by_op: dict[str, OpStats]  # the loss's forward ops
    unsupported: Counter  # ops with no formula: loss, backward, optimizer
    owning_calls: set[int]  # calls that own a backward node or saved bytes
    nodes: int  # autograd nodes in the graph
    # of ``backward``, per call record: what the backward ran with grad enabled, i.e. the
    # forward ops activation checkpointing ran again
    recompute: list[PassCost] = dataclasses.field(default_factory=list)
    #: the trainable parameters the counted backward gave no gradient: name -> id of the
    #: model's parameter (what the memory estimate leaves out of its gradients)
    ungraded: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def backward_macs(self) -> int:
        return sum(c.macs for c in self.backward) + self.loss_backward.macs

    @property
    def backward_flops(self) -> int:
        return sum(c.flops for c in self.backward) + self.loss_backward.flops


class _StepTracker(Tracker):
    """The static pass's tracker, also noting autograd's sequence number at each call boundary,
    and the calls run with grad off by the number they started at (``Recomputed``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks = SeqMarks()
        self.quiet: dict[tuple[int, int], list[int]] = {}

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        super().pre(module, args, kwargs)
        index = self.stack[-1].index
        self.marks.mark(index)
        Recomputed.note(self.quiet, module, index)

    def post(
        self, module: nn.Module, args: tuple, kwargs: dict, output: Any, raised: bool = False
    ) -> None:
        super().post(module, args, kwargs, output, raised)
        self.marks.mark(self.current.index)


class BackwardScope:
    """The cost entry of the call whose node autograd is running (``OpCounter``'s tracker).

    The engine runs the derivatives with grad off, so an op run with grad on is activation
    checkpointing's recomputation of the forward: it is charged to that call's ``recompute``
    entry."""

    def __init__(
        self, tags: NodeTags, costs: list[PassCost], loss: PassCost, recompute: list[PassCost]
    ) -> None:
        self.tags = tags
        self.costs = costs
        self.loss = loss
        self.recompute = recompute
        self.pending_params: dict[int, torch.Tensor] = {}
        self.last: int | None = None  # the call of the node that ran the latest op

    @property
    def current(self) -> PassCost:
        node = compat.current_autograd_node()
        if node is None:  # before the engine runs a node: the seed gradient of the loss
            return self.loss
        call = self.last = self.tags.call_of(node)
        if not 0 <= call < len(self.costs):  # the loss's (LOSS)
            return self.loss
        return self.recompute[call] if torch.is_grad_enabled() else self.costs[call]


class SavedBytes:
    """Bytes of the tensors autograd saves for the backward, charged to ``call()`` at the time;
    each storage once (a DTensor's as the view counts it: its local shard's per rank); not at
    all the storages in ``skip`` (parameters, buffers) nor a parameter or a view of one (FSDP2's
    unsharded parameter, gathered for the forward, is none of the model's parameters)."""

    def __init__(self, skip: set[int], call: Callable[[], int]) -> None:
        self.skip = skip
        self.call = call
        self.by_call: Counter[int] = Counter()
        self._seen: set[int] = set()

    def pack(self, t: torch.Tensor) -> tuple[torch.Tensor, int | None]:
        key, nbytes = compat.storage_identity(held(t))
        if key not in self._seen and key not in self.skip and not _is_parameter(t):
            self._seen.add(key)
            self.by_call[self.call()] += nbytes
        return t, compat.tensor_version(t)

    @staticmethod
    def unpack(packed: tuple[torch.Tensor, int | None]) -> torch.Tensor:
        """The saved tensor, refused as autograd refuses it without hooks (which skip that
        check) where it was written in place since it was saved: the step cannot run."""
        t, version = packed
        now = compat.tensor_version(t)
        if now != version:
            e = RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: a {tensor_shape(t)} {t.dtype} tensor is at version {now}; "
                f"expected version {version} instead (your own training step raises this too)"
            )
            e.autograd_node = compat.current_autograd_node()  # type: ignore[attr-defined]
            raise e
        return t

    def hooks(self) -> contextlib.AbstractContextManager:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _is_parameter(t: torch.Tensor) -> bool:
    """``t`` is a parameter or a view of one (a linear layer saves ``weight.t()``)."""
    return isinstance(t, nn.Parameter) or isinstance(compat.view_base(t), nn.Parameter)


def step_state(
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype | None,
    memory_format: torch.memory_format | None = None,
) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """Parameters (aliases needing grad as the originals; copies of inference tensors) and
    buffers (copies) to run ``model`` with, on ``device``/``dtype`` (4-D ones in
    ``memory_format``); and the map ``id(parameter) -> its alias``. Tied tensors stay tied."""
    model_device, model_dtype = model_placement(model)
    convert = not same_device(device, model_device) or (dtype is not None and dtype != model_dtype)
    if convert:
        refuse_valueless(model, device)
    done: dict[int, torch.Tensor] = {}

    def alias(t: torch.Tensor, param: bool) -> torch.Tensor:
        if id(t) not in done:
            cast = dtype if (dtype is not None and t.is_floating_point()) else None
            with torch.no_grad():
                if param:
                    new = t.to(device=device, dtype=cast) if convert else t
                    if memory_format is not None and new.dim() == 4:
                        new = new.contiguous(memory_format=memory_format)
                    # an inference tensor cannot require grad: a copy of it can
                    new = new.clone() if new.is_inference() else new.detach()
                    new.requires_grad_(t.requires_grad)
                else:
                    new = t.to(device=device, dtype=cast, copy=True)
            done[id(t)] = new
        return done[id(t)]

    state: dict[str, torch.Tensor] = {}
    copy_of: dict[int, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        state[name] = copy_of[id(p)] = alias(p, True)
    for name, b in model.named_buffers(remove_duplicate=False):
        state[name] = alias(b, False)
    return state, copy_of


def grad_leaves(obj: Any) -> Any:
    """``obj`` with every tensor that requires grad replaced by a detached leaf that does."""
    return map_tensors(obj, lambda t: t.detach().requires_grad_() if t.requires_grad else t)


def move_target(target: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """The target, detached (no gradient flows into data), on ``device``; floating tensors cast
    to ``dtype`` when one is asked for."""
    return map_tensors(target, lambda t: to_placement(t.detach(), device, dtype))


@contextlib.contextmanager
def step_guard(device: torch.device) -> Iterator[None]:
    """Grad on (also inside the caller's ``no_grad``/``inference_mode``), and the RNG of the
    CPU and of ``device``, Python's and numpy's, restored afterwards (:func:`random_kept`)."""
    with random_kept(device), torch.inference_mode(False), torch.enable_grad():
        yield


def trainable_check(model: nn.Module, inputs: Any = None, optimizer: str | None = None) -> None:
    """A ModelProfError unless some parameter of ``model`` (or, for a model without trainable
    parameters, some input) requires grad: else there is nothing to differentiate; with an
    ``optimizer`` (its name), unless some parameter does: it would step nothing (torch refuses
    an optimizer of no parameters)."""
    params = {id(p): p for p in model.parameters()}
    if any(p.requires_grad for p in params.values()):
        return
    if optimizer is not None and any(t.requires_grad for t in iter_tensors(inputs)):
        raise ModelProfError(
            f"optimizer={optimizer}: no parameter of {type(model).__name__} requires grad "
            f"({len(params)} parameter tensor(s), all frozen; only the inputs do), so the "
            "optimizer would step nothing; unfreeze some parameters or pass optimizer=None "
            "to profile the forward and backward alone"
        )
    if any(t.requires_grad for t in iter_tensors(inputs)):
        return
    packed = module_packed_weights(model)[0]
    what = (
        f"all {len(params)} of its parameters are frozen (requires_grad=False)"
        if params
        else f"its {packed:,} weights are packed quantized weights, which autograd does not "
        "train, and it has no nn.Parameter"
        if packed
        else "it has no parameters"
    )
    raise ModelProfError(
        f"model {type(model).__name__} has no parameter that requires grad "
        f"({what}) and no input does: there is no training step to profile; "
        "unfreeze some parameters or pass backward=False"
    )


def _model_params(model: nn.Module, view: Any) -> int:
    """Elements of the model's distinct parameters (its shards per rank, per ``view``)."""
    return sum(
        {id(p): p.numel() if view is None else view.count(p) for p in model.parameters()}.values()
    )


def _own_parameters(model: nn.Module, state: dict, copy_of: dict) -> tuple[dict, dict]:
    """For a DDP/FSDP2/DTensor model, ``state`` without the parameters and ``copy_of`` the
    identity: the step runs on the model's own parameters (FSDP2 would adopt an alias in a
    parameter slot as its sharded parameter; the caller's state guard puts .grad back)."""
    if not communicates(model):
        return state, copy_of
    own = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return (
        {k: v for k, v in state.items() if k not in own},
        {id(p): p for p in model.parameters()},
    )


def count_step(
    model: nn.Module,
    inputs: ModelInputs,
    spec: StepSpec,
    mode: RunMode = RunMode(training=True, no_grad=False),
    registry: FormulaRegistry | None = None,
) -> tuple[StaticResult, StepCost]:
    """Run one training step of ``model`` on ``inputs``, counting it; ``mode`` as the static
    pass's, with grad on. A DDP model's gradient all-reduce is counted from its reducer's
    buckets (``no_sync``: the counted backward never reaches the reducer)."""
    mode = dataclasses.replace(mode.on(inputs.device), no_grad=False)
    ddp = model if is_ddp(model) else None
    model = counted_module(model, inputs, mode.amp)
    lazy = nn.parameter.UninitializedParameter
    refuse_lazy([n for n, p in model.named_parameters() if isinstance(p, lazy)], "parameters")
    trainable_check(model, (inputs.args, inputs.kwargs), spec.optimizer_name)
    spec.check_optimizer(model)
    spec = spec.isolated()  # the loss's own parameters and buffers: a copy's
    # the forward's in-place writes of parameters (an Embedding(max_norm=)) reach the user's
    # storage through the aliases: the guard copies each such tensor before its first write
    with (
        ddp.no_sync() if ddp else contextlib.nullcontext(),
        eager_view(model) as model,  # compiled modules: their eager code, which hooks see
        preserved_state(model) as guard,
    ):
        static, cost = _count_step(model, inputs, spec, guard, mode, registry)
    _backward_comm(static.records, cost, ddp_gradient_collectives(ddp) if ddp else [])
    return static, cost


def _backward_comm(records: list[CallRecord], cost: StepCost, extra: list) -> None:
    """The backward's collectives onto the call records; those outside any module's node
    (FSDP2's final callback) and ``extra`` (DDP's all-reduce) on the root's record."""
    for record, call_cost in zip(records, cost.backward):
        record.backward_comm = call_cost.comm
    if not records:
        return
    loose, cost.loss_backward.comm = cost.loss_backward.comm, None
    if loose or extra:
        root = records[0]
        root.backward_comm = dict(root.backward_comm or {})
        merge_comm(root.backward_comm, loose or {})
        for c in extra:
            add_collective(root.backward_comm, c)


def _count_step(
    model: nn.Module,
    inputs: ModelInputs,
    spec: StepSpec,
    guard: Any,
    mode: RunMode,
    registry: FormulaRegistry | None,
) -> tuple[StaticResult, StepCost]:
    """``count_step``'s pass, its state guard held. The model runs on the step's state until
    its backward is done (a reentrant checkpoint runs the forward again there, its gradients
    for the aliases); an optimizer factory sees the model's own parameters."""
    names = module_names(model)
    tracker = _StepTracker(names, registry, memory_stats=MemoryStats.for_device(inputs.device))
    tracker.param_view = view = ParamView.for_model(model)
    counter = OpCounter(tracker, registry, before_op=guard.write_hook())
    state, copy_of = step_state(model, inputs.device, mode.dtype, mode.memory_format)
    state, copy_of = _own_parameters(model, state, copy_of)
    skip = {compat.storage_identity(t)[0] for t in (*state.values(), *copy_of.values())}
    target = move_target(spec.target, inputs.device, mode.dtype)
    saved = SavedBytes(skip, lambda: tracker.current.index)
    loss_forward, loss_backward = PassCost(collect_op_bytes=True), PassCost()
    loss_counter = OpCounter(FixedScope(loss_forward), registry)
    device = inputs.device
    with step_guard(device), running(model, dataclasses.replace(mode, amp=None)):
        with compat.reparametrized(model, state):
            hooks = (
                meta_attention(device, names, False),
                module_hooks(model, tracker.pre, tracker.post, names, post_with_inputs=True),
                counter,
                saved.hooks(),
                amp_context(device, mode.amp),
            )
            output = _counted_forward(model, inputs, tracker, hooks)
            records = tracker.final_records(model, inputs.args, inputs.kwargs, output)
            tracker.marks.mark(LOSS)
            saved.call = lambda: LOSS
            guard.begin("the loss")
            with loss_counter, saved.hooks(), amp_context(device, mode.amp):
                loss = spec.loss(output, target, type(model).__name__)
            guard.begin("the counted backward")
            label = f"{type(model).__name__} (loss {spec.loss_name})"
            tags, costs, recompute, backward_counter = _backward_costs(
                model, loss, tracker, (records, label), loss_backward, registry
            )
        guard.begin("the counted optimizer step")
        optimizer, opt_unsupported = _count_optimizer(spec, copy_of, registry)
    unsupported = Counter(loss_counter.unsupported) + backward_counter.unsupported + opt_unsupported
    saved_by = [int(saved.by_call.get(r.index, 0)) for r in records]
    static = StaticResult(records, counter.unsupported, counter.by_op, _model_params(model, view))
    return static, StepCost(
        backward=costs,
        saved_bytes=saved_by,
        loss_forward=loss_forward,
        loss_backward=loss_backward,
        loss_saved_bytes=int(saved.by_call.get(LOSS, 0)),
        loss_name=spec.loss_name,
        loss_input_shapes=[tensor_shape(t) for t in iter_tensors(output)],
        loss_output_bytes=loss.numel() * loss.element_size(),
        optimizer=optimizer,
        by_op=backward_counter.by_op,
        loss_by_op=loss_counter.by_op,
        unsupported=unsupported,
        owning_calls={c for c in tags.by_node.values() if c >= 0}
        | {i for i, b in enumerate(saved_by) if b},
        nodes=len(tags.nodes),
        recompute=recompute,
        ungraded=_ungraded(model, copy_of),
    )


def _ungraded(model: nn.Module, copy_of: dict[int, torch.Tensor]) -> dict[str, int]:
    """The trainable parameters whose step alias (``copy_of``) the backward gave no gradient,
    each name -> the id of the model's parameter."""
    return {
        n: id(p)
        for n, p in model.named_parameters()
        if p.requires_grad and getattr(copy_of.get(id(p)), "grad", 0) is None
    }


def _counted_forward(model: nn.Module, inputs: ModelInputs, tracker: Any, hooks: tuple) -> Any:
    """The forward (of the model on the step's state: ``compat.reparametrized``) under
    ``hooks``, the inputs as gradient leaves; a failure names the call it failed in."""
    args, kwargs = grad_leaves(inputs.args), grad_leaves(inputs.kwargs)
    try:
        with contextlib.ExitStack() as scope:
            for hook in hooks:
                scope.enter_context(hook)
            return model(*args, **kwargs)
    except ModelProfError:
        raise
    except Exception as e:
        raise forward_error(e, tracker, inputs) from e


def add_pass(into: PassCost, part: PassCost) -> None:
    """Add ``part``'s counts (FLOPs by op included) to ``into``."""
    for name in ("macs", "flops", "madd", "op_read_bytes", "op_write_bytes"):
        setattr(into, name, getattr(into, name) + getattr(part, name))
    for op, flops in part.ops.items():
        into.ops[op] = into.ops.get(op, 0) + flops
    if part.comm:
        if into.comm is None:
            into.comm = {}
        merge_comm(into.comm, part.comm)


def _backward_costs(
    model: nn.Module,
    loss: torch.Tensor,
    tracker: _StepTracker,
    calls: tuple[list[CallRecord], str],
    loss_backward: PassCost,
    registry: FormulaRegistry | None,
) -> tuple[NodeTags, list[PassCost], list[PassCost], OpCounter]:
    """The backward of ``loss`` counted per call (``calls``: the forward's, and the model's
    label for an error, which names the module the backward failed in), the nodes a reentrant
    checkpoint makes in it tagged too (``Recomputed``): the graph's tags, each call's backward,
    the part of it that recomputed the forward, and the counter."""
    records, what = calls
    tags = tag_graph([loss.grad_fn], tracker.marks)
    hooks = Recomputed(tags, tracker.quiet).hooked(model, tracker.names)
    costs = [PassCost() for _ in records]
    recompute = [PassCost() for _ in records]
    scope = BackwardScope(tags, costs, loss_backward, recompute)
    counter = OpCounter(scope, registry)
    failed_in = functools.partial(_failed_in, scope=scope, records=records)
    with refused_as(f"the backward pass of {what} failed", failed_in), hooks, counter:
        torch.autograd.backward(loss)
    for cost, again in zip(costs, recompute):
        add_pass(cost, again)
    return tags, costs, recompute, counter


def failing_nodes(e: BaseException) -> list[Any]:
    """The autograd nodes a backward's ``e`` was raised in, innermost last: the node that read
    a saved tensor written since (``SavedBytes.unpack``), and each whose custom autograd
    Function raised it (its ``ctx``, in the traceback, is the node)."""
    nodes = [getattr(e, "autograd_node", None)]
    for frame, _ in traceback.walk_tb(e.__traceback__):
        ctx = frame.f_locals.get("ctx")
        if isinstance(ctx, torch.autograd.function.BackwardCFunction):
            nodes.append(ctx)
    return [n for n in nodes if n is not None]


def backward_of(name: str, kind: str) -> str:
    """Where a backward failed, in words (the counted step's and the timed one's)."""
    return f" in the backward of module '{name or '(root)'}' ({kind})"


def _failed_in(e: BaseException, scope: BackwardScope, records: list[CallRecord]) -> str:
    """Where in the backward ``e`` was raised, in words: the call of its innermost node known
    (:func:`failing_nodes`), else the call whose node ran the backward's latest op, if any."""
    by_node = scope.tags.by_node
    call = next((by_node[n] for n in reversed(failing_nodes(e)) if n in by_node), None)

    def named(i: int) -> str:
        return f"module '{records[i].name or '(root)'}' ({records[i].type})"

    if call is not None and 0 <= call < len(records):
        return backward_of(records[call].name, records[call].type)
    if scope.last is not None and 0 <= scope.last < len(records):
        return f" (the latest op it ran was in the backward of {named(scope.last)})"
    return ""


def _count_optimizer(
    spec: StepSpec,
    copy_of: dict[int, torch.Tensor],
    registry: FormulaRegistry | None,
) -> tuple[OptimizerCost | None, Counter]:
    """The step by formula; for an optimizer without one, its ops counted over its second step
    on copies of the parameters (the first makes the state)."""
    if spec.optimizer is None:
        return None, Counter()
    params = list({id(a): a for a in copy_of.values()}.values())  # as model.parameters()
    opt = spec.make_optimizer(params, copy_of)  # built to read its options; never stepped
    cost = optimizer_cost(opt, lambda p: p.grad is not None)
    if cost is not None:  # the formula's states scale with the elements; its step does not
        stepped = {id(p): p for g in opt.param_groups for p in g["params"] if p.grad is not None}
        try:  # (read by stepping a tiny CPU copy of its class once, not this optimizer)
            fixed = scalar_state_bytes(opt, [tuple(p.shape) for p in stepped.values()])
        except ModelProfError:  # a class that cannot step on the CPU: its formula's states
            fixed = 0
        return dataclasses.replace(cost, state_bytes=(cost.state_bytes or 0) + fixed), Counter()
    clones: dict[int, torch.Tensor] = {}
    for p in params:
        c = p.detach().clone()
        c.grad = None if p.grad is None else p.grad.detach().clone()
        clones[id(p)] = c
    clone_of = {orig: clones[id(a)] for orig, a in copy_of.items() if id(a) in clones}
    stepping = spec.make_optimizer(list(clones.values()), clone_of)
    entry = PassCost(collect_op_bytes=True)
    counter = OpCounter(FixedScope(entry), registry)
    with refused_as(
        f"optimizer={spec.optimizer_name} has no per-element formula and "
        "its step could not be run to count it"
    ):
        with torch.no_grad():
            stepping.step()
            with counter:
                stepping.step()
    elements = sum(held(c).numel() for c in clones.values() if c.grad is not None)
    state = sum(
        held(t).numel() * t.element_size()
        for per_param in stepping.state.values()
        for t in per_param.values()
        if isinstance(t, torch.Tensor)
    )
    return OptimizerCost(
        spec.optimizer_name or type(stepping).__name__,
        elements,
        entry.flops,
        entry.op_read_bytes,
        entry.op_write_bytes,
        "ops",
        state,
    ), counter.unsupported
