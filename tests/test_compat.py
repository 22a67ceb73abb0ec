"""modelprof.runtime.compat: every entry called, so that a release that removes or renames one
fails here with the entry's name; generation and meta counting on both sides of transformers'
rename of the cache argument (``past_key_values`` up to 5.23, ``cache`` from 5.24)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import types
from typing import Any

import pytest
import torch
from helpers import tiny_t5
from torch import nn

from modelprof import ModelProfError, profile, profile_generation, token_inputs
from modelprof.runtime import compat

pytestmark = pytest.mark.compat
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- versions -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("2.4.1+cu121", (2, 4, 1)),
        ("5.0.0rc1", (5, 0, 0)),
        ("2.14.1", (2, 14, 1)),
        ("1.23", (1, 23)),
    ],
)
def test_version_tuple(text: str, expected: tuple) -> None:
    assert compat.version_tuple(text) == expected


def test_installed_versions_are_read() -> None:
    assert compat.torch_version() == compat.version_tuple(torch.__version__)
    transformers = pytest.importorskip("transformers")
    assert compat.transformers_version() == compat.version_tuple(transformers.__version__)


def test_require_names_the_feature_and_both_versions() -> None:
    compat.require("counting", "torch", (2, 0))  # older than any torch we run on
    with pytest.raises(
        ModelProfError,
        match=r"flux capacitor needs torch >= 99\.0; torch "
        r"\d+\.\d+",
    ):
        compat.require("flux capacitor", "torch", (99, 0))


# -- torch's private names -----------------------------------------------------------------------
class _OpNames(compat.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_private_classes_are_the_ones_torch_uses() -> None:
    assert isinstance(torch.ops.aten.mm.default, compat.OpOverload)
    assert isinstance(torch.ops.aten.mm, compat.OpOverloadPacket)
    assert isinstance(torch.ops.higher_order.cond, compat.HigherOrderOperator)
    assert issubclass(compat.FakeTensor, torch.Tensor)

    with _OpNames() as seen:
        torch.ones(2) + 1
        depth, flags = compat.dispatch_stack_state()
        inner = _OpNames()
        inner.__enter__()  # left on the stack, as a failed pass might
        assert compat.dispatch_stack_state()[0] == depth + 1
        compat.restore_dispatch_stack(depth, flags)
        assert compat.dispatch_stack_state() == (depth, flags)
        torch.ones(3)
    assert "aten.add.Tensor" in seen.names and seen.names.count("aten.ones.default") == 2
    assert not inner.names  # popped before it saw anything


def test_is_fake() -> None:
    assert not compat.is_fake(torch.ones(1))
    with compat.FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(2))
    assert compat.is_fake(fake)


def test_reparametrized_holds_the_swap_for_the_block_and_keeps_ties() -> None:
    lin = nn.Linear(2, 2, bias=False)
    own = lin.weight
    alias = own.detach().clone().requires_grad_()
    with compat.reparametrized(lin, {"weight": alias}):
        assert lin.weight is alias
        lin(torch.ones(1, 2)).sum().backward()
    assert lin.weight is own and own.grad is None and alias.grad is not None


def test_is_checkpoint_node_names_a_reentrant_checkpoints_node_only() -> None:
    from torch.utils.checkpoint import checkpoint

    x = torch.ones(2, requires_grad=True)
    reentrant = checkpoint(torch.sin, x, use_reentrant=True)
    plain = checkpoint(torch.sin, x, use_reentrant=False)
    assert compat.is_checkpoint_node(reentrant.grad_fn)
    assert not compat.is_checkpoint_node(plain.grad_fn) and not compat.is_checkpoint_node(None)


def test_current_autograd_node_inside_a_backward_only() -> None:
    seen: list[Any] = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(compat.current_autograd_node())
            return g * 2

    assert compat.current_autograd_node() is None
    Spy.apply(torch.ones(2, requires_grad=True)).sum().backward()
    assert seen[0] is not None and "Spy" in type(seen[0]).__name__


def test_has_composite_kernel_and_decompositions() -> None:
    # linear decomposes above autograd (into addmm/mm); mm is a kernel of its own
    assert compat.has_composite_kernel(torch.ops.aten.linear.default)
    assert not compat.has_composite_kernel(torch.ops.aten.mm.default)

    class Unknown:  # an op the dispatcher does not know: torch 2.11's aten.dim (jagged SDPA)
        def name(self) -> str:
            return "aten::modelprof_no_such_op"

    assert not compat.has_composite_kernel(Unknown())
    assert torch.ops.aten.addmm.default in compat.decomposition_table()


def test_default_mesh_on_cpu_answers_cpu_inside_and_puts_back() -> None:
    before = (torch.cuda.is_available, getattr(torch._C, "_get_accelerator", None))
    with compat.default_mesh_on_cpu():
        assert torch.cuda.is_available() is False
        if before[1] is not None:
            assert torch._C._get_accelerator() == torch.device("cpu")
    assert (torch.cuda.is_available, getattr(torch._C, "_get_accelerator", None)) == before


def test_function_stack_push_and_pop() -> None:
    from torch.overrides import TorchFunctionMode

    before = compat.function_stack.length()
    with TorchFunctionMode():
        assert compat.function_stack.length() == before + 1
        mode = compat.function_stack.pop()
        assert compat.function_stack.length() == before
        compat.function_stack.push(mode)
        assert compat.current_function_mode() is mode
    assert compat.function_stack.length() == before


def test_optional_ops_keep_the_present_ones() -> None:
    assert compat.optional_ops("mm", "no_such_op_anywhere") == [torch.ops.aten.mm]
    assert compat.optional_ops("no_such_op_anywhere") == []
    assert compat.optional_ops("cond", namespace="higher_order") == [torch.ops.higher_order.cond]


def test_the_package_imports_and_counts_with_every_optional_op_gone() -> None:
    # a torch that has none of the ops the formulas name as optional (as torch 2.2 lacks
    # aten.batch_norm_backward): each lookup made by compat.optional_ops fails
    code = textwrap.dedent("""
        import sys, torch, torch._ops
        missing = []
        def failing(real):
            def lookup(self, name):
                if sys._getframe(1).f_code.co_name == "optional_ops":
                    missing.append(name)
                    raise AttributeError(name)
                return real(self, name)
            return lookup
        ns = torch._ops._OpNamespace      # getattr falls back from one to the other
        ns.__getattribute__ = failing(ns.__getattribute__)
        ns.__getattr__ = failing(ns.__getattr__)
        from modelprof import profile
        from modelprof.counting.formulas.registry import REGISTRY
        assert len(missing) > 40, missing
        present = {str(k) for k in REGISTRY.ops}
        assert not any(f"aten.{n}" in present for n in ("batch_norm_backward",
                                                        "_fused_rms_norm_backward")), present
        r = profile(torch.nn.Linear(8, 4), (8,), timing=False)
        print(r.totals["macs"], len(missing))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    macs, missing = map(int, out.stdout.split()[-2:])
    assert macs == 8 * 4 and missing > 40  # Linear(8, 4) on one sample: 8*4 = 32 MACs


def test_getitem_to_index_lets_a_score_function_index_a_0d_tensor() -> None:
    # flex_attention's score_mod indexes its buffers with 0-d tensors: inside the context an
    # index by a tensor works as torch.index would
    bias = torch.arange(4.0)
    if compat.torch_version() < (2, 5):  # no flex_attention, no index transform
        with pytest.raises(ModelProfError, match="needs torch >= 2.5"):
            compat.getitem_to_index()
        return
    with compat.getitem_to_index():
        assert float(bias[torch.tensor(2)]) == 2.0


def test_mha_device_check_is_put_back() -> None:
    original = compat.mha_device_check()
    assert original(torch.ones(1)) in (True, False)  # torch's own test answers
    compat.set_mha_device_check(lambda x: True)
    try:
        assert compat.mha_device_check()(None) is True
    finally:
        compat.set_mha_device_check(original)
    assert compat.mha_device_check() is original


def test_fast_path_device_name_is_put_back() -> None:
    original = compat.fast_path_device_name()
    assert isinstance(original, str)  # torch 2.14: "privateuseone" unless a backend renamed it
    compat.set_fast_path_device_name("meta")
    try:
        assert compat.fast_path_device_name() == "meta"
    finally:
        compat.set_fast_path_device_name(original)
    assert compat.fast_path_device_name() == original


def test_cpu_sdpa_fuses_3d_answers_what_the_cpu_runs() -> None:
    q, k, v = torch.randn(4, 3, 16), torch.randn(4, 9, 16), torch.randn(4, 9, 16)
    with _OpNames() as ran:
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
    fused = any("_scaled_dot_product_flash_attention_for_cpu" in n for n in ran.names)
    compat.cpu_sdpa_fuses_3d.cache_clear()
    with _OpNames() as probe:  # asked inside a mode, which sees none of the probe's ops
        assert compat.cpu_sdpa_fuses_3d() is fused  # torch 2.14: fused; 2.11: the math path
    assert probe.names == []


def test_dtensor_and_fsdp_classes() -> None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor
    assert compat.is_dtensor_class(DTensor) and not compat.is_dtensor_class(torch.Tensor)
    assert DTensor.__module__.startswith(compat.DTENSOR_MODULES)
    assert compat.fsdp_module_class().__name__ == "FSDPModule"


def test_fsdp2_profiles_from_torch_2_6_and_older_torch_says_so() -> None:
    import dist_models as dm

    from modelprof.profile_sharded import profile_sharded

    def build() -> nn.Module:  # FSDP2 from wherever this torch keeps it
        model = dm.Transformer()
        for layer in model.layers:
            compat.fully_shard(layer)
        return compat.fully_shard(model)

    if compat.torch_version() < compat.FSDP2_PUBLIC:
        with pytest.raises(
            ModelProfError,
            match=r"FSDP2 \(fully_shard\) model needs torch >= "
            r"2\.6; torch 2\.\d",
        ):
            profile_sharded(
                build, (dm.SEQ, dm.D), batch_size=dm.BATCH, world_size=2, rank=1, timing=False
            )
        return
    r = profile_sharded(
        build, (dm.SEQ, dm.D), batch_size=dm.BATCH, world_size=2, rank=1, timing=False
    )
    # tests/test_distributed_fake.py: 3,159,552 parameters in the model; this rank's view
    # holds its shard, half of them: 1,579,776
    assert r.totals["params"] == 3_159_552 // 2 and r.env["world_size"] == 2


def test_cache_layer_tensors_reads_the_old_lists_only() -> None:
    class OldCache:  # transformers up to 4.55: one key and one value tensor per layer
        def __init__(self) -> None:
            self.key_cache = [torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)]
            self.value_cache = [torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)]

    layers = compat.cache_layer_tensors(OldCache())
    assert [len(ts) for ts in layers] == [2, 2] and layers[0][0].numel() == 24  # 1*2*3*4
    new = OldCache()
    new.layers = []  # a cache with .layers (4.56 on) is not read here
    assert compat.cache_layer_tensors(new) is None
    assert compat.cache_layer_tensors(object()) is None


def test_plain_tensor_types_and_the_exported_module_type_name() -> None:
    assert torch.Tensor in compat.PLAIN_TENSOR_TYPES and nn.Parameter in compat.PLAIN_TENSOR_TYPES
    # nn.Buffer (torch 2.5 on) is a plain tensor's class where it exists
    assert (getattr(nn, "Buffer", None) in compat.PLAIN_TENSOR_TYPES) is hasattr(nn, "Buffer")
    assert compat.module_stack_type_name(nn.Linear) == "Linear"
    assert compat.module_stack_type_name("torch.nn.modules.linear.Linear") == "Linear"


def test_call_layout_reads_an_exported_programs_positional_and_keyword_inputs() -> None:
    class Net(nn.Module):
        def forward(self, x, pair, scale=None):
            return x * pair[0] * pair[1] * scale

    one = torch.ones(2)
    program = torch.export.export(Net(), (one, (one, one)), {"scale": one})
    # x one tensor, pair two; scale by keyword, one tensor
    assert compat.call_layout(program) == ([1, 2], [("scale", 1)])
    assert compat.call_layout(nn.Linear(2, 2)) is None  # no call spec


def test_dim_range_reads_a_dynamic_dimensions_bounds() -> None:
    def recorded(program):  # the shape of its one input, as its placeholder recorded it
        (name,) = program.graph_signature.user_inputs
        return next(n for n in program.graph.nodes if n.name == name).meta["val"].shape

    x, model = torch.ones(4, 3), nn.Linear(3, 2)
    bounded = torch.export.export(
        model, (x,), dynamic_shapes=({0: torch.export.Dim("b", min=2, max=16)},)
    )
    assert compat.dim_range(bounded, recorded(bounded)[0]) == (2, 16)
    unbounded = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("b")},))
    assert compat.dim_range(unbounded, recorded(unbounded)[0])[1] is None  # no upper bound
    assert compat.dim_range(bounded, recorded(bounded)[1]) is None  # 3: static, no symbol


def test_fast_ranges_reach_the_profilers_raw_events() -> None:
    # two nested ranges around one op: both come back by name, the op between their stamps,
    # with the fields modelprof.timing.kernels reads
    x = torch.ones(4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with compat.fast_range("modelprof.test:outer"), compat.fast_range("modelprof.test:inner"):
            torch.add(x, 1)
        assert compat.profiler_running()
    assert not compat.profiler_running()
    events = {e.name(): e for e in compat.profiler_events(prof)}
    outer, inner, op = (
        events["modelprof.test:outer"],
        events["modelprof.test:inner"],
        events["aten::add"],
    )
    assert outer.start_ns() <= inner.start_ns() <= op.start_ns()
    assert op.start_ns() + op.duration_ns() <= inner.start_ns() + inner.duration_ns()
    assert inner.start_thread_id() == op.start_thread_id()
    assert op.linked_correlation_id() == 0 and op.correlation_id() > 0
    assert isinstance(op.device_resource_id(), int)


def test_every_entry_of_compat_is_called_in_this_file() -> None:
    source = open(__file__, encoding="utf-8").read()
    missing = [name for name in compat.__all__ if f"compat.{name}" not in source]
    assert not missing, missing


# -- transformers: the cache argument on both sides of the rename --------------------------------
transformers = pytest.importorskip("transformers")


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    cache: Any = None
    past_key_values: Any = None
    cache_params: Any = None


def _llama_config() -> Any:
    return transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
    )


class _Named(transformers.LlamaForCausalLM):
    """A causal LM that takes and returns its cache under ``NAME``, whatever the installed
    transformers calls it: both sides of the rename on one install."""

    NAME = "cache"

    def _run(
        self, input_ids: torch.Tensor, cache: Any, use_cache: bool | None, logits_to_keep: int
    ) -> _Out:
        own = compat.cache_argument(transformers.LlamaForCausalLM.forward)
        out = super().forward(
            input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep, **{own: cache}
        )
        return _Out(out.logits, **{self.NAME: compat.output_cache(out)})


class _TakesCache(_Named):
    NAME = "cache"

    def forward(self, input_ids, cache=None, use_cache=None, logits_to_keep=0):
        return self._run(input_ids, cache, use_cache, logits_to_keep)


class _TakesPastKeyValues(_Named):
    NAME = "past_key_values"

    def forward(self, input_ids, past_key_values=None, use_cache=None, logits_to_keep=0):
        return self._run(input_ids, past_key_values, use_cache, logits_to_keep)


def test_cache_argument_and_output_cache() -> None:
    # the newer name first; a state-space model's own name last
    assert compat.CACHE_ARGUMENTS == ("cache", "past_key_values", "cache_params")
    # Mamba took ``cache_params=`` (and returned it so) before transformers 5.24 renamed it
    mamba = compat.cache_argument(transformers.MambaForCausalLM.forward)
    assert mamba == ("cache" if compat.transformers_version() >= (5, 24) else "cache_params")
    assert compat.cache_argument(_TakesCache(_llama_config()).forward) == "cache"
    assert compat.cache_argument(_TakesPastKeyValues(_llama_config()).forward) == "past_key_values"
    assert compat.cache_argument(nn.Linear(2, 2).forward) is None
    assert compat.output_cache(_Out(torch.ones(1), past_key_values="kv")) == "kv"
    assert compat.output_cache(_Out(torch.ones(1), cache="kv")) == "kv"
    assert compat.output_cache(_Out(torch.ones(1), cache_params="kv")) == "kv"
    assert compat.output_cache(_Out(torch.ones(1))) is None


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_new_hf_cache(kind: str) -> None:
    cache = compat.new_hf_cache(kind, _llama_config(), 2, 16, torch.device("cpu"), torch.float32)
    assert isinstance(cache, transformers.Cache) and cache.get_seq_length() == 0


def _counts(report: Any) -> list[tuple[str, int, int, int | None]]:
    return [
        (
            p.label,
            p.totals["macs"],
            p.totals["read_bytes"],
            None if p.kv is None else p.kv.total_bytes,
        )
        for p in report.phases()
    ]


OLD_STATIC = compat.transformers_version() < compat.STATIC_CACHE_REWINDS


def test_static_cache_per_run_sets_what_generate_remembers_aside() -> None:
    # what transformers' generate() keeps to size a later call's static cache (4.56: the cache,
    # 5.24: the largest length yet) is gone in the block, and the caller's is back after it
    model = nn.Linear(1, 1)
    model._cache, model._previous_max_cache_length = "an earlier call's cache", 115
    with compat.static_cache_per_run(model):
        assert not hasattr(model, "_cache") and not hasattr(model, "_previous_max_cache_length")
        model._previous_max_cache_length = 23  # what the block's own calls leave
    assert model._cache == "an earlier call's cache"
    assert model._previous_max_cache_length == 115
    fresh = nn.Linear(1, 1)
    with compat.static_cache_per_run(fresh):
        fresh._cache = "the block's"
    assert not hasattr(fresh, "_cache")


def test_static_cache_per_run_sets_a_cache_module_aside_too() -> None:
    # up to 4.46 a Cache is an nn.Module (is_module_cache), so generate()'s
    # ``self._cache = StaticCache(...)`` lands in the model's _modules, not its __dict__: an
    # earlier call's cache was left in place, and the timed generations reused it (115 slots
    # where the counted steps held 23), as 3144c23 set out to end
    model = nn.Linear(1, 1)
    earlier = nn.Module()  # (a Cache of 4.46 stands in: a module)
    model._cache = earlier
    assert "_cache" in model._modules
    with compat.static_cache_per_run(model):
        assert not hasattr(model, "_cache")
        model._cache = nn.Module()  # what the block's own calls leave
    assert model._cache is earlier
    assert list(model._modules) == ["_cache"]
    fresh = nn.Linear(1, 1)
    with compat.static_cache_per_run(fresh):
        fresh._cache = nn.Module()
    assert not hasattr(fresh, "_cache") and not fresh._modules


@pytest.mark.parametrize("cache", ["dynamic", "static", None])
def test_generation_counts_the_same_under_either_cache_name(cache: Any) -> None:
    if cache == "static" and OLD_STATIC:
        with pytest.raises(
            ModelProfError,
            match=r"cache='static'.* needs transformers >= "
            r"4\.56; transformers 4\.\d+",
        ):
            profile_generation(
                transformers.LlamaForCausalLM(_llama_config()),
                prompt_len=6,
                new_tokens=3,
                cache=cache,
                timing=False,
            )
        return
    torch.manual_seed(0)
    plain = transformers.LlamaForCausalLM(_llama_config())
    reports = []
    for cls in (transformers.LlamaForCausalLM, _TakesCache, _TakesPastKeyValues):
        model = cls(_llama_config())
        model.load_state_dict(plain.state_dict())
        reports.append(
            profile_generation(model, prompt_len=6, new_tokens=3, cache=cache, timing=False)
        )
    assert _counts(reports[0]) == _counts(reports[1]) == _counts(reports[2])
    kv = reports[0].prefill().kv
    # the cache read from the objects: 2 layers x (K and V) x 2 KV heads x head dim 8 x 4 B
    # = 256 B per token; a static cache holds its capacity, as generate() allocates it: the
    # prompt and the new tokens but the last (never fed), 6 + 3 - 1 = 8
    held = 8 if cache == "static" else 6
    assert cache is None or kv.total_bytes == 256 * held
    prefill = reports[0].prefill().totals["macs"]
    # the prefill's projections alone: 6 tokens x 2 layers x (q 32x32 + k,v 2x32x16 + o 32x32
    # + MLP 3x32x64) + lm_head 6x32x64 (all positions: no logits_to_keep in a prefill here);
    # attention's own MACs come on top
    weights = 6 * 2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64)
    assert prefill > weights


@pytest.mark.parametrize(
    "cache",
    [
        "dynamic",
        pytest.param(
            "static",
            marks=pytest.mark.skipif(
                OLD_STATIC, reason="refused before transformers 4.56: the test above"
            ),
        ),
    ],
)
def test_generation_on_meta_counts_what_the_cpu_counts(cache: str) -> None:
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(_llama_config())
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(_llama_config())
    try:
        on_meta = profile_generation(meta, prompt_len=6, new_tokens=3, cache=cache)
    except ModelProfError as e:  # older transformers' rotary embedding enters
        _refused_for_autocast(e)  # autocast("meta"), which older torch cannot
        return
    on_cpu = profile_generation(cpu, prompt_len=6, new_tokens=3, cache=cache, timing=False)
    assert [c[:2] for c in _counts(on_cpu)] == [c[:2] for c in _counts(on_meta)]


def _refused_for_autocast(e: ModelProfError) -> None:
    """The one way a meta count of these models may fail: this torch cannot enter autocast
    on meta, and the error says so."""
    assert not compat.meta_autocast() and "cannot enter torch.autocast on the meta" in str(e), e


def test_generation_without_a_cache_on_meta_is_refused_with_the_reason() -> None:
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(_llama_config())
    with pytest.raises(ModelProfError, match="cache=None on device='meta'.*position ids"):
        profile_generation(meta, prompt_len=6, new_tokens=3, cache=None)


def test_token_inputs_on_meta_count_what_the_cpu_counts() -> None:
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(_llama_config())
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(_llama_config())
    try:
        # CPU ids and their all-ones mask (token_inputs on meta builds no mask), left out on meta
        on_meta = profile(meta, token_inputs(meta, 16, device="cpu"), device="meta")
    except ModelProfError as e:
        _refused_for_autocast(e)
        return
    on_cpu = profile(cpu, token_inputs(cpu, 16), timing=False)
    assert on_meta.totals["macs"] == on_cpu.totals["macs"]
    assert any("attention_mask (all ones) left out" in n for n in on_meta.timing_notes)
    # the CPU also reads the mask to see it is all ones (transformers' fast_all: a sum of 16
    # elements, 16 adds, and one comparison): 17 FLOPs that meta, with no mask, does not run
    assert on_cpu.totals["flops"] - on_meta.totals["flops"] == 17


def test_a_mask_that_is_not_all_ones_is_kept_on_meta() -> None:
    kw = {
        "input_ids": torch.zeros(1, 4, dtype=torch.long),
        "attention_mask": torch.tensor([[0, 1, 1, 1]]),
    }
    model = transformers.LlamaForCausalLM(_llama_config())
    kept, note = compat.meta_mask_dropped(model, kw, torch.device("meta"))
    assert kept is kw and note is None
    ones = {**kw, "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    kept, note = compat.meta_mask_dropped(model, ones, torch.device("meta"))
    assert set(kept) == {"input_ids"} and "all ones" in note
    # on the CPU nothing is dropped
    assert compat.meta_mask_dropped(model, ones, torch.device("cpu"))[0] is ones


class _OwnConfigNeedsMask(nn.Module):
    """A model of one's own that keeps a config and requires its mask."""

    def __init__(self) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(vocab_size=100)
        self.tok = nn.Embedding(100, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.tok(input_ids) * attention_mask[..., None]


def test_a_mask_is_optional_for_a_transformers_model_not_one_that_requires_it() -> None:
    assert compat.mask_optional(transformers.LlamaForCausalLM(_llama_config()))
    own = _OwnConfigNeedsMask()
    assert not compat.mask_optional(own) and not compat.mask_optional(nn.Linear(2, 2))
    ones = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "attention_mask": torch.ones(1, 4)}
    assert compat.meta_mask_dropped(own, ones, torch.device("meta")) == (ones, None)
    # token_inputs on meta builds the mask it requires, and the count runs: 2 x 16 tokens
    # embedded (no MACs), the mask's multiply 2 x 16 x 8 = 256 FLOPs
    ids = token_inputs(own, 16, 2, device="meta")
    assert set(ids) == {"input_ids", "attention_mask"}
    assert profile(own, inputs=ids, device="meta", timing=False).totals["flops"] == 256


# -- autograd's creation order ----------------------------------------------------------------
def test_sequence_numbers_order_the_nodes_as_they_were_made() -> None:
    x = torch.ones(2, requires_grad=True)
    before = compat.next_sequence_nr()
    first = x * 2  # one node made
    second = first.sum()  # the next
    a, b = compat.node_sequence_nr(first.grad_fn), compat.node_sequence_nr(second.grad_fn)
    assert before <= a < b < compat.next_sequence_nr()


def test_a_queued_callback_runs_after_the_backward() -> None:
    ran: list[str] = []
    x = torch.ones(2, requires_grad=True)
    y = x * 3
    # queued from inside the backward (a hook on y's gradient), run when the engine is done
    y.register_hook(lambda g: compat.queue_backward_callback(lambda: ran.append("done")))
    y.sum().backward()
    assert ran == ["done"] and torch.equal(x.grad, torch.full((2,), 3.0))


def test_cuda_sleep_and_the_functional_wait_exist_on_this_torch() -> None:
    plain = torch.ones(2)
    assert compat.wait_functional_collective(plain) is plain or torch.equal(
        compat.wait_functional_collective(plain), plain
    )
    if torch.cuda.is_available():
        compat.cuda_sleep(1000)
        torch.cuda.synchronize()
    else:  # the name is there (no AttributeError); without a GPU, CUDA refuses to run it
        with pytest.raises((RuntimeError, AssertionError)):
            compat.cuda_sleep(1)


# -- errors and switches --------------------------------------------------------------------------
def test_out_of_memory_errors_are_the_ones_torch_raises() -> None:
    kinds = compat.oom_errors()
    assert torch.cuda.OutOfMemoryError in kinds
    assert (torch.OutOfMemoryError in kinds) == hasattr(torch, "OutOfMemoryError")


def test_the_eager_flex_attention_switch_is_set_and_put_back() -> None:
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    if not hasattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"):
        assert compat.eager_flex_attention(True) is None  # nothing to set on this torch
        return
    before = fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    previous = compat.eager_flex_attention(not before)
    assert previous == before and fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG == (not before)
    assert compat.eager_flex_attention(previous) == (not before)
    assert fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG == before
    assert compat.eager_flex_attention(None) is None  # None: leave it as it is


# -- torch.compile's module ---------------------------------------------------------------------
def test_compiled_original_and_a_copy_compiled_alike() -> None:
    model = nn.Linear(3, 2)
    compiled = torch.compile(model, backend="eager")
    assert compat.compiled_original(compiled) is model
    assert compat.compiled_original(model) is None
    assert compat.compiled_original(lambda x: x) is None
    twin = nn.Linear(3, 2)
    again = compat.compiled_like(compiled, twin)
    assert compat.compiled_original(again) is twin
    assert again.dynamo_ctx is compiled.dynamo_ctx  # the same backend and options
    x = torch.randn(4, 3)
    assert torch.equal(again(x), twin(x))
    with pytest.raises(TypeError, match="not a torch.compile'd module"):
        compat.compiled_like(model, twin)


def test_a_module_compiled_in_place_its_copy_compiled_alike_and_its_eager_calls() -> None:
    import copy

    model = nn.Linear(3, 2)
    assert not compat.compiled_in_place(model) and not compat.compiled_in_place(print)
    off = nn.Linear(3, 2)
    off.compile(disable=True)  # its call is its own bound _call_impl: eager, not compiled
    assert not compat.compiled_in_place(off)
    model.compile(backend="eager")
    assert compat.compiled_in_place(model)
    compiled_call = model._compiled_call_impl
    twin = copy.deepcopy(model)
    assert not compat.compiled_in_place(twin)  # a deep copy drops the compiled call
    compat.compile_in_place_like(model, twin)
    assert compat.compiled_in_place(twin)
    with torch.no_grad():
        twin.weight.zero_()
        twin.bias.fill_(1.0)
    assert torch.equal(twin(torch.randn(4, 3)), torch.ones(4, 2))  # the copy's own parameters
    with pytest.raises(ModelProfError, match="cannot compile a copy of Linear"):
        compat.compile_in_place_like(nn.Linear(3, 2), twin)  # one not compiled in place
    with compat.eager_calls([model, twin, nn.ReLU()]):
        assert not compat.compiled_in_place(model) and not compat.compiled_in_place(twin)
    assert model._compiled_call_impl is compiled_call and compat.compiled_in_place(twin)


# -- torch.distributed's private names, under the in-process fake backend --------------------
def test_the_process_group_names_under_a_fake_group() -> None:
    import torch.distributed as dist
    from torch import nn

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=compat.fake_store(), rank=0, world_size=2)
    try:
        assert hasattr(compat.default_store(), "add")
        assert compat.group_named(dist.group.WORLD.group_name).size() == 2
        ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
        # one bucket of both layers' weights and biases: 2 * (4*4 + 4) floats * 4 B = 160 B
        assert compat.ddp_bucket_sizes(ddp) == [160]
        with torch.device("meta"):
            sharded = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        with compat.default_mesh_on_cpu():
            compat.fully_shard(sharded)
        group = compat.fsdp_param_group(sharded)
        assert group.is_sharded and len(group.fsdp_params) == 4  # 2 weights, 2 biases
        # a (4, 4) weight split by rows over 2 ranks: a (2, 4) shard; a plain tensor is itself
        assert compat.local_tensor(sharded[0].weight).shape == (2, 4)
        plain = torch.ones(3)
        assert compat.local_tensor(plain) is plain
    finally:
        dist.destroy_process_group()


def test_a_functional_collective_is_finished_once_under_a_fake_group() -> None:
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    dist.init_process_group("fake", store=compat.fake_store(), rank=0, world_size=2)
    try:
        pending = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
        assert isinstance(pending, funcol.AsyncCollectiveTensor) and not pending.completed
        compat.finish_collective(pending)
        assert pending.completed  # a later use waits no more
        plain = torch.ones(2)
        compat.finish_collective(plain)  # any other tensor: as it is
    finally:
        dist.destroy_process_group()


# -- nothing outside compat.py reaches for a private torch name ---------------------------------
PRIVATE = (
    "torch._C._",
    "torch.testing._internal",
    "distributed_c10d._",
    "._get_fsdp_state",
    "._get_ddp_logging_data",
    "._local_tensor",
    "._cdata",
    "._base",
    "._sequence_nr(",
    "_get_sequence_nr",
    "_execution_engine",
    "torch.cuda._sleep",
    "_global_forward_hooks_with_kwargs",
    "_c10d_functional.wait_tensor",
    "_functional_collectives",
    "_python_dispatch",
    "torch._ops",
    "torch._subclasses",
    "torch._decomp",
    "torch._dynamo.",
    "torch.overrides._",
    "_orig_mod",
    "OptimizedModule",
    "dynamo_ctx",
    "_compiled_call_impl",
    "._schema",
    "._overloadname",
    "batchnorm._",
    "pooling._",
    "'_version'",
)


def test_no_private_torch_name_outside_the_compat_module() -> None:
    import ast

    package = os.path.join(ROOT, "modelprof")
    found = []
    for folder, _, files in os.walk(package):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path.endswith(os.path.join("runtime", "compat.py")):
                continue
            source = open(path, encoding="utf-8").read()
            # docstrings and comments may name them; code may not
            code = ast.unparse(_without_docstrings(ast.parse(source)))
            found += [f"{os.path.relpath(path, ROOT)}: {p}" for p in PRIVATE if p in code]
    assert not found, found


def _without_docstrings(tree: Any) -> Any:
    import ast

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def test_tensor_version_counts_in_place_writes_and_is_none_for_inference_tensors() -> None:
    t = torch.zeros(3)
    start = compat.tensor_version(t)
    t.add_(1)
    t[0] = 2  # two in-place writes: two versions on
    assert compat.tensor_version(t) == start + 2
    with torch.inference_mode():
        frozen = torch.zeros(3)
    assert compat.tensor_version(frozen) is None


def test_tensor_versions_read_many_at_once_and_fall_back_for_an_inference_tensor() -> None:
    a, b = torch.zeros(2), torch.zeros(2)
    start = compat.tensor_versions([a, b])
    b.mul_(2)  # one in-place write: b one version on, a none
    assert compat.tensor_versions([a, b]) == [start[0], start[1] + 1]
    with torch.inference_mode():
        frozen = torch.zeros(2)
    assert compat.tensor_versions([a, frozen]) == [start[0], None]


def test_op_schema_and_overload_name_of_an_aten_op() -> None:
    op = torch.ops.aten.addmm_.default
    schema = compat.op_schema(op)
    assert schema.name == "aten::addmm_"
    # addmm_(Tensor(a!) self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1)
    assert [a.name for a in schema.arguments] == ["self", "mat1", "mat2", "beta", "alpha"]
    assert schema.arguments[0].alias_info.is_write
    assert compat.overload_name(op) == "default"
    assert compat.overload_name(torch.ops.aten.add.Tensor) == "Tensor"


def test_torchstat_bases_cover_every_norm_and_pooling_layer() -> None:
    norms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.InstanceNorm2d, nn.SyncBatchNorm)
    assert all(issubclass(c, compat.TORCHSTAT_NORM) for c in norms)
    assert not issubclass(nn.LayerNorm, compat.TORCHSTAT_NORM)  # its own formula
    pools = (nn.MaxPool2d, nn.AvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool3d)
    assert all(issubclass(c, compat.TORCHSTAT_POOLS) for c in pools)
    assert not issubclass(nn.LPPool2d, compat.TORCHSTAT_POOLS)  # not one of torchstat's four


def test_storage_identity_is_one_per_storage_on_every_device() -> None:
    # two views of one storage share its identity and its bytes (4 float32 = 16 B); a meta
    # tensor (data pointer 0) still has one of its own, distinct from another meta tensor's
    base = torch.zeros(4)
    assert (
        compat.storage_identity(base[:2])
        == compat.storage_identity(base)
        == (
            compat.storage_identity(base)[0],
            16,
        )
    )
    a, b = torch.empty(3, device="meta"), torch.empty(3, device="meta")
    assert compat.storage_identity(a)[0] != compat.storage_identity(b)[0]


def test_view_base_is_the_tensor_a_view_was_taken_of() -> None:
    # a linear layer's backward keeps weight.t(): a view whose base is the parameter itself;
    # a tensor that is no view has none
    weight = nn.Parameter(torch.ones(3, 2))
    assert compat.view_base(weight.t()) is weight
    assert compat.view_base(weight.t()[0]) is weight  # a view of a view: the first base
    assert compat.view_base(weight) is None
    assert compat.view_base(weight * 2) is None


def test_forget_dynamo_skips_runs_on_any_torch() -> None:
    # the reset itself is shown in tests/test_counting.py (a skip planted by hand, then a
    # count, then an eager torch.cond); here: it answers a count on this torch, never raises
    assert compat.forget_dynamo_skips() >= 0


def test_a_meta_autocast_failure_names_the_torch_that_cannot(monkeypatch) -> None:
    failure = RuntimeError("unsupported scalarType")
    meta, cpu = torch.device("meta"), torch.device("cpu")
    monkeypatch.setattr(compat, "meta_autocast", lambda: False)  # as on torch 2.4 and 2.6
    assert f"torch {torch.__version__} cannot enter torch.autocast" in compat.meta_failure_hint(
        failure, meta
    )
    assert compat.meta_failure_hint(failure, cpu) == ""  # not a meta count
    assert compat.meta_failure_hint(RuntimeError("other"), meta) == ""
    monkeypatch.setattr(compat, "meta_autocast", lambda: True)
    assert compat.meta_failure_hint(failure, meta) == ""


class _TakesIds(nn.Module):
    def forward(self, ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        batch, length = ids.shape  # a 3-D tensor: "too many values to unpack"
        return ids * scale


class _PassesIds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = _TakesIds()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embeddings(ids=x, scale=2.0)


def test_call_kwargs_reads_a_failed_call_s_keywords() -> None:
    # BertEmbeddings takes input_ids= by keyword: a failure in it was described as "input no
    # tensors", the hooks having seen its positional inputs alone
    model, x = _PassesIds(), torch.zeros(1, 3, 4)
    try:
        model(x)
    except ValueError as e:
        assert compat.call_kwargs(e, model.embeddings) == {"ids": x, "scale": 2.0}
        assert compat.call_kwargs(e, model) == {}  # called positionally
    with pytest.raises(ModelProfError) as err:
        profile(model, inputs=x, timing=False)
    assert "in module 'embeddings' (_TakesIds, input ids=1x3x4); running" in str(err.value)


def test_meta_autocast_answers_what_torch_does() -> None:
    try:
        with torch.autocast("meta", enabled=False):
            entered = True
    except RuntimeError:
        entered = False
    assert compat.meta_autocast() is entered


# -- transformers: encoder-decoder caches -------------------------------------------------------
def test_new_encoder_decoder_cache_and_its_attributes() -> None:
    cache = compat.new_encoder_decoder_cache()
    assert isinstance(cache, transformers.EncoderDecoderCache) and cache.get_seq_length() == 0
    # the two caches it holds are among its attributes: in __dict__ from 4.47, in an
    # nn.Module's _modules up to 4.46
    held = [v for v in compat.cache_attributes(cache).values() if isinstance(v, transformers.Cache)]
    assert held == [cache.self_attention_cache, cache.cross_attention_cache]

    class AsModule(nn.Module):  # a cache that is an nn.Module, as up to 4.46
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Identity()
            self.is_updated = {}

    attrs = compat.cache_attributes(AsModule())
    assert isinstance(attrs["inner"], nn.Identity) and attrs["is_updated"] == {}
    assert "_modules" not in attrs
    plain = compat.cache_attributes(_Out(torch.ones(1), cache="kv"))
    assert plain["cache"] == "kv"


def test_a_cache_that_is_a_module_is_put_back_by_a_snapshot() -> None:
    from modelprof.runtime.snapshot import Snapshot

    cache = compat.new_encoder_decoder_cache()
    # an nn.Module up to 4.46, a plain object later: a cache either way, and the user's data
    assert compat.is_module_cache(cache) == isinstance(cache, nn.Module)
    assert not compat.is_module_cache(nn.Linear(2, 2))  # a model's module stays the guard's

    class ModuleCache(transformers.Cache, nn.Module):  # as up to 4.46, on any release
        def __init__(self) -> None:
            nn.Module.__init__(self)
            self.keys = [torch.zeros(1, 2)]

    held = ModuleCache()
    assert compat.is_module_cache(held)
    snap = Snapshot(held)
    held.keys.append(torch.ones(1, 2))  # a step appends a token
    snap.restore()
    assert len(held.keys) == 1 and torch.equal(held.keys[0], torch.zeros(1, 2))


def test_encoder_decoder_generation_on_this_transformers() -> None:
    model = tiny_t5()
    report = profile_generation(model, prompt_len=4, new_tokens=4, timing=False)
    # the encoder over 4 source tokens (the prompt's length), 3 layers, per token: q, k, v, o
    # 4 x 16 x 8 + wi, wo 2 x 16 x 32 + attention 2 x 2 heads x 4 x 4 = 1,600
    assert report.encoder().totals["macs"] == 3 * 4 * 1_600
    kv = report.kv
    # after decode@6: 7 decoder tokens x 2 layers x (K, V) x 2 heads x 4 x 4 B = 896 B;
    # cross-attention 4 source tokens x 2 x 2 x 2 x 4 x 4 B = 512 B
    assert kv.tokens == 7 and kv.cross_bytes == 512 and kv.total_bytes == 896 + 512

    name = compat.cache_argument(model.forward)
    lengths = []

    def step(tokens: torch.Tensor, cache: Any) -> Any:
        if cache is None:
            step.encoded = model.get_encoder()(input_ids=tokens)
            cache = compat.new_encoder_decoder_cache()
            tokens = torch.zeros((tokens.shape[0], 1), dtype=torch.long)
        lengths.append(cache.get_seq_length())
        out = model(encoder_outputs=step.encoded, decoder_input_ids=tokens, **{name: cache})
        return out.logits, compat.output_cache(out)

    report = profile_generation(model, prompt_len=4, new_tokens=4, step=step, timing=False)
    # the cache the step returns is put back after each counted step: decode@4 and @6 run
    # with 1 and 3 decoder tokens (L - 4 + 1), never with a cache grown by the steps before
    assert max(lengths) == 3 and report.kv.tokens == 4 and report.kv.cross_bytes == 512


def test_global_hooks_see_kwargs_where_torch_says_and_are_forgotten_after() -> None:
    from torch.nn.modules import module

    seen = []
    register = module.register_module_forward_hook
    if not compat.GLOBAL_HOOKS_SEE_KWARGS:  # torch 2.4-2.5: the keywords do not exist
        with pytest.raises(TypeError):
            register(lambda *a: None, with_kwargs=True, always_call=True)
        return
    handle = register(lambda m, args, kwargs, out: seen.append(kwargs), with_kwargs=True)
    try:
        torch.nn.Linear(2, 2)(input=torch.ones(2))
    finally:
        handle.remove()
        compat.forget_global_hook(handle)
    assert seen == [{"input": seen[0]["input"]}]
    torch.nn.Linear(2, 2)(torch.ones(2))  # removed and forgotten: not called again
    assert len(seen) == 1
    assert handle.id not in getattr(module, "_global_forward_hooks_with_kwargs", {})
