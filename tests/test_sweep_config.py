"""Sweep configurations: grids expanded in a fixed order, files read, bad entries named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from modelprof.distributed.sweep_config import SweepConfig, expand_grids, load_sweep
from modelprof.errors import ModelProfError
from modelprof.sweep import profile_keywords


def test_grid_expands_every_combination_models_outermost() -> None:
    configs = expand_grids(
        {"models": ["resnet18", "alexnet"], "batch_sizes": [1, 8], "dtypes": ["fp32", "bf16"]}
    )
    assert len(configs) == 8  # 2 models * 2 batch sizes * 2 dtypes * 1 mode (forward)
    assert [(c.model, c.batch_size, c.dtype) for c in configs[:4]] == [
        ("resnet18", 1, "float32"),
        ("resnet18", 1, "bfloat16"),
        ("resnet18", 8, "float32"),
        ("resnet18", 8, "bfloat16"),
    ]
    assert {c.mode for c in configs} == {"forward"} and not any(c.timing for c in configs)


def test_singular_keys_scalars_and_duplicates() -> None:
    configs = expand_grids(
        [
            {"model": "alexnet", "batch_size": 2, "dtype": "half", "mode": "backward"},
            {
                "models": ["alexnet"],
                "batch_sizes": [2],
                "dtypes": ["float16"],
                "modes": ["backward", "forward"],
            },
        ]
    )
    # the second grid repeats the first's only configuration: kept once, in first place
    assert [(c.batch_size, c.dtype, c.mode) for c in configs] == [
        (2, "float16", "backward"),
        (2, "float16", "forward"),
    ]


def test_config_round_trips_and_names_are_stable() -> None:
    c = SweepConfig(
        model="alexnet",
        batch_size=8,
        dtype="bfloat16",
        timing=True,
        input_size=(3, 64, 64),
        options=(("budget_s", 1),),
    )
    assert SweepConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert c.name.startswith("alexnet_b8_bfloat16_forward_timed_")
    other = SweepConfig(
        model="alexnet",
        batch_size=8,
        dtype="bfloat16",
        timing=True,
        input_size=(3, 64, 64),
        options=(("budget_s", 2),),
    )
    assert other.name != c.name  # any difference changes the hash part


def test_toml_and_json_files_give_the_same_configs(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[[grid]]\nmodels = ["alexnet"]\nbatch_sizes = [1, 4]\n'
        '[[grid]]\nmodels = ["vgg11"]\ntiming = true\ninput_size = [3, 32, 32]\n'
        "[grid.options]\nbudget_s = 0.5\n"
    )
    js = tmp_path / "s.json"
    js.write_text(
        json.dumps(
            [
                {"models": ["alexnet"], "batch_sizes": [1, 4]},
                {
                    "models": ["vgg11"],
                    "timing": True,
                    "input_size": [3, 32, 32],
                    "options": {"budget_s": 0.5},
                },
            ]
        )
    )
    from_toml, from_json = load_sweep(toml), load_sweep(str(js))
    assert from_toml == from_json
    assert len(from_toml) == 3  # 1*2 + 1
    assert from_toml[2].options == (("budget_s", 0.5),) and from_toml[2].input_size == (3, 32, 32)


@pytest.mark.parametrize(
    "grid, words",
    [
        ({"models": ["alexnet"], "batch_size": [0]}, ["grid 2", "batch_size", "0"]),
        ({"models": ["alexnet"], "batch_sizes": [1, 0]}, ["grid 2: batch_size=0 must be an int"]),
        ({"models": ["alexnet"], "dtypes": ["int8"]}, ["grid 2", "dtype 'int8'"]),
        ({"models": ["alexnet"], "modes": ["infer"]}, ["grid 2", "mode 'infer'"]),
        ({"models": ["alexnet"], "batch_szes": [1]}, ["grid 2", "'batch_szes'", "'batch_sizes'"]),
        ({"models": ["alexnet"], "timing": "yes"}, ["grid 2", "timing='yes'"]),
        ({"models": ["alexnet"], "timing": True, "device": "meta"}, ["grid 2", "'meta'"]),
        ({"models": ["alexnet"], "device": "gpu"}, ["grid 2", "'gpu'"]),
        ({"models": ["resnet_18"]}, ["grid 2", "'resnet_18'", "resnet18"]),
        ({"models": []}, ["grid 2", "models is empty"]),
        ({"batch_sizes": [1]}, ["grid 2", "no 'models'"]),
        ({"models": ["alexnet"], "input_size": [3, -1]}, ["grid 2", "input_size"]),
        ({"models": ["alexnet"], "input_size": [[3, True]]}, ["grid 2", "input_size"]),
        (
            {"models": ["alexnet"], "options": {"budget": 1}},
            ["grid 2", "options.budget", "'budget_s'"],
        ),
        ({"models": ["alexnet"], "options": {"dtype": "float16"}}, ["grid 2", "options.dtype"]),
        (
            {"models": ["alexnet"], "options": {"compile_kwargs": {"mode": "max-autotune"}}},
            ["grid 2", "options.compile_kwargs", "not a plain value"],
        ),
        ({"models": ["alexnet"], "model": "vgg11"}, ["grid 2", "'models' or 'model'"]),
    ],
)
def test_bad_entry_is_named(grid: dict, words: list[str]) -> None:
    with pytest.raises(ModelProfError) as info:
        expand_grids([{"models": ["alexnet"]}, grid], origin="s.toml", options=profile_keywords())
    for word in words:
        assert word in str(info.value)


def test_a_module_or_tensor_given_is_named_by_its_class_not_its_repr() -> None:
    # sweep({"models": [MyNet()]}) quoted the module's whole repr (828 characters; a trial)
    # before "must be a name such as 'resnet18'"
    net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(20)])
    for grid, words in (
        ({"models": [net]}, "model <Sequential module> must be a name such as 'resnet18'"),
        ({"models": ["alexnet"], "options": {"loss_fn": net}}, "loss_fn=<Sequential module>"),
        ({"models": ["alexnet"], "options": {"warmup": torch.ones(300)}}, "Tensor[300, float32]"),
    ):
        with pytest.raises(ModelProfError) as info:
            expand_grids([grid], origin="s.toml", options=profile_keywords())
        assert words in str(info.value) and "Linear(in_features" not in str(info.value)


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelProfError, match="does not exist"):
        load_sweep(tmp_path / "missing.toml")
    bad = tmp_path / "bad.json"
    bad.write_text('{"models": ["alexnet"],}')
    with pytest.raises(ModelProfError, match=r"bad\.json.*not valid JSON"):
        load_sweep(bad)
    yml = tmp_path / "s.yaml"
    yml.write_text("models: [alexnet]")
    with pytest.raises(ModelProfError, match=r"\.json or \.toml"):
        load_sweep(yml)
    with pytest.raises(ModelProfError, match="grid 1 is a str"):
        load_sweep(["alexnet"])
    with pytest.raises(ModelProfError, match="no grid"):
        load_sweep([])


def test_training_step_options_go_to_the_backward_mode_only() -> None:
    """modes=["forward","backward"] with options={optimizer="adam"} failed every forward
    configuration at run time (profile refuses an optimizer with backward=False)."""
    grid = {"models": ["resnet18"], "modes": ["forward", "backward"]}
    forward, backward = expand_grids({**grid, "options": {"optimizer": "adam", "repeat": 3}})
    assert (forward.mode, forward.options) == ("forward", (("repeat", 3),))
    assert (backward.mode, backward.options) == ("backward", (("optimizer", "adam"), ("repeat", 3)))
    # the forward configuration is the one a grid without the optimizer gives: it runs once
    both = expand_grids([{**grid, "options": {"optimizer": "adam"}}, grid])
    assert len(both) == 3 and both[0] == expand_grids(grid)[0]
    # a step option where no mode runs a step applies to nothing: refused before anything runs
    with pytest.raises(
        ModelProfError, match=r"options\.loss_fn sets the training step.*'backward'"
    ):
        expand_grids({"models": ["resnet18"], "options": {"loss_fn": "mse"}})


_NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")


@pytest.mark.parametrize(
    "grid, words",
    [
        ({"timing": True, "options": {"budget_s": -1}}, ["budget_s=-1 must be"]),
        pytest.param(
            {"timing": True, "device": "cuda"},
            ["device='cuda': CUDA is not available"],
            marks=_NO_CUDA,
        ),
        pytest.param(  # counted under amp: on its device too
            {"device": "cuda", "options": {"amp": "bf16"}},
            ["device='cuda': CUDA is not available"],
            marks=_NO_CUDA,
        ),
        ({"modes": ["backward"], "options": {"amp": "int8"}}, ["amp='int8' must be"]),
        ({"modes": ["backward"], "options": {"optimizer": "adamx"}}, ["'adamx' is not a torch"]),
        ({"modes": ["backward"], "options": {"target": 3}}, ["target= needs loss_fn="]),
        ({"timing": True, "options": {"transfer": True}}, ["transfer=True needs a CUDA device"]),
        (
            {"modes": ["backward"], "options": {"cuda_graph": True}},
            ["cuda_graph is not supported with backward=True"],
        ),
    ],
)
def test_option_values_are_refused_before_anything_runs(
    grid: dict, words: list[str], tmp_path: Path
) -> None:
    """A trial's budget_s=-1, device="cuda" without CUDA, amp="int8", optimizer="adamx" and
    target without loss_fn each passed the checks and became a failed row after the sweep
    ran; profile()'s own parsers now refuse them up front, with its messages."""
    from modelprof import sweep

    ran: list = []
    with pytest.raises(ModelProfError) as info:
        sweep(
            [{"models": ["alexnet"]}, {"models": ["alexnet"], **grid}],
            out=tmp_path / "out",
            on_config=lambda config, row: ran.append(row),
        )
    assert "grid 2: " in str(info.value)
    for word in words:
        assert word in str(info.value)
    assert ran == [] and not any((tmp_path / "out").rglob("*.json"))


def test_a_loss_is_named_or_given_as_a_torch_function_and_anything_else_is_refused() -> None:
    """loss_fn=F.cross_entropy was refused as 'not a plain value', and no name was taken; a
    function a result file cannot hold is refused, saying why and what is taken."""
    import torch.nn.functional as F

    from modelprof import sweep

    grid = {"models": ["alexnet"], "modes": ["backward"]}
    (named,) = expand_grids({**grid, "options": {"loss_fn": F.nll_loss}})
    assert named.options == (("loss_fn", "nll_loss"),)  # recorded by its name
    with pytest.raises(ModelProfError) as info:
        sweep({**grid, "options": {"loss_fn": lambda out: out.sum()}})
    for word in ("cannot be swept", "result files", "'cross_entropy'", "modelprof.profile"):
        assert word in str(info.value)
    with pytest.raises(ModelProfError, match=r"loss_fn='mse' is not a torch.*'mse_loss'\?"):
        sweep({**grid, "options": {"loss_fn": "mse"}})
    with pytest.raises(ModelProfError, match=r"target=\(\(1,\), \(1, 2\)\) is not one sample"):
        sweep({**grid, "options": {"loss_fn": "mse_loss", "target": [[1], [1, 2]]}})
