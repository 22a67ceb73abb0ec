"""What a profiled training step runs: the loss on the model's output, and the optimizer.

``StepSpec.parse`` checks the user's ``loss_fn``, ``target`` and ``optimizer`` once, at the
boundary. The loss defaults to the sum of the floating outputs that require grad (its gradient is
all ones, so every output's backward runs), or, for inputs with ``labels``, the output's own
``loss`` where it carries one (:meth:`StepSpec.for_inputs`); ``loss_fn(output)`` or, with ``target``,
``loss_fn(output, target)`` must return a floating scalar that depends on the parameters.

``optimizer`` is a ``torch.optim.Optimizer`` class (``torch.optim.AdamW``), a factory
(``lambda params: torch.optim.SGD(params, lr=0.1)``), a name (``"adamw"``) or an optimizer
instance, used only as a template (its class and per-group options, built anew on modelprof's
copies of the parameters; the user's optimizer is never written).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import operator
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from modelprof.errors import ModelProfError, a_type, error_line
from modelprof.runtime.failure import refused_as
from modelprof.runtime.placement import copy_model
from modelprof.runtime.tensors import brief, iter_tensors
from modelprof.step.optimizer_state import torch_optimizers

__all__ = [
    "StepSpec",
    "default_loss",
    "functional_loss",
    "functional_losses",
    "OwnLoss",
    "loss_module",
    "refuse_inference_mode",
    "refuse_scripted",
]

_NEEDS_CLOSURE = ("LBFGS",)


def refuse_inference_mode(what: str) -> None:
    """Refuse ``backward=True`` inside ``torch.inference_mode()`` before anything runs
    (``what``: the call, ``"profile()"``)."""
    if torch.is_inference_mode_enabled():
        raise ModelProfError(
            "backward=True inside torch.inference_mode(): tensors made there never require "
            f"grad, so there is no backward to profile; call {what} outside inference_mode "
            "(inside torch.no_grad() is fine: the training step turns grad on itself)"
        )


def refuse_eager_only(opts: Any) -> None:
    """Refuse the timing modes a training step does not run in (``TimingOptions
    .end_to_end_only``: compile, cuda_graph, transfer): its steps are timed eagerly."""
    if opts.end_to_end_only:
        raise ModelProfError(
            f"{opts.end_to_end_only[0]} is not supported with backward=True "
            "(training steps are timed eagerly, inputs already on the device)"
        )


def refuse_scripted(model: torch.nn.Module) -> None:
    """Refuse a model with a TorchScript module before anything runs: the training step puts
    copies of the parameters in place with ``torch.func.functional_call``, which it refuses."""
    found = next(
        ((name, m) for name, m in model.named_modules() if isinstance(m, torch.jit.ScriptModule)),
        None,
    )
    if found is None:
        return
    name, module = found
    where = "the model is" if name == "" else f"module {name!r} of the model is"
    raise ModelProfError(
        f"backward=True cannot profile {type(model).__name__}: {where} TorchScript "
        f"({type(module).__name__}), and the training step runs on copies of the parameters "
        "put in their place by torch.func.functional_call, which TorchScript modules refuse. "
        "Profile the eager module (before torch.jit.script/trace) with backward=True; the "
        "scripted forward is profiled with backward=False, as one row"
    )


def default_loss(output: Any) -> torch.Tensor | None:
    """The sum of every floating output tensor that requires grad, or ``None`` if there is none."""
    parts = [t.sum() for t in iter_tensors(output) if t.is_floating_point() and t.requires_grad]
    return functools.reduce(operator.add, parts) if parts else None


class OwnLoss:
    """The loss of a call given ``labels=``: the output's own ``loss`` where it carries one (a
    transformers model given labels computes it beside its logits), else the default sum (a
    forward that takes labels and returns its loss, or a tuple). Named for what it took, as
    the table's ``(loss)`` row and the summary say it."""

    def __init__(self) -> None:
        self.__name__ = "output.loss"

    def __call__(self, output: Any) -> Any:
        got = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if isinstance(got, torch.Tensor):
            self.__name__ = "output.loss"
            return got
        self.__name__ = "sum"
        loss = default_loss(output)
        if loss is None:
            raise ModelProfError(
                f"labels= was given, but the output is {_describe(output)}: no `loss` of its "
                "own and no floating tensor that requires grad to make the default loss (the "
                "sum of the floating outputs); pass loss_fn= (and target=)"
            )
        return loss


def functional_losses() -> dict[str, Callable[..., Any]]:
    """The losses of ``torch.nn.functional`` taken as ``loss_fn(output, target)`` (their only
    required arguments are ``input`` and ``target``: ``cross_entropy``, ``mse_loss``,
    ``nll_loss``...), by name: what a loss is named by where a function cannot be given (a
    sweep's file, whose values are recorded in its result files)."""
    found = {}
    for name, fn in vars(torch.nn.functional).items():
        lossy = "loss" in name or "entropy" in name or name == "kl_div"
        if name.startswith("_") or not lossy or not inspect.isfunction(fn):
            continue
        required = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if required == ["input", "target"]:
            found[name] = fn
    return found


def functional_loss(name: Any) -> Callable[..., Any]:
    """The ``torch.nn.functional`` loss ``name`` names (``"cross_entropy"``, also as
    ``"torch.nn.functional.cross_entropy"`` or ``"F.cross_entropy"``), or a ModelProfError."""
    losses = functional_losses()
    key = (
        name.removeprefix("torch.nn.functional.").removeprefix("F.")
        if isinstance(name, str)
        else None
    )
    if key in losses:
        return losses[key]
    close = difflib.get_close_matches(str(key), sorted(losses), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ModelProfError(
        f"loss_fn={name!r} is not a torch.nn.functional loss of the output and a target: "
        f"name one of {sorted(losses)}{hint}"
    )


def _describe(output: Any) -> str:
    if isinstance(output, torch.Tensor):  # one tensor: its shape says more than a count
        return f"a {brief(output)}{'' if output.requires_grad else ' (no grad)'}"
    tensors = list(iter_tensors(output))
    if not tensors:
        return f"{a_type(output)} with no tensor"
    kinds = ", ".join(
        f"{str(t.dtype).removeprefix('torch.')}{'' if t.requires_grad else ' (no grad)'}"
        for t in tensors[:6]
    )
    return f"{a_type(output)} of {len(tensors)} tensor(s): {kinds}"


def _name(obj: Any) -> str:
    if isinstance(obj, torch.nn.Module):
        return type(obj).__name__
    if isinstance(obj, functools.partial):
        return _name(obj.func)
    return getattr(obj, "__name__", None) or type(obj).__name__


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """The checked step options (see the module doc)."""

    loss_fn: Callable[..., Any] | None = None
    target: Any = None
    has_target: bool = False
    optimizer: Any = None  # a class, a factory or a template instance; None: no step

    def __post_init__(self) -> None:
        if self.target is not None and not self.has_target:  # StepSpec(loss_fn, target)
            object.__setattr__(self, "has_target", True)

    @classmethod
    def parse(cls, *, loss_fn: Any = None, target: Any = None, optimizer: Any = None) -> StepSpec:
        if loss_fn is not None and not callable(loss_fn):
            raise ModelProfError(
                f"loss_fn={loss_fn!r} is not callable; pass a function of the "
                "output (and target), e.g. torch.nn.functional.cross_entropy"
            )
        if target is not None and loss_fn is None:
            raise ModelProfError(
                "target= needs loss_fn= (the default loss, the sum of the outputs, takes no target)"
            )
        return cls(loss_fn, target, target is not None, _parse_optimizer(optimizer))

    def for_inputs(self, kwargs: Mapping[str, Any]) -> StepSpec:
        """This spec for a call given ``kwargs``: with ``labels`` and no ``loss_fn``, the loss is
        the output's own where it has one (:class:`OwnLoss`, what a transformers model given
        labels trains on), not the sum of its outputs (the loss and the logits together)."""
        if self.loss_fn is not None or "labels" not in kwargs:
            return self
        return dataclasses.replace(self, loss_fn=OwnLoss())

    # -- the loss ---------------------------------------------------------------------------
    @property
    def loss_name(self) -> str:
        return "sum" if self.loss_fn is None else _name(self.loss_fn)

    def compute_loss(self, output: Any, target: Any = None) -> Any:
        """The loss, unchecked (the timed passes: checked once before, by ``loss``)."""
        if self.loss_fn is None:
            return default_loss(output)
        return self.loss_fn(output, target) if self.has_target else self.loss_fn(output)

    def loss(self, output: Any, target: Any = None, model_name: str = "the model") -> torch.Tensor:
        """The loss, checked: a floating scalar that requires grad, or a ModelProfError."""
        if self.loss_fn is None:
            loss = default_loss(output)
            if loss is None:
                raise ModelProfError(
                    f"the output of {model_name} is {_describe(output)}: no floating tensor that "
                    "requires grad to make the default loss (the sum of the floating outputs); "
                    "pass loss_fn= (and target=)"
                )
            return loss
        with refused_as(
            f"loss_fn={self.loss_name} raised on the output of {model_name} ({_describe(output)})"
        ):
            loss = self.compute_loss(output, target)
        if not isinstance(loss, torch.Tensor):
            wrong = f"{a_type(loss)}, not a tensor; it must return a scalar loss"
        elif loss.numel() != 1:
            wrong = f"a tensor of shape {tuple(loss.shape)}, not a scalar; reduce it (mean or sum)"
        elif not loss.is_floating_point():
            wrong = f"a {loss.dtype} tensor; a loss must be floating point"
        elif not loss.requires_grad:
            wrong = (
                f"a loss that does not depend on any parameter of {model_name} (it does not "
                "require grad)"
            )
        else:
            return loss
        raise ModelProfError(f"loss_fn={self.loss_name} returned {wrong}")

    def isolated(self) -> StepSpec:
        """This spec with its loss module (``loss_fn``, or its bound method's or partial's)
        replaced by a copy, so that a step's gradients and buffer updates never reach the user's."""
        owner, rebuild = _loss_owner(self.loss_fn)
        if owner is None:
            return self
        twin = copy_model(owner, "run the loss on a copy", own_parameters=True)
        return dataclasses.replace(self, loss_fn=rebuild(twin))

    # -- the optimizer ----------------------------------------------------------------------
    @property
    def optimizer_name(self) -> str | None:
        return None if self.optimizer is None else _name(self.optimizer)

    def check_optimizer(self, model: torch.nn.Module) -> None:
        """Refuse, before anything runs, an optimizer class (a name's) that refuses the model's
        parameters by their shapes alone (Muon takes 2-D ones only): built once on meta
        stand-ins of them, never stepped. A refusal of what was asked, not a failed run (no
        raised cause: the command line's exit status 2). A factory is the user's code, and a
        template was built on the parameters already: neither is called here. Only a
        ValueError is a refusal: a constructor that reads values (``.item()``), which meta
        stand-ins do not have, raises otherwise, and the step itself then says what it does."""
        cls = self.optimizer
        if not isinstance(cls, type):
            return
        lazy = torch.nn.parameter.UninitializedParameter  # (refused by the pass, named)
        params = [p for p in {id(p): p for p in model.parameters()}.values()]
        if not params or any(isinstance(p, lazy) for p in params):
            return
        try:  # (a stand-in meta cannot make, a quantized dtype's, is no refusal either)
            stand_ins = [
                torch.empty(p.shape, dtype=p.dtype, device="meta", requires_grad=p.requires_grad)
                for p in params
            ]
            cls(stand_ins)
        except ValueError as e:  # torch's optimizers refuse a parameter so (Muon's shapes)
            raise ModelProfError(
                f"optimizer={self.optimizer_name} refuses the parameters of "
                f"{type(model).__name__} (their shapes, before anything ran): {error_line(e)}"
            ) from None
        except Exception:  # noqa: BLE001 - not a refusal of the shapes: the step will say
            return

    def make_optimizer(
        self, params: list[torch.Tensor], copy_of: Mapping[int, torch.Tensor]
    ) -> torch.optim.Optimizer | None:
        """A new optimizer over ``params`` (modelprof's copies); ``copy_of`` maps ``id`` of each
        of the user's parameters to its copy, for a template instance's param groups."""
        opt = self.optimizer
        if opt is None:
            return None
        if isinstance(opt, torch.optim.Optimizer):
            return _from_template(opt, copy_of)
        with refused_as(
            f"optimizer={self.optimizer_name} could not be built on the model's parameters"
        ):
            made = opt(params)
        if not isinstance(made, torch.optim.Optimizer):
            raise ModelProfError(
                f"optimizer={self.optimizer_name} returned {a_type(made)}, not a "
                "torch.optim.Optimizer"
            )
        _check_holds(made, params, self.optimizer_name)
        if type(made).__name__ in _NEEDS_CLOSURE:
            raise ModelProfError(
                f"optimizer={type(made).__name__} needs a closure for step(); it cannot be profiled"
            )
        return made


def _check_holds(made: torch.optim.Optimizer, params: list[torch.Tensor], name: Any) -> None:
    """Refuse an optimizer that holds a tensor it was not given (a factory that ignores its
    ``params`` and takes ``model.parameters()`` would step the user's own weights)."""
    given = set(map(id, params))
    for g, group in enumerate(made.param_groups):
        for p in group["params"]:
            if id(p) not in given:
                raise ModelProfError(
                    f"optimizer={name} holds a tensor of shape {tuple(p.shape)} (param group "
                    f"{g}) that is not one of the parameters it was given: a factory must build "
                    "the optimizer on its argument (lambda params: torch.optim.SGD(params, "
                    "lr=0.1)), not on model.parameters(), or it would step your model's weights"
                )


def loss_module(loss_fn: Any) -> torch.nn.Module | None:
    """The module a ``loss_fn`` is, or whose bound method (or a partial of one) it is; else
    None (a plain function, or a closure: what it holds is not seen)."""
    return _loss_owner(loss_fn)[0]


def _loss_owner(loss_fn: Any) -> tuple[torch.nn.Module | None, Callable[[Any], Any]]:
    """The module ``loss_fn`` is (or whose bound method it is, also inside a
    ``functools.partial``), and how to make the same loss function on another module."""
    if isinstance(loss_fn, torch.nn.Module):
        return loss_fn, lambda twin: twin
    if isinstance(loss_fn, functools.partial):
        owner, rebuild = _loss_owner(loss_fn.func)
        return owner, lambda twin: functools.partial(
            rebuild(twin), *loss_fn.args, **loss_fn.keywords
        )
    owner = getattr(loss_fn, "__self__", None)
    if isinstance(owner, torch.nn.Module) and isinstance(loss_fn, types.MethodType):
        return owner, lambda twin: types.MethodType(loss_fn.__func__, twin)
    return None, lambda twin: loss_fn


def _parse_optimizer(optimizer: Any) -> Any:
    if optimizer is None:
        return None
    if isinstance(optimizer, str):
        by_name = torch_optimizers()
        found = by_name.get(optimizer.lower())
        if found is None:  # (LBFGS, refused below, is no name to offer)
            usable = sorted(k for k, v in by_name.items() if v.__name__ not in _NEEDS_CLOSURE)
            raise ModelProfError(
                f"optimizer={optimizer!r} is not a torch.optim optimizer; use "
                f"one of {usable}, a class or a factory"
            )
        optimizer = found
    name = optimizer.__name__ if isinstance(optimizer, type) else type(optimizer).__name__
    if isinstance(optimizer, type) and not issubclass(optimizer, torch.optim.Optimizer):
        raise ModelProfError(f"optimizer={name} is not a torch.optim.Optimizer subclass")
    if not isinstance(optimizer, torch.optim.Optimizer) and not callable(optimizer):
        raise ModelProfError(
            f"optimizer={optimizer!r} must be an optimizer class "
            "(torch.optim.AdamW), a factory (lambda params: ...), a name or "
            "an optimizer to copy the options of"
        )
    if name in _NEEDS_CLOSURE:
        raise ModelProfError(f"optimizer={name} needs a closure for step(); it cannot be profiled")
    return optimizer


def _from_template(
    template: torch.optim.Optimizer, copy_of: Mapping[int, torch.Tensor]
) -> torch.optim.Optimizer:
    """Same class and per-group options as ``template``, over the copies of its parameters."""
    groups = []
    for g in template.param_groups:
        params = []
        for p in g["params"]:
            if id(p) not in copy_of:
                raise ModelProfError(
                    f"optimizer={type(template).__name__} holds a parameter of "
                    f"shape {tuple(p.shape)} that is not one of the model's"
                )
            params.append(copy_of[id(p)])
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": params})
    cls = type(template)
    try:
        return cls(groups)
    except TypeError:  # an __init__ that requires its options: give the template's defaults
        accepted = set(inspect.signature(cls.__init__).parameters)
        defaults = {k: v for k, v in template.defaults.items() if k in accepted}
        return cls(groups, **defaults)
