"""Count the same models with modelprof and the peer tools, and report what each one says.

    python benchmarks/compare_peers.py --out reports/peers.md

(also writes ``reports/peers.json`` next to ``--out`` with the raw numbers; ``--models`` and
``--tools`` restrict the run, ``--timeout`` bounds each count, default 300 s; the wall time is
the median of ``--repeat`` fresh subprocesses per pair, default 3, each with
``torch.set_num_threads(--threads)``, default 1, so the timings suffer less from other
processes on a shared CPU).

Every (tool, model) pair runs in its own fresh subprocess, so a tool that patches classes or
leaves hooks behind cannot change another tool's numbers. In each subprocess: build the model
(CPU, batch 1, eval, random weights ``weights=None``, seed 0), run one reference forward,
snapshot the model and the torch namespaces, call the tool (timed: the count call only, not
imports or model building), then snapshot again and diff, and run the forward once more to
check that the output is bit-identical. An exception raised by a tool is recorded (type and
first line) as that pair's result.

The peers are test-only oracles, not modelprof dependencies:
``pip install thop fvcore torchinfo torchstat ptflops``.

What each tool's number is (converted to MACs where the tool reports something else):

- modelprof      ``profile(model, inputs=x, device="cpu", timing=False).totals["macs"]``.
- thop           ``thop.profile(model, inputs=(x,), report_missing=True)[0]``: MACs
                 (``report_missing=True`` only makes it print the module types it has no rule
                 for; it does not change the count).
- fvcore         ``FlopCountAnalysis(model, (x,)).total()``: fvcore calls it "flops", but by
                 its documented convention one fused multiply-add counts as one flop, i.e. MACs.
- torchinfo      ``summary(model, input_data=x, device="cpu", verbose=0).total_mult_adds``.
- ptflops        ``get_model_complexity_info(model, shape, input_constructor=lambda _: x,
                 as_strings=False, print_per_layer_stat=False, verbose=True)[0]``: MACs, with
                 its default ("pytorch", module-hook) backend.
- ptflops-aten   the same call with ``backend="aten"`` (ptflops' aten-dispatch backend).
- torchstat      ``torchstat.stat(model, input_size)``: prints a table; its stdout is parsed
                 for ``Total MAdd``; MACs = MAdd / 2 (torchstat's MAdd counts a length-k dot
                 product as k multiplications + k-1 additions, plus elementwise layers).
                 ``stat`` builds its own input ``torch.rand(1, *input_size)`` and requires a
                 3-tuple ``input_size``.
- torchstat-internal  ``torchstat.ModelStat(model, input_size)._analyze_model()``: the same
                 hooks and formulas as ``stat`` without the report formatting, summing the
                 leaf nodes' ``MAdd``/``Flops`` (a private API, used only to show what
                 torchstat counts when ``stat`` itself raises).
- flop_counter   ``torch.utils.flop_counter.FlopCounterMode``: ``get_total_flops() / 2``
                 (it counts 2 flops per multiply-accumulate), forward under ``no_grad``.

References: torchvision's published ``weights.meta["_ops"]`` (GMACs) for the torchvision
models; for the LSTM and the custom block, MACs derived by hand (see ``LSTM_REF_MACS`` and
``AttnBlock``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata as md
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]

TOOLS = (
    "modelprof",
    "thop",
    "fvcore",
    "torchinfo",
    "ptflops",
    "ptflops-aten",
    "torchstat",
    "torchstat-internal",
    "flop_counter",
)
MODELS = ("resnet18", "vit_b_16", "swin_t", "mobilenet_v3_large", "lstm", "attn_block")
TORCHVISION = ("resnet18", "vit_b_16", "swin_t", "mobilenet_v3_large")
PEER_DISTS = {
    "thop": "thop",
    "fvcore": "fvcore",
    "torchinfo": "torchinfo",
    "ptflops": "ptflops",
    "torchstat": "torchstat",
}

# nn.LSTM(256, 512, num_layers=2) on 32 steps, batch 1. Each cell step does x @ W_ih^T with
# W_ih (4H x I) and h @ W_hh^T with W_hh (4H x H), H = 512:
#   layer 1: 4*512*256 + 4*512*512 = 524,288 + 1,048,576 = 1,572,864 MACs per step
#   layer 2: 4*512*512 + 4*512*512 = 2,097,152 MACs per step
#   32 steps * (1,572,864 + 2,097,152) = 117,440,512 MACs (bias adds and gate elementwise
#   ops are not MACs).
LSTM_REF_MACS = 117_440_512

# AttnBlock on x of shape (1, 1, L=128, d=64) (batch, heads, tokens, dim):
#   qkv = Linear(64, 192):       L * d * 3d = 128 * 64 * 192 = 1,572,864 MACs
#   sdpa: q @ k^T                L * L * d  = 128 * 128 * 64 = 1,048,576 MACs
#         softmax(.) @ v         L * L * d  = 128 * 128 * 64 = 1,048,576 MACs
#   y = x + attn                 elementwise, 0 MACs (8,192 adds)
#   torch.matmul(y, W), W (d x d): L * d * d = 128 * 64 * 64 =   524,288 MACs
#   total                                                      4,194,304 MACs
ATTN_REF_MACS = 4_194_304
ATTN_INPUT = (1, 1, 128, 64)


class AttnBlock(nn.Module):
    """One nn.Linear makes q, k, v; the rest is functional code (no nn.Module per op)."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.w = nn.Parameter(torch.randn(d, d) / d**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = F.scaled_dot_product_attention(q, k, v)
        y = x + attn
        return torch.matmul(y, self.w)


def build(name: str) -> tuple[nn.Module, torch.Tensor]:
    """The model (eval, random weights, seed 0) and its batch-1 input."""
    torch.manual_seed(0)
    if name == "lstm":
        model, x = nn.LSTM(256, 512, num_layers=2), torch.randn(32, 1, 256)
    elif name == "attn_block":
        model, x = AttnBlock(), torch.randn(*ATTN_INPUT)
    else:
        from torchvision.models import get_model

        model, x = get_model(name, weights=None), torch.randn(1, 3, 224, 224)
    return model.eval(), x


def reference(name: str) -> tuple[float | None, str]:
    """(reference MACs, where it comes from)."""
    if name == "lstm":
        return float(LSTM_REF_MACS), "hand-derived"
    if name == "attn_block":
        return float(ATTN_REF_MACS), "hand-derived"
    from torchvision.models import get_model_weights

    w = get_model_weights(name).DEFAULT
    ops = w.meta.get("_ops")
    return (ops * 1e9 if ops is not None else None), f"torchvision {w} _ops = {ops} GMACs"


# ---------------------------------------------------------------- side-effect snapshots ------
def _hook_ids(d: dict) -> tuple:
    return tuple((k, id(v)) for k, v in d.items())


def snapshot(model: nn.Module) -> dict[str, Any]:
    from torch.nn.modules import module as mm

    mods = dict(model.named_modules())
    classes = {type(m) for m in mods.values()} | {nn.Module, nn.Conv2d, nn.Linear}
    attrs = {}
    for cls in classes:
        for a in ("__call__", "forward", "_call_impl"):
            attrs[f"{cls.__module__}.{cls.__qualname__}.{a}"] = getattr(cls, a, None)
    for ns_name, ns in (
        ("torch", torch),
        ("torch.nn.functional", F),
        ("torch.Tensor", torch.Tensor),
    ):
        for k, v in list(vars(ns).items()):
            if not k.startswith("__") or k in ("__call__", "__matmul__", "__add__", "__mul__"):
                attrs[f"{ns_name}.{k}"] = v
    return {
        "hooks": {
            n: (_hook_ids(m._forward_hooks), _hook_ids(m._forward_pre_hooks))
            for n, m in mods.items()
        },
        "global_hooks": (
            _hook_ids(mm._global_forward_hooks),
            _hook_ids(mm._global_forward_pre_hooks),
        ),
        "state_dict": list(model.state_dict().keys()),
        "training": {n: m.training for n, m in mods.items()},
        "inst_attrs": {n: set(vars(m)) for n, m in mods.items()},
        "attrs": attrs,
    }


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    hooks_changed = [
        n or "<root>" for n in before["hooks"] if before["hooks"][n] != after["hooks"].get(n)
    ]
    hooks_left = sum(
        len(after["hooks"][n][0])
        + len(after["hooks"][n][1])
        - len(before["hooks"][n][0])
        - len(before["hooks"][n][1])
        for n in before["hooks"]
    )
    sb, sa = before["state_dict"], after["state_dict"]
    added = [k for k in sa if k not in set(sb)]
    removed = [k for k in sb if k not in set(sa)]
    added_suffixes: dict[str, int] = {}
    for k in added:
        suffix = k.rsplit(".", 1)[-1]
        added_suffixes[suffix] = added_suffixes.get(suffix, 0) + 1
    patched = sorted(
        k for k, v in before["attrs"].items() if k in after["attrs"] and after["attrs"][k] is not v
    )
    inst: dict[str, int] = {}
    for n, keys in before["inst_attrs"].items():
        for a in after["inst_attrs"].get(n, set()) - keys:
            inst[a] = inst.get(a, 0) + 1
    return {
        "hooks_changed_modules": len(hooks_changed),
        "hooks_changed_examples": hooks_changed[:5],
        "hooks_net_added": hooks_left,
        "global_hooks_changed": before["global_hooks"] != after["global_hooks"],
        "state_dict_added": len(added),
        "state_dict_added_by_name": added_suffixes,
        "state_dict_added_examples": added[:5],
        "state_dict_removed": len(removed),
        "patched": patched,
        "training_changed": [
            n or "<root>" for n, t in before["training"].items() if after["training"].get(n) != t
        ],
        "instance_attrs_added": inst,
    }


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


def _error(e: BaseException) -> dict[str, str]:
    """Type, first line of the message and the innermost frame (file:line: source)."""
    tb = traceback.extract_tb(e.__traceback__)

    def fmt(f: traceback.FrameSummary) -> str:
        path = f.filename.split("site-packages/")[-1]
        return f"{path}:{f.lineno}: {(f.line or '').strip()}"[:300]

    where = fmt(tb[-1]) if tb else ""
    tool_frames = [
        f
        for f in tb
        if re.search(
            r"(thop|fvcore|torchinfo|ptflops|torchstat|"
            r"modelprof)/",
            f.filename,
        )
    ]
    tool_where = fmt(tool_frames[-1]) if tool_frames else ""
    return {
        "type": type(e).__name__,
        "message": _first_line(e),
        "where": where,
        "tool_where": tool_where if tool_where != where else "",
    }


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else ""


# ---------------------------------------------------------------- the tools ------------------
TOOL_MODULES = {
    "modelprof": "modelprof",
    "thop": "thop",
    "fvcore": "fvcore.nn",
    "torchinfo": "torchinfo",
    "ptflops": "ptflops",
    "ptflops-aten": "ptflops",
    "torchstat": "torchstat",
    "torchstat-internal": "torchstat",
    "flop_counter": "torch.utils.flop_counter",
}


def run_tool(tool: str, name: str, model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Call ``tool`` on ``model``; returns {"macs", "reported", ...}. Timed by the caller."""
    if tool == "modelprof":
        from modelprof import profile

        r = profile(model, inputs=x, device="cpu", timing=False)
        return {
            "macs": r.totals["macs"],
            "reported": dict(r.totals),
            "by_op": _modelprof_by_op(r),
            "tool_unsupported": dict(r.unsupported),
        }
    if tool == "thop":
        import thop

        macs, params = thop.profile(model, inputs=(x,), report_missing=True)
        return {"macs": macs, "reported": {"macs": macs, "params": params}}
    if tool == "fvcore":
        from fvcore.nn import FlopCountAnalysis

        fca = FlopCountAnalysis(model, (x,))
        total = fca.total()
        return {
            "macs": total,
            "reported": {"flops (= MACs by fvcore's convention)": total},
            "by_op": {k: int(v) for k, v in fca.by_operator().items()},
            "tool_unsupported": dict(fca.unsupported_ops()),
            "uncalled_modules": len(fca.uncalled_modules()),
        }
    if tool == "torchinfo":
        from torchinfo import summary

        s = summary(model, input_data=x, device="cpu", verbose=0)
        return {
            "macs": s.total_mult_adds,
            "reported": {"total_mult_adds": s.total_mult_adds, "total_params": s.total_params},
        }
    if tool in ("ptflops", "ptflops-aten"):
        from ptflops import get_model_complexity_info

        kw = {"backend": "aten"} if tool == "ptflops-aten" else {}
        macs, params = get_model_complexity_info(
            model,
            tuple(x.shape[1:]),
            input_constructor=lambda _res: x,
            as_strings=False,
            print_per_layer_stat=False,
            verbose=True,
            **kw,
        )
        return {"macs": macs, "reported": {"macs": macs, "params": params}}
    if tool == "torchstat":
        from torchstat import stat

        size = tuple(x.shape[1:]) if x.dim() == 4 else tuple(x.shape)
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                stat(model, size)
        finally:
            sys.stdout.write(buf.getvalue())
        text = buf.getvalue()
        madd = _parse_unit(text, "MAdd")
        flops = _parse_unit(text, "Flops")
        return {
            "macs": None if madd is None else madd / 2,
            "input_size": list(size),
            "reported": {"Total MAdd": madd, "Total Flops": flops},
        }
    if tool == "torchstat-internal":
        from torchstat import ModelStat

        size = tuple(x.shape[1:]) if x.dim() == 4 else tuple(x.shape)
        nodes = ModelStat(model, size)._analyze_model()
        madd = int(sum(int(n.MAdd) for n in nodes))
        flops = int(sum(int(n.Flops) for n in nodes))
        return {
            "macs": madd / 2,
            "input_size": list(size),
            "reported": {"MAdd": madd, "Flops": flops},
        }
    if tool == "flop_counter":
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc, torch.no_grad():
            model(x)
        flops = fc.get_total_flops()
        per_op = {str(k): int(v) for k, v in fc.get_flop_counts().get("Global", {}).items()}
        return {"macs": flops / 2, "reported": {"flops": flops}, "flops_by_op": per_op}
    raise ValueError(f"unknown tool {tool!r}")


def _modelprof_by_op(r: Any) -> dict[str, int]:
    df = r.by_operator()
    return {str(op): int(m) for op, m in zip(df["op"], df["macs"]) if m}


_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _parse_unit(text: str, what: str) -> float | None:
    m = re.search(rf"Total {what}: ([0-9.]+)([KMGT]?){what}", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def child(tool: str, name: str, result_path: str, threads: int) -> int:
    if threads > 0:
        torch.set_num_threads(threads)
    out: dict[str, Any] = {"tool": tool, "model": name, "torch_threads": torch.get_num_threads()}
    model, x = build(name)
    out["input_shape"] = list(x.shape)
    with torch.no_grad():
        y0 = [t.clone() for t in _flat(model(x))]
    # importing torch._dynamo (which several tools and torch itself do lazily) replaces
    # torch.manual_seed with a wrapped one; import it first so that is not charged to a tool
    importlib.import_module("torch._dynamo")
    before = snapshot(model)
    sys.stdout.flush()
    t0 = None
    try:
        importlib.import_module(TOOL_MODULES[tool])  # after the snapshot: import-time patches
        t0 = time.perf_counter()  # count, import time does not
        out.update(run_tool(tool, name, model, x))
        out["error"] = None
    except BaseException as e:  # an exception is a result
        out["error"] = _error(e)
        out["macs"] = None
        traceback.print_exc()
    out["wall_s"] = None if t0 is None else time.perf_counter() - t0
    sys.stdout.flush()
    out["side_effects"] = diff(before, snapshot(model))
    try:
        with torch.no_grad():
            y1 = _flat(model(x))
        out["side_effects"]["output_unchanged"] = len(y0) == len(y1) and all(
            torch.equal(a, b) for a, b in zip(y0, y1)
        )
    except BaseException as e:
        err = _error(e)
        out["side_effects"]["output_unchanged"] = (
            f"forward raised {err['type']}: {err['message']} ({err['where']})"
        )
    Path(result_path).write_text(json.dumps(out, default=str), encoding="utf-8")
    return 0


# ---------------------------------------------------------------- warnings in the output -----
WARN_PATTERNS = {
    "modelprof": r"ModelProfWarning",
    "thop": r"\[WARN\] Cannot find rule for",
    "fvcore": r"Unsupported operator",
    "ptflops": r"is treated as a zero-op",
    "ptflops-aten": r"is treated as a zero-op",
    "torchstat": r"\[MAdd\]: \S+ is not supported!",
    "torchstat-internal": r"\[MAdd\]: \S+ is not supported!",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def count_warnings(tool: str, text: str) -> dict[str, Any]:
    pat = WARN_PATTERNS.get(tool)
    if pat is None:
        return {"count": None, "distinct": None, "examples": []}
    lines = [_ANSI.sub("", ln).strip() for ln in text.splitlines() if re.search(pat, ln)]
    distinct = list(dict.fromkeys(lines))
    return {"count": len(lines), "distinct": len(distinct), "examples": distinct[:8]}


def _ptflops_error(text: str) -> dict[str, str] | None:
    m = re.search(r"following exception: \n<class '([\w.]+)'>: (.*)", text)
    return (
        {
            "type": m.group(1).rsplit(".", 1)[-1],
            "message": m.group(2).strip()[:300],
            "caught_by_tool": True,
        }
        if m
        else None
    )


def run_pair(tool: str, name: str, timeout: float, threads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        res = Path(tmp) / "r.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            tool,
            name,
            str(res),
            "--threads",
            str(threads),
        ]
        env = dict(os.environ, PYTHONWARNINGS="default", NO_COLOR="1")
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT)
            )
            text, rc, timed_out = p.stdout + "\n" + p.stderr, p.returncode, False
        except subprocess.TimeoutExpired as e:
            text = (
                (e.stdout or b"").decode(errors="replace")
                if isinstance(e.stdout, bytes)
                else (e.stdout or "")
            )
            rc, timed_out = None, True
        elapsed = time.perf_counter() - t0
        if res.exists():
            out = json.loads(res.read_text(encoding="utf-8"))
        else:
            out = {
                "tool": tool,
                "model": name,
                "macs": None,
                "wall_s": None,
                "side_effects": None,
                "error": {
                    "type": "TimeoutExpired" if timed_out else "ChildFailed",
                    "message": f"no result after {timeout:.0f} s"
                    if timed_out
                    else text.strip().splitlines()[-1][:300]
                    if text.strip()
                    else "",
                },
            }
    out.update(
        returncode=rc,
        timed_out=timed_out,
        subprocess_s=elapsed,
        warnings=count_warnings(tool, text),
        output_tail=text[-3000:],
    )
    if tool.startswith("ptflops") and out.get("macs") is None and out.get("error") is None:
        out["error"] = _ptflops_error(text) or {"type": "None", "message": "returned None"}
    return out


# ---------------------------------------------------------------- report ---------------------
def environment() -> dict[str, Any]:
    import numpy
    import pandas
    import torchvision

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "numpy": numpy.__version__,
        "pandas": pandas.__version__,
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15": os.getloadavg(),
    }
    from torch.utils.flop_counter import flop_registry

    have = {str(k) for k in flop_registry}
    env["flop_counter_has_formula"] = {
        op: op in have
        for op in (
            "aten._scaled_dot_product_flash_attention_for_cpu",
            "aten._native_multi_head_attention",
            "aten.mkldnn_rnn_layer",
            "aten._scaled_dot_product_flash_attention",
        )
    }
    try:
        from modelprof.runtime.env import cpu_name

        env["cpu"] = cpu_name()
    except Exception:  # noqa: BLE001
        env["cpu"] = platform.processor()
    try:
        env["modelprof"] = md.version("modelprof")
    except md.PackageNotFoundError:
        env["modelprof"] = "?"
    for k, dist in PEER_DISTS.items():
        try:
            env[k] = md.version(dist)
        except md.PackageNotFoundError:
            env[k] = "not installed"
    return env


def _scale(ref: float | None) -> tuple[float, str]:
    return (1e9, "G") if ref is not None and ref >= 1e9 else (1e6, "M")


def _cell_macs(r: dict[str, Any], scale: float) -> str:
    if r.get("macs") is not None:
        return f"{r['macs'] / scale:.4g}" if scale == 1e6 else f"{r['macs'] / scale:.3f}"
    e = r.get("error") or {}
    return f"**{e.get('type', 'error')}**"


def _effects_summary(se: dict[str, Any] | None) -> str:
    if se is None:
        return "not checked (no result)"
    parts = []
    if se["hooks_changed_modules"]:
        parts.append(
            f"hooks changed on {se['hooks_changed_modules']} module(s) "
            f"(net {se['hooks_net_added']:+d})"
        )
    if se["global_hooks_changed"]:
        parts.append("global hooks changed")
    if se["state_dict_added"] or se["state_dict_removed"]:
        names = ", ".join(f"{k} x{v}" for k, v in se["state_dict_added_by_name"].items())
        parts.append(
            f"state_dict +{se['state_dict_added']} keys ({names})"
            + (f", -{se['state_dict_removed']}" if se["state_dict_removed"] else "")
        )
    if se["patched"]:
        shown = ", ".join(p.replace("torch.nn.modules.", "") for p in se["patched"])
        parts.append(f"replaced: {shown}")
    if se["training_changed"]:
        parts.append(f"training flag changed on {len(se['training_changed'])} module(s)")
    if se["instance_attrs_added"]:
        attrs = ", ".join(f"{k}" for k in sorted(se["instance_attrs_added"]))
        n = max(se["instance_attrs_added"].values())
        parts.append(f"new instance attributes on {n} module(s): {attrs}")
    ou = se.get("output_unchanged")
    if ou is not True:
        parts.append(f"output after: {ou if isinstance(ou, str) else 'DIFFERENT'}")
    return "; ".join(parts) if parts else "none"


def render(data: dict[str, Any]) -> str:
    env, refs, runs = data["env"], data["models"], data["runs"]
    tools = data["tools"]
    models = data["model_order"]
    by = {(r["tool"], r["model"]): r for r in runs}
    L: list[str] = []
    L.append("# modelprof and the peer tools on the same models\n")
    L.append(
        f"Generated by `{data['command']}` on {data['date']} (total {data['total_s']:.0f} s)."
        " Every number below comes from that run; raw numbers, tool output tails and the "
        "full side-effect diffs are in `peers.json`.\n"
    )
    L.append("## Environment\n")
    L.append("| component | version |\n| --- | --- |")
    for k in (
        "python",
        "platform",
        "cpu",
        "cpu_count",
        "torch",
        "torchvision",
        "numpy",
        "pandas",
        "modelprof",
        *PEER_DISTS,
    ):
        L.append(f"| {k} | {env.get(k)} |")
    L.append(
        "\nCPU only, batch 1, eval mode, random weights (`weights=None`), seed 0; each "
        "(tool, model) pair in a fresh subprocess with a "
        f"{data['timeout_s']:.0f} s limit.\n"
    )
    L.append("## Models and references\n")
    L.append("| model | input | reference MACs | source |\n| --- | --- | ---: | --- |")
    for m in models:
        ref = refs[m]
        L.append(
            f"| {m} | {tuple(ref['input_shape'])} | {ref['ref_macs']:,.0f} | {ref['ref_source']} |"
        )
    L.append("")
    L.append("## MACs reported by each tool\n")
    L.append(
        "Units per row (G = 1e9, M = 1e6 MACs). What each column is: modelprof "
        "`totals['macs']`; thop `profile()[0]`; fvcore `FlopCountAnalysis.total()` "
        '(named "flops" but one multiply-add = 1, i.e. MACs); torchinfo '
        "`total_mult_adds`; ptflops `get_model_complexity_info()[0]` (default pytorch "
        "backend; ptflops-aten: `backend='aten'`); torchstat `Total MAdd`/2 from `stat()`'s "
        "printed table; torchstat-internal: `ModelStat._analyze_model()` leaf MAdd sum / 2 "
        "(private API); flop_counter `FlopCounterMode.get_total_flops()`/2. "
        "**Bold** = the tool raised (see Errors).\n"
    )
    L.append("| model | unit | reference | " + " | ".join(tools) + " |")
    L.append("| --- | --- | ---: | " + " | ".join("---:" for _ in tools) + " |")
    for m in models:
        scale, unit = _scale(refs[m]["ref_macs"])
        cells = [_cell_macs(by[(t, m)], scale) if (t, m) in by else "" for t in tools]
        ref = refs[m]["ref_macs"] / scale
        L.append(f"| {m} | {unit} | {ref:.4g} | " + " | ".join(cells) + " |")
    L.append(
        "\nThe same, exact (integers as the tools returned them; torchstat: MAdd/2, "
        "flop_counter: flops/2):\n"
    )
    L.append("| model | reference | " + " | ".join(tools) + " |")
    L.append("| --- | ---: | " + " | ".join("---:" for _ in tools) + " |")
    for m in models:
        cells = []
        for t in tools:
            r = by.get((t, m))
            v = None if r is None else r.get("macs")
            cells.append(
                ""
                if r is None
                else f"{v:,.0f}"
                if v is not None
                else f"**{(r.get('error') or {}).get('type', 'error')}**"
            )
        L.append(f"| {m} | {refs[m]['ref_macs']:,.0f} | " + " | ".join(cells) + " |")
    L.append("\n## Ratio to the reference (%)\n")
    L.append("| model | " + " | ".join(tools) + " |")
    L.append("| --- | " + " | ".join("---:" for _ in tools) + " |")
    for m in models:
        cells = []
        for t in tools:
            r = by.get((t, m))
            cells.append(
                ""
                if r is None
                else f"{r['ratio'] * 100:.1f}"
                if r.get("ratio") is not None
                else "–"
            )
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    L.append("\n## Wall time of the count call (s)\n")
    L.append(
        "Only the tool call, measured in the child process (imports and model building "
        "excluded; the tool's own printing included). Median over "
        f"{data['repeat']} fresh subprocesses per pair, each with torch.set_num_threads("
        f"{data['threads']}); every run's time is in `peers.json`. "
        f"{env['cpu_count']}-core CPU shared with other work (load average "
        f"{env['load_average_1_5_15'][0]:.2f} at the start, {data['load_end'][0]:.2f} at "
        "the end), so treat these as indicative.\n"
    )
    L.append("| model | " + " | ".join(tools) + " |")
    L.append("| --- | " + " | ".join("---:" for _ in tools) + " |")
    for m in models:
        cells = []
        for t in tools:
            r = by.get((t, m))
            w = None if r is None else r.get("wall_s")
            cells.append("" if r is None else f"{w:.3f}" if w is not None else "timeout")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    L.append("\n## Unsupported-op warnings printed\n")
    L.append(
        'Lines in the tool\'s stdout/stderr matching its own "no rule" message, as '
        "`lines (distinct)`: modelprof `ModelProfWarning`; thop `[WARN] Cannot find rule "
        "for <type>` (one per module type, containers included); fvcore `Unsupported "
        "operator aten::X encountered N time(s)` (one per op type); ptflops `... is treated "
        "as a zero-op` (pytorch backend: per module type; aten backend: per op call); "
        "torchstat `[MAdd]: <type> is not supported!` (per module call). torchinfo and "
        "FlopCounterMode have no such message (n/a).\n"
    )
    L.append("| model | " + " | ".join(tools) + " |")
    L.append("| --- | " + " | ".join("---:" for _ in tools) + " |")
    for m in models:
        cells = []
        for t in tools:
            r = by.get((t, m))
            w = None if r is None else r["warnings"]
            cells.append(
                ""
                if w is None
                else "n/a"
                if w["count"] is None
                else f"{w['count']} ({w['distinct']})"
            )
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    L.append("\n## Side effects on the model and on torch\n")
    L.append(
        "Checked after each tool call, in the same process: forward hooks and pre-hooks of "
        "every module, `torch.nn.modules.module._global_forward_(pre_)hooks`, "
        "`state_dict()` keys, `training` of every module, new instance attributes, identity "
        "of `__call__`/`forward`/`_call_impl` of `nn.Module`, `nn.Conv2d`, `nn.Linear` and "
        "every class in the model, identity of every attribute of `torch`, "
        "`torch.nn.functional` and `torch.Tensor`, and whether a second forward returns a "
        "bit-identical output.\n"
    )
    L.append(
        "Per tool, over the models it ran on: `same` when every model passed the check, "
        "otherwise the models where it changed.\n"
    )
    checks = [
        (
            "nn.Module.__call__",
            lambda se: "torch.nn.modules.module.Module.__call__" in se["patched"],
        ),
        ("nn.Conv2d.__call__", lambda se: "torch.nn.modules.conv.Conv2d.__call__" in se["patched"]),
        ("nn.Conv2d.forward", lambda se: "torch.nn.modules.conv.Conv2d.forward" in se["patched"]),
        ("any class/torch attr", lambda se: bool(se["patched"])),
        ("module hooks", lambda se: se["hooks_changed_modules"] > 0),
        ("global hooks", lambda se: se["global_hooks_changed"]),
        ("state_dict keys", lambda se: bool(se["state_dict_added"] or se["state_dict_removed"])),
        ("training flags", lambda se: bool(se["training_changed"])),
        ("output bit-identical", lambda se: se.get("output_unchanged") is not True),
    ]
    L.append("| tool | " + " | ".join(c for c, _ in checks) + " |")
    L.append("| --- | " + " | ".join("---" for _ in checks) + " |")
    for t in tools:
        ses = [(m, by[(t, m)].get("side_effects")) for m in models if (t, m) in by]
        cells = []
        for _, changed in checks:
            bad = [m for m, se in ses if se is None or changed(se)]
            cells.append(
                f"same ({len(ses)}/{len(ses)})" if not bad else "**changed**: " + ", ".join(bad)
            )
        L.append(f"| {t} | " + " | ".join(cells) + " |")
    L.append("\nDetails per (tool, model):\n")
    L.append("| tool | model | side effects |\n| --- | --- | --- |")
    for t in tools:
        for m in models:
            r = by.get((t, m))
            if r is None:
                continue
            L.append(f"| {t} | {m} | {_effects_summary(r.get('side_effects'))} |")
    L.append("\n## Errors\n")
    errs = [r for r in runs if r.get("error")]
    if not errs:
        L.append("None.")
    else:
        L.append(
            "| tool | model | exception (type: first line) | raised at |\n| --- | --- | --- | --- |"
        )
        for r in errs:
            e = r["error"]
            caught = (
                " (caught and printed by the tool, which returned None)"
                if e.get("caught_by_tool")
                else ""
            )
            msg = e.get("message", "").replace("|", "\\|")
            where = e.get("where", "").replace("|", "\\|").replace("`", "'")
            tw = e.get("tool_where", "").replace("|", "\\|").replace("`", "'")
            if tw:
                where = f"{where}`, called from `{tw}"
            L.append(
                f"| {r['tool']} | {r['model']} | `{e['type']}: {msg}`{caught} | "
                f"{'`' + where + '`' if where else ''} |"
            )
    L.append("\n## Where the MACs are, per operator\n")
    L.append(
        "modelprof `Report.by_operator()` (MACs), fvcore `by_operator()` (its MACs), "
        "FlopCounterMode `get_flop_counts()['Global']` (flops/2); operators with 0 "
        "omitted.\n"
    )
    L.append("| model | modelprof | fvcore | flop_counter |\n| --- | --- | --- | --- |")
    for m in models:
        cells = []
        for t, key, div in (
            ("modelprof", "by_op", 1),
            ("fvcore", "by_op", 1),
            ("flop_counter", "flops_by_op", 2),
        ):
            r = by.get((t, m))
            ops = (r or {}).get(key) or {}
            cells.append(
                "<br>".join(
                    f"{k.removesuffix('.default')}: {v // div:,}"
                    for k, v in sorted(ops.items(), key=lambda kv: -kv[1])
                    if v
                )
                or ("–" if r is None or r.get("error") else "(none)")
            )
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    fc = env.get("flop_counter_has_formula")
    if fc:
        L.append(
            "\nFlopCounterMode formula registry in this torch (`torch.utils.flop_counter."
            "flop_registry`): "
            + ", ".join(f"`{k}` {'yes' if v else 'no'}" for k, v in fc.items())
            + "."
        )
    madd_rows = [(m, by.get(("modelprof", m)), by.get(("torchstat-internal", m))) for m in models]
    madd_rows = [
        (m, a, b)
        for m, a, b in madd_rows
        if a and b and a.get("macs") is not None and b.get("macs") is not None
    ]
    if madd_rows:
        L.append("\n## torchstat MAdd against modelprof `madd`\n")
        L.append(
            "modelprof's `madd` column is defined as torchstat's MAdd. Where torchstat's "
            "counting ran (`ModelStat._analyze_model()`):\n"
        )
        L.append(
            "| model | torchstat MAdd | modelprof madd | torchstat / modelprof |\n"
            "| --- | ---: | ---: | ---: |"
        )
        for m, a, b in madd_rows:
            ts, mp = b["reported"]["MAdd"], a["reported"]["madd"]
            L.append(f"| {m} | {ts:,} | {mp:,} | {100 * ts / mp:.2f} % |")
    extra = [r for r in runs if r.get("tool_unsupported")]
    if extra:
        L.append("\n## Ops the tools themselves list as unsupported\n")
        clean = [
            r["model"]
            for r in runs
            if r["tool"] == "modelprof" and r.get("error") is None and not r.get("tool_unsupported")
        ]
        L.append(
            "modelprof `Report.unsupported`, fvcore `unsupported_ops()` (op: calls). "
            "modelprof's was empty for: " + (", ".join(clean) or "none") + ".\n"
        )
        L.append("| tool | model | ops |\n| --- | --- | --- |")
        for r in extra:
            ops = ", ".join(f"{k}: {v}" for k, v in sorted(r["tool_unsupported"].items()))
            L.append(f"| {r['tool']} | {r['model']} | {ops} |")
    return "\n".join(L) + "\n"


# The section from this heading on is written by hand from tests/test_peer_suites.py (the peers'
# own test suites re-derived as our tests), not by this script: a rerun keeps it.
HAND_WRITTEN = "## The peer tools' own test suites as oracles"


def keep_hand_written(text: str, previous: str | None) -> str:
    """``text`` followed by the hand-written section of ``previous`` (the file being replaced),
    if it has one."""
    at = -1 if previous is None else previous.find(HAND_WRITTEN)
    if at < 0:
        return text
    return text.rstrip("\n") + "\n\n" + previous[at:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/peers.md")
    ap.add_argument("--json", default=None, help="default: --out with .json")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--tools", nargs="*", default=list(TOOLS))
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads in each child (default 1; 0 = torch's default)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="fresh subprocesses per pair; wall time = their median (default 3)",
    )
    ap.add_argument("--child", nargs=3, metavar=("TOOL", "MODEL", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(*args.child, args.threads)
    t_start = time.perf_counter()
    env = environment()  # before the runs: the load average at the start
    models: dict[str, Any] = {}
    for m in args.models:
        _, x = build(m)
        ref, src = reference(m)
        models[m] = {"ref_macs": ref, "ref_source": src, "input_shape": list(x.shape)}
    runs = []
    for m in args.models:
        for t in args.tools:
            reps = [run_pair(t, m, args.timeout, args.threads) for _ in range(max(1, args.repeat))]
            r = reps[0]  # side effects, warnings and errors: the first run's
            walls = [x["wall_s"] for x in reps if x.get("wall_s") is not None]
            r["wall_s_runs"] = walls
            r["wall_s"] = statistics.median(walls) if walls else None
            r["macs_runs"] = [x.get("macs") for x in reps]
            r["macs_identical_across_runs"] = len(set(map(str, r["macs_runs"]))) == 1
            ref = models[m]["ref_macs"]
            r["ratio"] = r["macs"] / ref if r.get("macs") is not None and ref else None
            runs.append(r)
            macs = "-" if r.get("macs") is None else f"{r['macs']:.6g}"
            err = r.get("error")
            wall = "" if r.get("wall_s") is None else f"{r['wall_s']:.2f} s"
            print(
                f"{m:20s} {t:19s} macs {macs:>12s}  {wall}{'  ' + err['type'] if err else ''}",
                file=sys.stderr,
                flush=True,
            )
    given = sys.argv[1:] if argv is None else list(argv)
    data = {
        "command": " ".join(["python benchmarks/compare_peers.py", *given]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "env": env,
        "timeout_s": args.timeout,
        "tools": args.tools,
        "model_order": args.models,
        "models": models,
        "runs": runs,
        "total_s": time.perf_counter() - t_start,
        "repeat": args.repeat,
        "threads": args.threads,
        "load_end": os.getloadavg(),
    }
    out = Path(args.out)
    text = keep_hand_written(
        render(data), out.read_text(encoding="utf-8") if out.exists() else None
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    Path(args.json or out.with_suffix(".json")).write_text(
        json.dumps(data, indent=1, default=str), encoding="utf-8"
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
