"""Input sizes from the user: numpy integers accepted, impossible sizes refused (named) before
anything is allocated, devices the machine lacks refused by name."""

from __future__ import annotations

import typing
import warnings

try:
    from typing import Unpack
except ImportError:  # Python 3.10
    from typing_extensions import Unpack

import numpy as np
import pytest
import torch
from torch import nn

import modelprof
from modelprof import ModelProfError, profile
from modelprof.runtime.inputs import check_input_bytes, make_inputs, parse_device, parse_input_size


def test_numpy_integers_are_input_sizes() -> None:
    assert parse_input_size((np.int64(3), np.int32(8))) == [(3, 8)]
    assert parse_input_size(np.array([3, 8])) == [(3, 8)]
    assert parse_input_size([np.array([3, 8]), (np.int16(5),)]) == [(3, 8), (5,)]
    report = profile(nn.Linear(8, 2), np.array([8]), batch_size=np.int64(4), timing=False)
    assert report.batch_size == 4 and report.totals["macs"] == 64  # 4*8*2
    with pytest.raises(ModelProfError, match="input_size"):
        parse_input_size((np.bool_(True), 3))


def test_a_numpy_array_of_data_is_named_as_data_not_printed() -> None:
    # a newcomer's image batch given where the shape goes printed its values as the "size"
    image = np.zeros((1, 3, 224, 224), dtype="float32")
    with pytest.raises(ModelProfError, match=r"numpy array of float32 \(1x3x224x224\)") as err:
        profile(nn.Conv2d(3, 8, 3), image, timing=False)
    assert "torch.from_numpy" in str(err.value) and "0.0" not in str(err.value)
    with pytest.raises(ModelProfError, match="numpy array of float64 \\(4x32\\)"):
        parse_input_size(np.zeros((4, 32)))
    # what can be shapes stays so: an object array of them (a frame's column), and one shape
    shapes = np.empty(2, dtype=object)
    shapes[:] = [(3, 8), (4,)]
    assert parse_input_size(shapes) == [(3, 8), (4,)]
    assert parse_input_size(np.array([[3, 8], [4, 5]])) == [(3, 8), (4, 5)]


def test_a_shape_given_as_inputs_hints_input_size_once_the_forward_refuses_it() -> None:
    # a newcomer's profile(model, inputs=(16,), backward=True) read Linear's "must be Tensor,
    # not int" alone
    model = nn.Sequential(nn.Linear(16, 4))
    for backward in (False, True):
        with pytest.raises(ModelProfError, match=r"(?s)not int.*pass input_size=\(16,\)"):
            profile(model, inputs=(16,), backward=backward, timing=False)
    # a shape with its batch, each int an argument: "takes 2 positional arguments but 3 were
    # given" is the same mistake (review: the hint had gone for it)
    with pytest.raises(ModelProfError, match=r"(?s)3 were given.*pass input_size=\(1, 16\)"):
        profile(model, inputs=(1, 16), timing=False)
    # inputs that are tensors, or ints a module takes on purpose before another of its modules
    # (given a tensor) fails, get no such hint
    with pytest.raises(ModelProfError) as err:
        profile(model, inputs=(torch.zeros(1, 16), 3), timing=False)
    assert "input_size=" not in str(err.value)

    class _TakesAnInt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, n: int) -> torch.Tensor:
            return self.lin(torch.zeros(1, n), 3)  # the user's own mistake, on a tensor

    with pytest.raises(ModelProfError, match="'lin' \\(Linear, input 1x4\\)") as err:
        profile(_TakesAnInt(), inputs=(4,), timing=False)
    assert "input_size=" not in str(err.value)


def test_inputs_larger_than_memory_are_refused_before_allocating() -> None:
    model = nn.Conv2d(3, 8, 3)
    with pytest.raises(ModelProfError) as e:
        profile(model, (3, 100000, 100000), timing=False)
    # 3 * 100000 * 100000 float32 values = 1.2e11 bytes, more than a test host's memory
    assert "input_size=(3, 100000, 100000) at batch_size 1 needs 120.0 GB" in str(e.value)
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)  # a batch search steps back
    with pytest.raises(ModelProfError, match="more elements than a tensor can hold"):
        make_inputs(model, (3, 2**40, 2**40), device="meta")  # 3 * 2**80 elements
    # on the meta device nothing is allocated, so a shape-only analysis of a huge input is fine
    assert make_inputs(model, (3, 100000, 100000), device="meta").shapes() == "1x3x100000x100000"


def test_input_bytes_estimate() -> None:
    # batch 2 of (3, 4) and (5,) in float16: 2 * (12 + 5) * 2 bytes = 68
    assert check_input_bytes("x", [(3, 4), (5,)], 2, torch.float16, torch.device("cpu")) == 68


@pytest.mark.parametrize("device", ["mps", "xpu", "hpu"])
def test_backends_this_machine_lacks_are_refused(device: str) -> None:
    module = getattr(torch, device, None)
    if module is not None and getattr(module, "is_available", lambda: False)():
        pytest.skip(f"{device} is available here")
    with pytest.raises(
        ModelProfError, match=f"device='{device}': the '{device}' backend is not available"
    ):
        parse_device(device)
    with pytest.raises(ModelProfError, match=f"device='{device}'"):
        profile(nn.Linear(2, 2), (2,), device=device, timing=False)


# -- inputs as (args, kwargs), the way torch.export takes them ------------------------------------
class _Masked(nn.Module):
    """``model(x, mask=m)``: a Linear(6, 4) whose output is multiplied by the mask if given."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x, mask=None):
        y = self.fc(x)
        return y if mask is None else y * mask


def _args_kwargs():
    return (torch.randn(3, 6),), {"mask": torch.ones(3, 4)}


def test_args_and_kwargs_together_reach_the_forward() -> None:
    mi = make_inputs(_Masked(), inputs=_args_kwargs())
    assert [tuple(a.shape) for a in mi.args] == [(3, 6)] and list(mi.kwargs) == ["mask"]
    assert mi.batch_size == 3
    report = profile(_Masked(), inputs=_args_kwargs(), timing=False)
    # Linear(6, 4) on 3 rows: 3*6*4 = 72 MACs; flops 144 + 12 bias adds + 12 mask products
    assert (report.totals["macs"], report.totals["flops"]) == (72, 168)
    # without the mask: 144 + 12 = 156, so the mask did reach the forward
    assert profile(_Masked(), inputs=(torch.randn(3, 6),), timing=False).totals["flops"] == 156


def test_args_and_kwargs_in_compare_latency_and_the_training_step() -> None:
    from modelprof import compare, measure_latency

    table = compare({"a": _Masked(), "b": _Masked()}, inputs=_args_kwargs(), timing=False)
    assert list(table["flops"]) == [168, 168]  # as above, mask included
    calls = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a timing of an append is noisy, and not the point
        m = measure_latency(
            lambda x, mask: calls.append((x.shape, mask.shape)), _args_kwargs(), repeat=3, warmup=1
        )
    assert m.n == 3 and calls[0] == (torch.Size([3, 6]), torch.Size([3, 4]))
    step = profile(_Masked(), inputs=_args_kwargs(), backward=True, timing=False)
    # forward 168 as above + the default loss, the sum of the 3x4 outputs: 12
    assert step.totals["flops"] == 168 + 12
    # backward of the Linear: dW = dY^T x (4x3 @ 3x6) 72 MACs; the input needs no gradient
    assert step.totals["backward_macs"] == 72


def test_a_forward_of_a_tuple_and_a_dict_is_given_them_inside_args() -> None:
    class TupleDict(nn.Module):
        def forward(self, pair, scales):
            return pair[0] * scales["a"] + pair[1]

    x = torch.ones(2, 3)
    pair, scales = (x, x), {"a": torch.full((2, 3), 2.0)}
    mi = make_inputs(TupleDict(), inputs=((pair, scales), {}))
    assert len(mi.args) == 2 and mi.kwargs == {}
    # 2x3 products + 2x3 sums = 12 flops
    assert profile(TupleDict(), inputs=((pair, scales), {}), timing=False).totals["flops"] == 12


def test_keyword_names_must_be_strings_in_args_and_kwargs() -> None:
    with pytest.raises(
        ModelProfError,
        match=r"inputs\[1\] dict keys must be argument names; "
        r"got 3",
    ):
        make_inputs(_Masked(), inputs=((torch.randn(3, 6),), {3: torch.ones(3, 4)}))


def test_meta_inputs_for_a_model_on_the_cpu_are_refused_by_name() -> None:
    # meta tensors have shapes but no values: no copy of them reaches the CPU, and the bare
    # NotImplementedError ("Cannot copy out of meta tensor") named neither cause nor remedy
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4, device="meta")
    calls = [
        lambda: modelprof.profile(model, x, timing=False),
        lambda: modelprof.compare({"a": model}, inputs=x),
        lambda: modelprof.measure_latency(model, inputs=x),
    ]
    for call in calls:
        with pytest.raises(ModelProfError, match="inputs are on meta") as err:
            call()
        assert "runs on cpu" in str(err.value) and "device='meta'" in str(err.value)
    # counting from the shapes stays possible: 2 rows x 4 x 4 = 32 MACs
    assert modelprof.profile(model, x, device="meta").totals["macs"] == 32


class _XAndMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x, mask=None):
        return self.lin(x)


def test_inputs_whose_every_tensor_is_empty_are_refused_naming_the_shape() -> None:
    # a batch of 0 given as a tensor ran on nothing and reported 0 MACs without a word, where
    # batch_size=0 is refused
    model = _XAndMask()
    for x in (torch.randn(0, 8), (torch.randn(0, 8), torch.zeros(0))):
        with pytest.raises(
            ModelProfError, match=r"every input tensor is empty, a batch of 0 \(\(0, 8\)"
        ):
            profile(model, x, backward=True, timing=False)
    # 2 samples of no features are samples (a zero-length contraction: tests/test_formulas.py)
    assert profile(nn.Softmax(dim=1), torch.randn(2, 0), timing=False).totals["macs"] == 0
    # one empty tensor beside others (an empty cache or mask) is an input like any: 2 x 8 x 4
    r = profile(model, (torch.randn(2, 8), torch.zeros(0)), timing=False)
    assert r.totals["macs"] == 64


class _SelfKeyword(nn.Module):
    """A forward with keywords named as modelprof's and torch's own parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(this, x, self=None, model=None, inputs=None, fn=None):
        extra = [t for t in (self, model, inputs, fn) if t is not None]
        return this.lin(x) + sum(t.sum() for t in extra)


def test_inputs_keys_named_as_modelprofs_or_torchs_own_parameters() -> None:
    from modelprof.errors import keywords_named

    x, net = torch.randn(2, 4), _SelfKeyword()
    # keys named as modelprof's own parameters (model=, inputs=, fn=) reach the forward
    given = {"x": x, "model": x, "inputs": x, "fn": x}
    assert profile(net, given, timing=False).totals["macs"] == 32  # 2*4*4
    # self= cannot: Module.__call__(self, *args, **kwargs) binds it, as net(self=x) does in
    # PyTorch; the forward's TypeError was reported as "the forward pass failed before any
    # module ran" -- now refused before running, naming the key and the positional way
    with pytest.raises(ModelProfError, match=r"^inputs key 'self' cannot reach _SelfKeyword"):
        profile(net, {"x": x, "self": x}, timing=False)
    assert profile(net, (x, x), timing=False).totals["macs"] == 32  # positionally: it runs
    # a plain function takes self= as any keyword
    mi = make_inputs(lambda x, self: x + self, inputs={"x": x, "self": x})
    assert set(mi.kwargs) == {"x", "self"}

    # keywords_named took every parameter but self: Report.diff(self=a, other=b) was refused
    class Box:
        @keywords_named
        def add(self, other: int = 0) -> int:
            return 1 + other

    assert Box.add(self=Box(), other=2) == 3
    with pytest.raises(ModelProfError, match=r"Box.add\(\) got self= twice, positionally"):
        Box().add(self=Box())
    with pytest.raises(ModelProfError, match=r"takes no keyword\(s\) \['slf'\].*it takes \['ot"):
        Box().add(slf=1)


class _Declared(typing.TypedDict, total=False):
    scale: float


class _TakesDeclaredKeys(nn.Module):
    """A forward whose ``**kwargs`` declares its keys, as transformers' ``Unpack[...]`` does
    (set below as an object: this file's annotations are strings, which declare nothing)."""

    def forward(self, input_ids, **kwargs):
        return input_ids.float() * kwargs.get("scale", 1.0)


_TakesDeclaredKeys.forward.__annotations__["kwargs"] = Unpack[_Declared]


class _TakesAnyKeys(nn.Module):
    """A forward whose plain ``**kwargs`` takes any key, as GPT-2's does; it fails without its
    ``input_ids`` as transformers' models do ("You have to specify either input_ids")."""

    def forward(self, input_ids: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("You have to specify either input_ids or inputs_embeds")
        return input_ids.float() + len(kwargs)


def test_a_named_input_a_declared_forward_does_not_take_is_refused_with_the_nearest_name():
    ids = torch.zeros(1, 4, dtype=torch.long)
    # before, profile passed the misspelt key to the forward unchecked (generation refused it)
    # (refused before the forward runs: not the failed forward's hint)
    refused = r"^inputs\['input_idz'\] is no input of _TakesDeclaredKeys.forward; did you mean 'input_ids'"
    with pytest.raises(ModelProfError, match=refused):
        profile(_TakesDeclaredKeys(), inputs={"input_idz": ids}, timing=False)
    # a declared key is taken, and the CLI's --input builds the same dict
    report = profile(_TakesDeclaredKeys(), inputs={"input_ids": ids, "scale": 2.0}, timing=False)
    assert report.input_shape == "1x4"


def test_a_plain_kwargs_forward_takes_any_key_and_a_failure_names_the_near_miss():
    ids = torch.zeros(1, 4, dtype=torch.long)
    # a plain **kwargs declares nothing: an extra key is no error
    assert profile(_TakesAnyKeys(), inputs={"input_ids": ids, "extra": ids}, timing=False)
    # the misspelt key went to **kwargs unread and the forward failed on no input_ids: the
    # error said only the model's words; now it names the key and the parameter near it
    with pytest.raises(ModelProfError) as caught:
        profile(_TakesAnyKeys(), inputs={"input_idz": ids}, timing=False)
    text = str(caught.value)
    assert "You have to specify either input_ids" in text
    assert "hint: inputs['input_idz'] is no parameter of _TakesAnyKeys.forward" in text
    assert text.endswith("did you mean 'input_ids'?")
