"""The sweep runner in one process: rows equal to profile(), failures recorded, resume."""

from __future__ import annotations

import functools
import io
import json
import re
import textwrap
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import MLP_NETS

import modelprof
from modelprof import cli, sweep
from modelprof.distributed.sweep import COUNTED_COLUMNS
from modelprof.distributed.sweep_store import write_atomic
from modelprof.errors import ModelProfError
from modelprof.models import load_model

NETS = (
    MLP_NETS
    + """
def needs_values():  # construction reads a value: cannot be built on meta
    lin = nn.Linear(10, 20)
    assert lin.weight.abs().sum().item() >= 0
    return lin
"""
)

TINY_LM = textwrap.dedent("""
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(100, 16), nn.Linear(16, 100)

        def forward(self, input_ids):
            return self.head(self.emb(input_ids))

    def build():
        return TinyLM()
    """)


@pytest.fixture
def nets(tmp_path: Path) -> Path:
    f = tmp_path / "nets.py"
    f.write_text(textwrap.dedent(NETS))
    return f


def _printed(out: str) -> list[dict[str, str]]:
    """The rows of the table ``modelprof sweep`` printed, each a dict of its cells by header
    (a column is a run of dashes in the rule under the headers)."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("-"))
    spans = [m.span() for m in re.finditer("-+", lines[at])]
    headers = [lines[at - 1][a:b].strip() for a, b in spans]
    rows = lines[at + 1 : lines.index("", at)]
    return [dict(zip(headers, (row[a:b].strip() for a, b in spans))) for row in rows]


def _grid(nets: Path, *factories: str, **extra: object) -> dict:
    return {
        "models": [f"{nets}:{f}" for f in factories],
        "batch_sizes": [1, 4],
        "dtypes": ["float32", "bfloat16"],
        **extra,
    }


def test_rows_equal_profile_totals(nets: Path) -> None:
    df = sweep(_grid(nets, "narrow", "wide"))
    assert len(df) == 8 and (df["status"] == "ok").all() and (df["device"] == "meta").all()
    assert (df["rank"] == 0).all()
    # Linear(10, 20) at batch b: 10*20*b MACs; Linear(10, 40): 10*40*b
    assert df["macs"].tolist() == [200, 200, 800, 800, 400, 400, 1600, 1600]
    for row in df.itertuples():  # the model named by file and factory, as profile names it
        model, _, size = load_model(f"{nets}:{row.model.removeprefix('nets_')}")
        totals = modelprof.profile(
            model, size, batch_size=row.batch_size, dtype=row.dtype, timing=False
        ).totals  # built on the CPU, counted there
        assert {c: getattr(row, c) for c in totals} == totals


def test_models_are_named_as_profile_names_them(nets: Path, tmp_path: Path) -> None:
    # the model column kept the spec (/tmp/.../nets.py:wide) where profile, compare, fit and
    # generate name a file's factory by file and factory (nets_wide); another folder's nets.py
    # names its wide alike, so it is told apart as compare tells its models apart
    other = tmp_path / "other"
    other.mkdir()
    (other / "nets.py").write_text(nets.read_text())
    specs = [f"{nets}:wide", f"{other / 'nets.py'}:wide", f"{nets}:narrow"]
    df = sweep({"models": specs})
    assert df["model"].tolist() == ["nets_wide", "nets_wide (2)", "nets_narrow"]
    assert df["macs"].tolist() == [400, 400, 200]  # Linear(10, 40), twice; Linear(10, 20)
    assert load_model(specs[0])[1] == "nets_wide"  # profile's name for the same spec


def test_a_language_model_is_swept_on_token_ids(tmp_path: Path) -> None:
    # a model fed token ids could not be swept: every row fed it 3x224x224 floats, and the
    # error pointed to a --tokens flag the sweep does not have
    lm = tmp_path / "lm.py"
    lm.write_text(TINY_LM)
    df = sweep({"models": [f"{lm}:build"], "batch_sizes": [1, 4], "tokens": 8})
    assert (df["status"] == "ok").all() and df["input_shape"].tolist() == ["1x8", "4x8"]
    # the head, Linear(16, 100), on 8 tokens a sequence: 8 * 16 * 100 = 12,800 MACs a sequence
    assert df["macs"].tolist() == [12_800, 4 * 12_800]
    assert df["tokens"].tolist() == [8, 8]  # a row says its sequence length
    # from its configuration: a row read back from a result file without the column (one
    # written before it was) has it too
    out = tmp_path / "out"
    sweep({"models": [f"{lm}:build"], "batch_sizes": [1, 4], "tokens": 8}, out=out)
    for f in (out / "configs").iterdir():
        data = json.loads(f.read_text())
        data["row"].pop("tokens", None)
        data["row"]["wall_s"] = -1.0  # (to see it read back, not run again)
        f.write_text(json.dumps(data))
    again = sweep({"models": [f"{lm}:build"], "batch_sizes": [1, 4], "tokens": 8}, out=out)
    assert (again["wall_s"] == -1.0).all() and again["tokens"].tolist() == [8, 8]
    # two grids of one model at two lengths: two series of batch sizes, not one
    both = sweep([{"models": [f"{lm}:build"], "tokens": t} for t in (8, 64)])
    assert both["tokens"].tolist() == [8, 64] and both["input_shape"].tolist() == ["1x8", "1x64"]
    with pytest.raises(ModelProfError, match="give input_size .* or tokens .*not both"):
        sweep({"models": [f"{lm}:build"], "tokens": 8, "input_size": [8]})
    with pytest.raises(ModelProfError, match="tokens"):
        sweep({"models": [f"{lm}:build"], "tokens": 0})


def test_failure_is_a_row_and_the_others_go_on(nets: Path) -> None:
    df = sweep(_grid(nets, "broken", "narrow"))
    failed = df[df["status"] == "error"]
    # named by file and factory though it never built (as the rows that did)
    assert len(failed) == 4 and set(failed["model"]) == {"nets_broken"}
    assert failed["error"].str.contains("ModelProfError").all()
    assert failed["macs"].isna().all()
    assert (df.loc[df["status"] == "ok", "macs"] > 0).all() and len(df) == 8


def test_a_model_that_needs_values_is_built_on_the_cpu(nets: Path) -> None:
    df = sweep({"models": [f"{nets}:needs_values"]})
    # built on the CPU after meta refused, then counted on a meta copy: 10*20 = 200 MACs
    assert df["status"].tolist() == ["ok"] and df["macs"].tolist() == [200]


def test_results_are_written_per_config_and_resumed(nets: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = sweep(_grid(nets, "narrow"), out=out)
    files = sorted((out / "configs").iterdir())
    assert len(files) == 4 and sorted(p.name for p in out.iterdir()) == [
        "configs",
        "sweep.csv",
        "sweep.json",
    ]
    # mark one stored row: a resumed sweep must hand it back instead of running it again
    data = json.loads(files[0].read_text())
    data["row"]["wall_s"] = -1.0
    files[0].write_text(json.dumps(data))
    again = sweep(_grid(nets, "narrow"), out=out)
    assert (again["wall_s"] == -1.0).sum() == 1
    assert again.drop(columns=["wall_s", "start_time"]).equals(
        first.drop(columns=["wall_s", "start_time"])
    )
    fresh = sweep(_grid(nets, "narrow"), out=out, resume=False)
    assert (fresh["wall_s"] >= 0).all()
    table = pd.read_csv(out / "sweep.csv")
    assert table["macs"].tolist() == fresh["macs"].tolist()  # 200, 200, 800, 800


def test_a_timed_row_is_read_back_only_at_the_thread_count_it_was_timed_at(
    nets: Path, tmp_path: Path
) -> None:
    # a newcomer's rerun with --threads 1, to mend timings taken on 2 threads, read the
    # 2-thread timings back: the thread count is part of what a timed row measured
    out = tmp_path / "out"
    grid = {
        "models": [f"{nets}:narrow"],
        "timing": True,
        "options": {"repeat": 3, "warmup": 1, "roofline": False},
    }
    sweep(grid, out=out)
    (path,) = (out / "configs").iterdir()
    data = json.loads(path.read_text())
    assert data["row"]["threads"] == torch.get_num_threads()
    data["row"]["wall_s"] = -1.0  # planted: read back, or run again
    path.write_text(json.dumps(data))
    assert sweep(grid, out=out)["wall_s"].tolist() == [-1.0]  # same threads: read back
    data["row"]["threads"] = torch.get_num_threads() + 1
    path.write_text(json.dumps(data))
    assert sweep(grid, out=out)["wall_s"].iloc[0] >= 0  # timed at another count: run again


def test_a_damaged_or_foreign_result_file_is_run_again(nets: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sweep({"models": [f"{nets}:narrow"]}, out=out)
    (path,) = (out / "configs").iterdir()
    path.write_text('{"format": 1, "config": {')  # a half file (never left by write_atomic)
    df = sweep({"models": [f"{nets}:narrow"]}, out=out)
    assert df["macs"].tolist() == [200] and json.loads(path.read_text())["row"]["macs"] == 200
    # a whole file of the earlier meaning (format 1: a median's interval cut to the samples'
    # range at any number of blocks) is run again, not mixed into the table: its planted
    # macs=-1 is gone
    data = json.loads(path.read_text())
    data["format"], data["row"]["macs"] = 1, -1
    path.write_text(json.dumps(data))
    assert sweep({"models": [f"{nets}:narrow"]}, out=out)["macs"].tolist() == [200]
    # valid JSON of another shape (a list, a number, a row that is no record, none at all):
    # run again too, where it raised AttributeError, TypeError or KeyError
    whole = json.loads(path.read_text())
    for other in ([], 3, None, {**whole, "row": 3}, {k: v for k, v in whole.items() if k != "row"}):
        path.write_text(json.dumps(other))
        assert sweep({"models": [f"{nets}:narrow"]}, out=out)["macs"].tolist() == [200]


def test_failed_configs_are_kept_unless_retried(nets: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    grid = {"models": [f"{nets}:broken"]}
    sweep(grid, out=out)
    assert len(list((out / "configs").iterdir())) == 1
    # the model file is fixed: a plain rerun keeps the recorded failure, a retry runs it
    nets.write_text(textwrap.dedent(NETS).replace("nn.Linear(11, 40)", "nn.Linear(10, 40)"))
    assert sweep(grid, out=out)["status"].tolist() == ["error"]
    retried = sweep(grid, out=out, retry_failed=True)
    assert retried["status"].tolist() == ["ok"] and retried["macs"].tolist() == [400]  # 10*40


def test_write_atomic_leaves_only_the_file(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    write_atomic(target, "one")
    write_atomic(target, "two")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"] and target.read_text() == "two"


def test_backward_mode_and_timed_config(nets: Path) -> None:
    df = sweep(
        [
            {"models": [f"{nets}:narrow"], "modes": ["forward", "backward"]},
            {
                "models": [f"{nets}:narrow"],
                "timing": True,
                "options": {"repeat": 5, "warmup": 1, "roofline": False},
            },
        ]
    )
    fwd, bwd, timed = df.to_dict(orient="records")
    assert pd.isna(fwd["backward_macs"])
    # backward of Linear(10, 20) at batch 1: the input needs no gradient, so only the
    # weight's: 1*10*20 = 200 MACs
    assert bwd["backward_macs"] == 200
    assert timed["device"] == "cpu" and timed["latency_median_ms"] > 0
    assert timed["macs"] == fwd["macs"] == 200
    assert set(COUNTED_COLUMNS[:7]) <= set(df.columns)


def test_a_counted_configuration_under_amp_is_counted_on_its_device(nets: Path) -> None:
    """A trial's modes=["backward"], options={amp="bf16"} failed every row: 'amp cannot be
    emulated on device='meta'', and a sweep had no way to count on the CPU. Counting under
    amp runs on the grid's device (the CPU by default), as profile(amp=...) does."""
    df = sweep({"models": [f"{nets}:narrow"], "modes": ["backward"], "options": {"amp": "bf16"}})
    row = df.iloc[0]
    assert (row["status"], row["device"], row["timing"]) == ("ok", "cpu", False), row["error"]
    model, _, size = load_model(f"{nets}:narrow")
    totals = modelprof.profile(
        model, size, backward=True, amp="bf16", device="cpu", timing=False
    ).totals
    assert {c: row[c] for c in totals} == totals
    # without amp a counted configuration stays on meta
    assert sweep({"models": [f"{nets}:narrow"]})["device"].tolist() == ["meta"]


def test_a_timed_row_says_whether_load_stretched_it(nets: Path, monkeypatch, capsys) -> None:
    # a newcomer's sweep on a busy 2-core machine read 6.5 ms for a 25 us model with nothing in
    # the row or the printed table to say so: latency_loaded carries the measurement's verdict
    from modelprof.cli import main
    from modelprof.timing.measurement import Measurement

    grid = {"models": [f"{nets}:narrow"], "timing": True, "options": {"repeat": 3}}
    assert sweep(grid)["latency_loaded"].dtype == bool  # the verdict, whichever it is
    monkeypatch.setattr(Measurement, "loaded", property(lambda m: True))  # load, for certain
    assert sweep(grid)["latency_loaded"].tolist() == [True]
    config = nets.parent / "grid.json"
    config.write_text(json.dumps(grid))
    assert main(["sweep", str(config), "--out", str(nets.parent / "out")]) == 0
    (row,) = _printed(capsys.readouterr().out)
    assert row["latency loaded"] == "yes"  # (its own column: timing is yes too)


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelProfError, match="resume=1"):
        sweep({"models": ["alexnet"]}, resume=1)  # type: ignore[arg-type]
    with pytest.raises(ModelProfError, match="timeout_s=0"):
        sweep({"models": ["alexnet"]}, timeout_s=0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ModelProfError, match="is a file"):
        sweep({"models": ["alexnet"]}, out=blocker / "out")


def test_command_line_prints_the_table_and_writes_files(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from modelprof.cli import main

    config = tmp_path / "grid.toml"
    config.write_text(f'models = ["{nets}:narrow", "{nets}:broken"]\nbatch_sizes = [1, 4]\n')
    # a run with failed configurations fails (exit 1), after writing what succeeded
    assert main(["sweep", str(config), "--out", str(tmp_path / "out")]) == 1
    out_csv = tmp_path / "out" / "sweep.csv"
    captured = capsys.readouterr()
    # (the printed table leaves the error column out: the footer names the file holding it)
    said = f"4 configurations: 2 ok, 2 failed (their errors: the error column of {out_csv})"
    assert said in captured.out and " error " not in captured.out.splitlines()[0]
    # no terminal (stderr captured): one line per finished configuration instead of a bar
    done = [line for line in captured.err.splitlines() if line.startswith("modelprof: sweep: ")]
    assert len(done) == 4 and sum(line.endswith(": ok") for line in done) == 2
    assert f"wrote {tmp_path / 'out' / 'sweep.csv'}" in captured.err
    table = pd.read_csv(tmp_path / "out" / "sweep.csv")
    assert table["macs"].tolist()[:2] == [200, 800]  # 10*20*1, 10*20*4


def test_command_line_names_the_bad_entry(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from modelprof.cli import main

    config = tmp_path / "grid.toml"
    config.write_text(
        '[[grid]]\nmodels = ["alexnet"]\n[[grid]]\nmodels = ["alexnet"]\ndtypes = ["float8"]\n'
    )
    assert main(["sweep", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{config}: grid 2: dtypes: dtype 'float8' is not one of" in err
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written


def test_ranks_that_cannot_meet_fail_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch, nets: Path
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    start = time.monotonic()
    with pytest.raises(ModelProfError, match="sweep: "):  # rank 1 never comes
        sweep({"models": [f"{nets}:narrow"]}, timeout_s=2)
    assert time.monotonic() - start < 60  # bounded by timeout_s, not the 30-minute default


@pytest.mark.parametrize(
    "env, words",
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"WORLD_SIZE": "2", "RANK": ""}, "WORLD_SIZE=2 but RANK=''"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, "WORLD_SIZE=2 but RANK='2'"),
    ],
)
def test_a_bad_launch_environment_is_named(
    monkeypatch: pytest.MonkeyPatch, nets: Path, env: dict, words: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ModelProfError, match=words):
        sweep({"models": [f"{nets}:narrow"]})


def test_timed_configs_are_refused_under_a_callers_group(
    monkeypatch: pytest.MonkeyPatch, nets: Path
) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(
        ModelProfError,
        match=r"timed configurations cannot run under an "
        r"initialised process group \(world size 2\)",
    ):
        sweep({"models": [f"{nets}:narrow"], "timing": True})


def test_cuda_means_the_local_rank_and_counting_means_meta() -> None:
    from modelprof.distributed.sweep import _device, _gpu_key
    from modelprof.distributed.sweep_config import SweepConfig
    from modelprof.distributed.sweep_ranks import SweepRanks

    ranks = SweepRanks(rank=3, world_size=4, local_rank=1)
    assert _device(SweepConfig("alexnet", timing=True, device="cuda"), ranks) == "cuda:1"
    assert _device(SweepConfig("alexnet", timing=True, device="cuda:0"), ranks) == "cuda:0"
    assert _device(SweepConfig("alexnet", timing=False, device="cuda"), ranks) == "meta"
    amp = SweepConfig("alexnet", timing=False, device="cuda", options=(("amp", "bf16"),))
    assert _device(amp, ranks) == "cuda:1"  # counted under amp: on its device
    if not torch.cuda.is_available():
        assert _gpu_key("cuda:1") == "cuda1"  # without CUDA the index is all there is


def test_the_device_lock_admits_one_holder_at_a_time() -> None:
    import threading

    from modelprof.distributed.sweep import _device_lock

    times: dict[str, float] = {}
    b_waiting = threading.Event()

    def holder() -> None:
        with _device_lock("cpu"):
            times["a_in"] = time.monotonic()
            b_waiting.wait(10)
            time.sleep(0.2)  # B is blocked on the lock meanwhile (if the lock works)
            times["a_out"] = time.monotonic()

    def waiter() -> None:
        b_waiting.set()
        with _device_lock("cpu"):
            times["b_in"] = time.monotonic()

    a = threading.Thread(target=holder)
    a.start()
    while "a_in" not in times:
        time.sleep(0.01)
    b = threading.Thread(target=waiter)
    b.start()
    a.join(30)
    b.join(30)
    assert times["b_in"] >= times["a_out"]  # B entered only after A left


def test_every_sweep_option_has_help(capsys: pytest.CaptureFixture) -> None:
    from modelprof import cli

    assert cli.main(["sweep", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["sweep"]
    for action in sub._actions:
        assert action.help, f"sweep: {action.option_strings or action.dest} has no help"
    assert "(default: 1800.0)" in out and "CONFIG's name + '_sweep'" in out


def test_a_sweep_whose_configurations_all_ran_exits_0(nets: Path, tmp_path: Path) -> None:
    from modelprof.cli import main

    config = tmp_path / "grid.toml"
    config.write_text(f'models = ["{nets}:narrow"]\n')
    assert main(["sweep", str(config), "--out", str(tmp_path / "out")]) == 0


def test_a_rerun_says_which_rows_it_read_back_from_the_earlier_run(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from modelprof.cli import main

    # a newcomer's second `modelprof sweep` printed the same "ok" lines and wall_s as the
    # first, with nothing to say that both rows were read back from its --out folder
    config, out = tmp_path / "grid.toml", tmp_path / "out"
    config.write_text(f'models = ["{nets}:narrow", "{nets}:wide"]\n')
    runs = []
    for extra in ([], [], ["--no-resume"]):
        assert main(["sweep", str(config), "--out", str(out), *extra]) == 0
        runs.append(capsys.readouterr())
    first, again, fresh = runs
    said = f"(read back from an earlier run in {out}; --no-resume runs it again)"
    assert "read back" not in first.err + first.out + fresh.err + fresh.out
    lines = [line for line in again.err.splitlines() if line.startswith("modelprof: sweep: ")]
    assert len(lines) == 2 and all(line.endswith(f": ok {said}") for line in lines)
    assert f"; 2 read back from an earlier run in {out} (--no-resume" in again.out
    # sweep()'s on_config is told so in the row it gets (read_back=True), not by clocks
    seen: dict[str, bool] = {}
    grid = {"models": [f"{nets}:narrow", f"{nets}:wide"]}
    df = sweep(grid, out=out, on_config=lambda c, row: seen.update({c.name: row.get("read_back")}))
    assert len(seen) == 2 and all(seen.values())
    assert df.attrs["read_back"] == list(seen)  # every rank's, gathered: both, in order
    fresh_df = sweep(
        grid,
        out=out,
        resume=False,
        on_config=lambda c, row: seen.update({c.name: "read_back" in row}),
    )
    assert not any(seen.values()) and fresh_df.attrs["read_back"] == []


def test_a_config_nested_too_deeply_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from modelprof.cli import main

    config = tmp_path / "deep.json"
    config.write_text('{"models": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["sweep", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is nested too deeply" in err and "Traceback" not in err
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ModelProfError, match="nested too deeply"):
        sweep({"models": ["alexnet"], "options": {"repeat": deep}})


def test_a_folder_where_a_result_goes_is_refused_before_anything_runs(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from modelprof.cli import main
    from modelprof.distributed.sweep_config import load_sweep
    from modelprof.sweep import profile_keywords

    config = tmp_path / "grid.toml"
    config.write_text(f'models = ["{nets}:narrow"]\n')
    (c,) = load_sweep(config, options=profile_keywords())
    blocker = tmp_path / "out" / "configs" / f"{c.name}.json"
    blocker.mkdir(parents=True)
    assert main(["sweep", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is not a file" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "sweep.csv").exists()


def test_a_formula_model_cell_is_written_inert(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:

    monkeypatch.chdir(tmp_path)
    (tmp_path / "=cmd.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Linear(10, 20)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    df = sweep({"models": ["=cmd.py:build"], "input_size": [10]}, out=tmp_path / "out")
    assert df["status"].tolist() == ["ok"], df["error"].tolist()
    text = (tmp_path / "out" / "sweep.csv").read_text()
    # the model named by file and factory (=cmd.py:build -> =cmd_build), still a formula
    assert "\n'=cmd_build," in text and "\n=cmd_build" not in text


def test_an_optimizer_in_a_forward_and_backward_grid_runs_every_configuration(
    nets: Path, tmp_path: Path
) -> None:
    """The newcomer's TOML: every forward configuration failed with 'optimizer given with
    backward=False'; the optimizer now goes to the training step alone."""
    toml = tmp_path / "grid.toml"
    toml.write_text(
        f'models = ["{nets}:narrow"]\nmodes = ["forward", "backward"]\n'
        'options = {optimizer = "adam"}\n'
    )
    df = sweep(toml)
    assert df["status"].tolist() == ["ok", "ok"] and df["mode"].tolist() == ["forward", "backward"]
    # Linear(10, 20) at batch 1: 200 MACs forward; the backward computes the weight's gradient
    # alone (the input needs none): 1 x 10 x 20 = 200 MACs
    assert df["macs"].tolist() == [200, 200] and df["backward_macs"].iloc[1] == 200


def test_a_configuration_without_options_reads_them_as_empty_from_every_reader(
    nets: Path, tmp_path: Path
) -> None:
    # the forward rows of a grid whose options are the step's have none: NaN in the returned
    # frame and through read_json, "" through read_csv (as a row's error and warnings read)
    from modelprof.render import read_csv, read_json

    toml = tmp_path / "grid.toml"
    toml.write_text(
        f'models = ["{nets}:narrow"]\nmodes = ["forward", "backward"]\n'
        'options = {optimizer = "adam"}\n'
    )
    df = sweep(toml, out=tmp_path / "out")
    assert df["options"].tolist() == ["", "{'optimizer': 'adam'}"]
    for back in (
        read_csv(tmp_path / "out" / "sweep.csv"),
        read_json(tmp_path / "out" / "sweep.json")[0],
    ):
        assert back["options"].tolist() == df["options"].tolist()


def test_a_loss_named_in_the_file_or_given_as_the_function_trains_on_its_target(
    nets: Path, tmp_path: Path
) -> None:
    """A trial's options={loss_fn="cross_entropy", target=3} failed ('is not callable'), and in
    Python loss_fn=F.cross_entropy was refused as 'not a plain value': a sweep could train on
    the sum of the outputs alone. A torch.nn.functional loss is named (or given, in Python, as
    the function: recorded by its name); target is one sample's, repeated over the batch."""
    toml = tmp_path / "grid.toml"
    toml.write_text(
        f'models = ["{nets}:narrow"]\nbatch_sizes = [1, 4]\nmodes = ["backward"]\n'
        'options = {loss_fn = "cross_entropy", target = 3, optimizer = "sgd"}\n'
    )
    df = sweep(toml)
    assert df["status"].tolist() == ["ok", "ok"], df["error"].tolist()
    model, _, size = load_model(f"{nets}:narrow")
    for row in df.itertuples():
        totals = modelprof.profile(
            model,
            size,
            batch_size=row.batch_size,
            backward=True,
            loss_fn=torch.nn.functional.cross_entropy,
            target=torch.full((row.batch_size,), 3),
            optimizer="sgd",
            timing=False,
        ).totals
        assert {c: getattr(row, c) for c in totals} == totals
    summed = modelprof.profile(model, size, backward=True, optimizer="sgd", timing=False)
    assert df["flops"].iloc[0] != summed.totals["flops"]  # not the default loss
    # in Python, the function itself: the same configurations (its name is what is recorded)
    grid = {
        "models": [f"{nets}:narrow"],
        "batch_sizes": [1, 4],
        "modes": ["backward"],
        "options": {"loss_fn": torch.nn.functional.cross_entropy, "target": 3, "optimizer": "sgd"},
    }
    again = sweep(grid)
    cols = ["flops", "backward_flops", "options"]
    pd.testing.assert_frame_equal(again[cols], df[cols])
    # a float target is one sample's values, in the configuration's dtype
    mse = sweep(
        {
            "models": [f"{nets}:narrow"],
            "batch_sizes": [2],
            "dtypes": ["bfloat16"],
            "modes": ["backward"],
            "options": {"loss_fn": "mse_loss", "target": [0.5] * 20},
        }
    )
    assert mse["status"].tolist() == ["ok"] and mse["warnings"].tolist() == [""]


def test_a_timed_training_step_row_carries_its_optimizer_and_whole_step_medians(
    nets: Path,
) -> None:
    # a newcomer's backward rows had the forward's and the backward's latency alone; compare()
    # gave the optimizer's and the whole step's too
    df = sweep(
        {
            "models": [f"{nets}:narrow"],
            "modes": ["backward"],
            "timing": True,
            "options": {"optimizer": "adam", "repeat": 5, "warmup": 1, "roofline": False},
        }
    )
    row = df.iloc[0]
    for name in ("backward", "optimizer", "step"):
        assert row[f"{name}_latency_median_ms"] > 0
        assert f"{name}_latency_ci_low_ms" in df.columns
    # the whole step is its phases back to back: longer than its backward and optimizer
    assert row["step_latency_median_ms"] > row["optimizer_latency_median_ms"]


def test_the_sweeps_json_reads_back_exactly_with_modelprofs_reader(nets: Path, tmp_path: Path):
    # a newcomer's read_json("sweep_out/sweep.json") was refused (a plain list of records), and
    # modelprof's own JSON could not read back a count column with a failed row's <NA> (Int64)
    from modelprof.render import read_json

    out = tmp_path / "out"
    df = sweep(_grid(nets, "narrow", "broken"), out=out)
    assert df["macs"].dtype == "Int64" and df["macs"].isna().any()  # the broken rows have none
    back, totals, env = read_json(out / "sweep.json")
    pd.testing.assert_frame_equal(back, df)
    # (a trial's sweep.json stored "env": null: no torch version or CPU, as every other has)
    assert totals is None and env == df.attrs["env"]
    assert env["torch_version"] == torch.__version__ and env["device"] == "cpu"


def test_a_timed_sweep_reads_back_its_threads_and_root_latency(
    nets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a trial's sweep stored threads as 2.0 (float64) and, its clean median slowed, said
    # "quote the (root) row" with no column holding that row's latency (only the warnings'
    # text): threads is a whole number (<NA> for a counted row), root_latency_ms the report's
    # (root) row, and both read back as the frame holds them from the CSV and the JSON
    import sys

    from modelprof.render import read_csv, read_json

    sweep_module = sys.modules["modelprof.sweep"]  # (the package's "sweep" is the function)

    reports: list = []
    real = sweep_module.profile

    @functools.wraps(real)  # (its signature: the keywords a grid's options may give)
    def kept(*args: object, **kwargs: object) -> object:
        reports.append(real(*args, **kwargs))
        return reports[-1]

    monkeypatch.setattr(sweep_module, "profile", kept)
    options = {"repeat": 5, "warmup": 1, "roofline": False, "warn": False}
    counted = {"models": [f"{nets}:narrow"], "batch_sizes": [1]}
    df = sweep([counted, {**counted, "timing": True, "options": options}], out=tmp_path / "out")
    assert df["threads"].dtype == "Int64"
    assert df["threads"].isna().tolist() == [True, False]
    assert df["threads"].iloc[1] == torch.get_num_threads()
    table = reports[1].to_dataframe()  # (reports[0]: the counted row's)
    root = table.loc[table["module"] == "", "latency_ms"].iloc[0]
    assert df["root_latency_ms"].iloc[1] == root > 0 and pd.isna(df["root_latency_ms"].iloc[0])
    for back in (
        read_csv(tmp_path / "out" / "sweep.csv"),
        read_json(tmp_path / "out" / "sweep.json")[0],
    ):
        assert back.dtypes.to_dict() == df.dtypes.to_dict()
        pd.testing.assert_frame_equal(back, df)


def test_the_sweeps_csv_reads_back_exactly_with_modelprofs_reader(nets: Path, tmp_path: Path):
    # pandas.read_csv reads the "" of a row that ran (error) or said nothing (warnings) as NaN;
    # modelprof's read_csv did too for a column of "" only, and read a failed row's missing
    # input shape as ""; and the whole numbers, Int64 in the frame failed row or not, read
    # back int64 where no row failed, and tokens float64 where a grid gave none
    from modelprof.render import read_csv

    lm = tmp_path / "lm.py"
    lm.write_text(TINY_LM)
    tokens = {"models": [f"{lm}:build"], "tokens": 8}  # the nets' rows have no tokens: <NA>
    df = sweep([_grid(nets, "narrow", "broken"), tokens], out=tmp_path / "out")
    assert "" in df["error"].tolist() and "" in df["warnings"].tolist()
    assert df["input_shape"].isna().any() and df["macs"].isna().any()  # the broken rows'
    pd.testing.assert_frame_equal(read_csv(tmp_path / "out" / "sweep.csv"), df)
    ran = sweep([_grid(nets, "narrow"), tokens], out=tmp_path / "ran")  # every error ""
    assert (ran["error"] == "").all() and (ran["warnings"] == "").all()
    assert ran["macs"].notna().all() and ran["tokens"].isna().any()
    back = read_csv(tmp_path / "ran" / "sweep.csv")
    assert back.dtypes.to_dict() == ran.dtypes.to_dict()
    pd.testing.assert_frame_equal(back, ran)


def test_a_loaded_rows_cpu_work_is_a_column() -> None:
    # a newcomer's sweep row read 78.0 ms, its warnings cell saying to quote the CPU work,
    # median 38.954 ms, which no column held: it is cpu_work_median_ms where the run was loaded
    import numpy as np

    from modelprof.sweep import _latency
    from modelprof.timing import Measurement

    wall, cpu = np.full(8, 4.0), np.full(8, 2.0)  # wall/CPU 2: the work waited for a core
    loaded = Measurement(wall, cpu_ms=cpu, cpu_clock="thread_time")  # one thread's work
    assert loaded.loaded and loaded.cpu_holds
    assert _latency("latency", loaded)["cpu_work_median_ms"] == 2.0
    assert _latency("backward_latency", loaded)["backward_cpu_work_median_ms"] == 2.0
    quiet = Measurement(wall, cpu_ms=wall)  # wall = CPU: nothing to quote instead
    assert not quiet.loaded and np.isnan(_latency("latency", quiet)["cpu_work_median_ms"])
    # several threads' CPU work, stretched by the load too: its warning quotes none (review)
    threads = Measurement(wall, cpu_ms=cpu, competing_cores=1.5, cpu_thread_share=0.3)
    assert threads.loaded and not threads.cpu_holds
    assert np.isnan(_latency("latency", threads)["cpu_work_median_ms"])


def test_rows_of_two_sequence_lengths_are_two_series_of_batch_sizes() -> None:
    # batch 1 at 8 tokens read 100 ms, batch 2 at 64 tokens 10 ms: across one series batch 1
    # would read slower than a bigger batch beyond both intervals and be marked rough; its
    # tokens make them two series (and input_size likewise), each of one point
    from modelprof.distributed.sweep import _mark_neighbours

    def row(batch: int, ms: float, **given: object) -> dict:
        return {
            "model": "lm.py:build", "batch_size": batch, "dtype": "float32", "mode": "forward",
            "device": "cpu", "latency_median_ms": ms, "latency_ci_low_ms": 0.99 * ms,
            "latency_ci_high_ms": 1.01 * ms, "latency_n": 10, **given,
        }  # fmt: skip

    one = pd.DataFrame([row(1, 100.0), row(2, 10.0)])
    _mark_neighbours(one, "latency")
    assert one["latency_rough"].tolist() == [True, False]  # one series: 100 ms above 10 ms
    for key, values in (("tokens", (8, 64)), ("input_size", ("(8,)", "(64,)"))):
        two = pd.DataFrame([row(1, 100.0, **{key: values[0]}), row(2, 10.0, **{key: values[1]})])
        _mark_neighbours(two, "latency")
        assert not two["latency_rough"].any(), key


@pytest.mark.parametrize("terminal", [True, False])
def test_a_sweeps_lines_come_from_every_rank_only_where_rank_0_shows_no_bar(
    terminal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # on a terminal rank 0 shows the bar and no rank prints lines (they would cut through the
    # bar); without one every rank prints the lines of the configurations it ran
    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return terminal

    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        args = cli.build_parser().parse_args(["sweep", "grid.toml"])
        ctx = cli._Context(args, io.StringIO(), Stream())
        assert ctx.progress is (terminal and rank == "0")
        lines = ctx.step_lines(lambda *step: "x", every_rank=True)
        assert (lines is None) is terminal


def test_a_row_its_report_will_not_quote_is_rough_and_says_why() -> None:
    # a trial's timed sweep: the batch-4 backward row read 15.8 ms, loaded, its own warning
    # saying to quote the (root) row, while latency_rough was False (only the neighbour check
    # set it). A row whose report marks its end-to-end median ~ is rough, the reason beside it;
    # one that is a figure to quote ("") is not, and a frame saved before the column, neither
    from modelprof.distributed.sweep import _mark_neighbours

    def row(batch: int, ms: float, why: str) -> dict:
        return {
            "model": "m.py:build", "batch_size": batch, "dtype": "float32", "mode": "forward",
            "device": "cpu", "latency_median_ms": ms, "latency_ci_low_ms": 0.99 * ms,
            "latency_ci_high_ms": 1.01 * ms, "latency_n": 10, "latency_unquotable": why,
        }  # fmt: skip

    # 1 ms at batch 1 and 2 ms at batch 2: no neighbour above a bigger batch's
    frame = pd.DataFrame([row(1, 1.0, ""), row(2, 2.0, "the machine was loaded")])
    _mark_neighbours(frame, "latency")
    assert frame["latency_rough"].tolist() == [False, True]
    old = frame.drop(columns=["latency_unquotable", "latency_rough"])
    _mark_neighbours(old, "latency")
    assert not old["latency_rough"].any()


def test_measure_config_records_why_a_median_is_no_figure_to_quote(monkeypatch) -> None:
    # the row's reason is its report's own (the end-to-end row's ~ in every export), "" for
    # a figure to quote: here the report is made to say it, whatever the machine did
    import modelprof.report.report as report_module
    from modelprof.distributed.sweep_config import SweepConfig
    from modelprof.sweep import measure_config

    options = (("repeat", 3), ("roofline", False), ("warmup", 1), ("warn", False))
    config = SweepConfig(
        "torchvision:resnet18", timing=True, input_size=(3, 32, 32), options=options
    )
    unquotable = property(lambda self: "too few runs")
    monkeypatch.setattr(report_module.Report, "latency_unquotable", unquotable)
    assert measure_config(config, "cpu")["latency_unquotable"] == "too few runs"
    monkeypatch.setattr(report_module.Report, "latency_unquotable", property(lambda s: None))
    assert measure_config(config, "cpu")["latency_unquotable"] == ""


def test_the_printed_table_marks_a_rough_median_and_shows_the_root_row(
    nets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # it printed df.to_string(): a rough median as a plain number (27.7, its row's
    # latency_rough unseen), a missing one NaN, and no root_latency_ms, the figure the reason
    # says to quote; every other printed table marks it ~ and says n/a
    import modelprof.report.report as report_module
    from modelprof.cli import main
    from modelprof.render.units import format_time_ms

    rough = property(lambda self: "too few runs")  # the report says so, whatever the machine
    monkeypatch.setattr(report_module.Report, "latency_unquotable", rough)
    config = tmp_path / "grid.json"
    timed = {"models": [f"{nets}:narrow"], "timing": True, "options": {"repeat": 3}}
    config.write_text(json.dumps([timed, {"models": [f"{nets}:narrow"]}]))
    assert main(["sweep", str(config), "--out", str(tmp_path / "out")]) == 0
    printed = _printed(capsys.readouterr().out)
    stored = pd.read_csv(tmp_path / "out" / "sweep.csv")
    assert stored["latency_rough"].tolist() == [True, False]  # timed and rough; counted only
    assert [row["timing"] for row in printed] == ["yes", "no"]
    median, root = stored.loc[0, "latency_median_ms"], stored.loc[0, "root_latency_ms"]
    assert printed[0]["latency median"] == "~" + format_time_ms(median)  # rough: marked
    assert printed[0]["(root) latency"] == format_time_ms(root)  # the one to quote: plain
    # the counted configuration has no latency: n/a, as in every other human table
    assert printed[1]["latency median"] == printed[1]["(root) latency"] == "n/a"
    assert printed[1]["MACs"] == "200"  # Linear(10, 20), one sample: 10*20


def test_a_timed_rows_warnings_are_its_own_on_every_rank(
    nets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a trial's 2-rank timed sweep: rank 1's loaded rows held warnings "" (their
    # latency_unquotable saying loaded), rank 0's the LoadedMachineWarning: profile()'s one
    # voice silenced every rank but 0 inside the row's record of what it warned. Each rank's
    # configuration is its own: its row holds what it warned, whichever rank ran it
    from modelprof.distributed.sweep import run_config
    from modelprof.distributed.sweep_config import SweepConfig
    from modelprof.distributed.sweep_ranks import SweepRanks
    from modelprof.sweep import measure_config
    from modelprof.timing.measurement import Measurement

    monkeypatch.setattr(Measurement, "loaded", property(lambda m: True))  # load, for certain
    monkeypatch.delenv("MODELPROF_ALL_RANKS", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = SweepConfig(f"{nets}:narrow", timing=True, options=(("repeat", 3),))
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))  # what torchrun sets: rank 1 is no speaker
        row = run_config(config, measure_config, SweepRanks(rank, 2))
        # a loaded measurement's warning says so, as its own or appended to another's
        assert "the machine was loaded (" in row["warnings"], rank


def test_a_rows_warnings_read_alike_each_once() -> None:
    # a trial's row read "noisy timing of TinyViT ...; modelprof: the per-layer passes ...":
    # only the second of its warnings opened with "modelprof:". The cell drops that opening
    # from every message (the column is modelprof's), and says a repeated message once
    from modelprof.distributed.sweep import run_config
    from modelprof.distributed.sweep_config import SweepConfig

    def measure(config: SweepConfig, device: str) -> dict:
        for text in ("noisy timing", "modelprof: they DISAGREE", "noisy timing"):
            warnings.warn(text, UserWarning)
        return {}

    row = run_config(SweepConfig("alexnet"), measure)
    assert row["warnings"] == "noisy timing; they DISAGREE"  # 3 warned, 2 distinct


def test_who_ran_a_row_is_its_last_four_columns(nets: Path, tmp_path: Path) -> None:
    # a trial's CSV ended "..., wall_s, latency_rough": the neighbour marks, added once the
    # frame was built, came after the columns the docs list last. Every per-run column comes
    # first, then options and warnings, then who ran it, when and for how long
    grid = {"models": [f"{nets}:narrow"], "timing": True, "options": {"repeat": 3}}
    df = sweep(grid, out=tmp_path / "out")
    last = ["options", "warnings", "rank", "host", "start_time", "wall_s"]
    assert list(df.columns[-6:]) == last and "latency_rough" in df.columns
    header = (tmp_path / "out" / "sweep.csv").read_text().splitlines()[0].split(",")
    assert header[-6:] == last


def test_a_model_file_that_is_not_there_is_refused_before_anything_runs(
    nets: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # a trial's sweep ran a config naming a missing nets.py:build as a failed row (exit 1),
    # where compare refuses it as a usage error (exit 2) and the docs say everything is
    # checked before anything runs: it is refused so, naming the file, the grid and the key
    from modelprof.cli import main

    config, out = tmp_path / "grid.toml", tmp_path / "out"
    gone = tmp_path / "gone.py"
    config.write_text(
        f'[[grid]]\nmodels = ["{nets}:narrow"]\n[[grid]]\nmodels = ["{gone}:build"]\n'
    )
    assert main(["sweep", str(config), "--out", str(out)]) == 2
    said = f"{config}: grid 2: models: model file {str(gone)!r} does not exist"
    assert said in capsys.readouterr().err
    assert not out.exists()  # nothing ran, nothing was written
    with pytest.raises(ModelProfError, match=r"sweep: model: model file '.*\.pt2' does not"):
        sweep({"model": str(tmp_path / "gone.pt2")})
    folder = tmp_path / "folder.pt"
    folder.mkdir()
    with pytest.raises(ModelProfError, match=r"sweep: models: model file '.*' is not a file"):
        sweep({"models": [str(folder)]})
