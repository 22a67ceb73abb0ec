"""The ``modelprof`` command line: ``profile``, ``compare``, ``throughput``, ``generate``,
``sweep`` and ``fit``.

    modelprof profile resnet18 --no-timing --style torchstat --out reports --format csv,md
    modelprof compare resnet18 mobilenet_v3_large efficientnet_b0 --budget 1
    modelprof throughput resnet18 --max-batch 64
    modelprof generate LlamaConfig:num_hidden_layers=2 --prompt-len 64 --new-tokens 16
    torchrun --standalone --nproc_per_node=2 -m modelprof sweep vision.toml --out vision_sweep
    modelprof fit LlamaConfig:hidden_size=8192,num_hidden_layers=80 --target "H100 SXM"

Exit status: 0 done, 2 a usage error or a :class:`ModelProfError` refusing what was typed (one
line on stderr), 1 a model whose run failed (as compare and sweep keep going past it) or anything
unexpected (a bug: with its traceback). Subcommands import what they run inside the
function that runs it, so that ``--help`` and ``--version`` answer without loading torch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import io
import math
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from modelprof.errors import (
    ModelProfError,
    ModelProfWarning,
    a_type,
    nearest_keywords,
    warn_user,
)
from modelprof.render.formats import export as export_table
from modelprof.render.formats import get_format, needs_package, table_formats
from modelprof.runtime.names import unique_name

__all__ = [
    "FORMATS",
    "build_parser",
    "comma_items",
    "main",
    "parse_formats",
    "parse_input_arg",
    "parse_input_size_arg",
]

PROG = "modelprof"
#: every registered table format by its file suffix (``modelprof.render.formats``), and plots
FORMATS: tuple[str, ...] = (*(f.suffix for f in table_formats()), "png")
_DEFAULT_FORMATS = ("csv", "md")
MODEL_HELP = (
    "a torchvision name (resnet18), torchvision:NAME, timm:NAME (needs timm), "
    "path/to/file.py:factory, or a saved module (.pt/.pth with --trust-pickle, .pt2); "
    "built with random weights, never downloaded"
)


# --- argument parsing ----------------------------------------------------------------------------


def comma_items(flag: str, text: str) -> list[str]:
    """The items of a comma-separated flag value (``--format``, ``--columns``, ``--batch-size``,
    ``--contexts``), each stripped. An empty item (``1,,2``, a comma at an end) is refused,
    naming the flag and the value, not skipped: a list typed wrong ran as another list, where
    a repeated or non-numeric item is refused."""
    items = [p.strip() for p in text.split(",")]
    if items == [""]:
        raise ModelProfError(f"{flag} {text!r} names nothing: give one item or more")
    if "" in items:
        raise ModelProfError(
            f"{flag} {text!r} has an empty item (two commas in a row, or one at an end): give "
            "each item once, separated by single commas"
        )
    return items


def parse_input_size_arg(text: str) -> tuple[int, ...]:
    """``"3,224,224"``, ``"3x224x224"``, ``"3X224X224"``, ``"3×224×224"``, ``"3 224 224"`` or
    Python's ``"(3, 224, 224)"`` (``"[3,224,224]"``; ``"(16,)"``) -> ``(3, 224, 224)`` (batch
    excluded): one separator between two numbers (``3,x,64`` is no size, not 3x64)."""
    inner = text.strip()
    bracketed = re.fullmatch(r"\((.*?),?\s*\)|\[(.*?),?\s*\]", inner)
    if bracketed:  # a tuple or list as Python writes it, a one-tuple's trailing comma too
        inner = next(g for g in bracketed.groups() if g is not None)
    size = _dims(inner)
    if size is None:
        raise ModelProfError(
            f"--input-size {text!r} must be positive integers such as 3,224,224 (also 3x224x224, "
            "'3 224 224' or (3,224,224); batch excluded)"
        )
    return size


def _dims(text: str) -> tuple[int, ...] | None:
    """``"3,224,224"`` (``3x224x224``, ``3 224 224``) -> ``(3, 224, 224)``: positive integers
    with one separator between two (``3,,64`` and ``3,x,64`` are none, not 3x64); else None.
    ``--input-size`` and an ``--input``'s shape read a size by this one rule."""
    parts = re.split(r"\s*[,xX×]\s*|\s+", text.strip())
    size = tuple(int(p) for p in parts if re.fullmatch("[0-9]+", p))  # (not int's "+3", "3_0")
    return None if len(size) != len(parts) or any(d <= 0 for d in size) else size


def _input_size_type(text: str) -> tuple[int, ...]:
    """:func:`parse_input_size_arg` as an argparse ``type``: a bad value is a usage error."""
    try:
        return parse_input_size_arg(text)
    except ModelProfError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: the integer dtypes of ``--input``, as torch names them (the floating ones are
#: ``runtime.inputs.DTYPE_NAMES``)
_INT_DTYPES = ("int64", "long", "int32", "int", "int16", "int8", "uint8", "bool")
_INPUT_RE = re.compile(
    r"^(?P<name>[A-Za-z_]\w*):(?P<dtype>\w+)\[(?P<shape>[^\]]*)\](?::(?P<values>.+))?$"
)
_NUMBER = r"-?\d+(?:\.\d*)?(?:e-?\d+)?"
_RANGE_RE = re.compile(rf"^(?P<low>{_NUMBER})(?:-|\.\.)(?P<high>{_NUMBER})$")
INPUT_HELP = (
    "a named input NAME:DTYPE[SHAPE][:VALUES], the shape without the batch (--batch-size is "
    "prepended): input_ids:int64[128]:0-30522 draws token ids from 0 to 30521, "
    "attention_mask:int64[128]:1 is all ones, pixel_values:float32[3,224,224] is normal noise "
    "(floats also take a range LOW-HIGH); repeat for several inputs, passed as keyword arguments"
)
TOKENS_HELP = (
    "sequence length of token inputs built for a language model, as calflops does: "
    "input_ids of shape (batch, SEQ_LEN) drawn from the model's vocabulary "
    "(config.vocab_size, else its token nn.Embedding, not a position table) and an all-ones "
    "attention_mask when the forward takes one (on meta none for a transformers model, which "
    "takes no mask as all ones); --input adds or replaces named inputs; compare feeds them "
    "only to the models that read token ids, the others at --input-size or their own"
)


def parse_input_arg(text: str) -> Any:
    """``"input_ids:int64[128]:0-30522"`` -> an :class:`~modelprof.runtime.inputs.InputSpec`
    (shape without the batch; values a ``LOW-HIGH`` range, high excluded, or one constant)."""
    import torch

    from modelprof.runtime.inputs import DTYPE_NAMES, InputSpec

    m = _INPUT_RE.match(text.strip())
    if m is None:
        raise ModelProfError(
            f"--input {text!r} must look like NAME:DTYPE[SHAPE][:VALUES], e.g. "
            "input_ids:int64[128]:0-30522 (shape without the batch)"
        )
    dtype_name = m["dtype"].lower()
    if dtype_name in _INT_DTYPES:
        dtype = getattr(torch, dtype_name)
    elif dtype_name in DTYPE_NAMES:
        dtype = DTYPE_NAMES[dtype_name]
    else:
        raise ModelProfError(
            f"--input {text!r}: dtype {m['dtype']!r} is not one of "
            f"{', '.join(sorted({*_INT_DTYPES, *DTYPE_NAMES}))}"
        )
    shape = _dims(m["shape"]) if m["shape"].strip() else ()  # []: one number per sample
    if shape is None:
        raise ModelProfError(
            f"--input {text!r}: shape [{m['shape']}] must be positive integers "
            "such as [128] or [3,224,224] (batch excluded)"
        )
    values = m["values"]
    if values is None:
        if not dtype.is_floating_point:
            raise ModelProfError(
                f"--input {text!r}: an integer input needs its values, a range "
                "such as :0-30522 (high excluded) or a constant such as :1"
            )
        return InputSpec(m["name"], dtype, shape)
    r = _RANGE_RE.match(values.strip())
    if r is not None:  # both ends are numbers by the pattern
        low, high = float(r["low"]), float(r["high"])
        if high <= low:
            raise ModelProfError(
                f"--input {text!r}: range {values} is empty (high is "
                "excluded, so it must be above low)"
            )
        return InputSpec(m["name"], dtype, shape, low=low, high=high)
    try:
        value = float(values)
    except ValueError:
        raise ModelProfError(
            f"--input {text!r}: values {values!r} must be a range LOW-HIGH or a number"
        ) from None
    return InputSpec(m["name"], dtype, shape, value=value)


def parse_formats(text: str) -> tuple[str, ...]:
    """``"csv,md"`` -> ``("csv", "md")``, checked against :data:`FORMATS`, order kept."""
    chosen: list[str] = []
    for part in (p.lower().lstrip(".") for p in comma_items("--format", text)):
        try:
            fmt = part if part == "png" else get_format(part).suffix
        except ModelProfError:
            raise ModelProfError(f"--format {part!r} is not one of {', '.join(FORMATS)}") from None
        if fmt not in chosen:
            chosen.append(fmt)
    return tuple(chosen)


class _HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when the default is a real value (a None
    or False default is said in words)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unsaid = any(action.default is v for v in (None, False, argparse.SUPPRESS))
        if "(default" in text or unsaid or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _version() -> str:
    """``modelprof 0.1.0 (torch 2.x, Python 3.x)``, without importing torch."""
    from importlib import metadata

    from modelprof import __version__

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return (
        f"{PROG} {__version__} (torch {torch_version}, "
        f"Python {sys.version_info.major}.{sys.version_info.minor})"
    )


class _Parser(argparse.ArgumentParser):
    """argparse's parser with ``_HelpFormatter`` and one-line usage errors, as every other
    mistake is; the subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, formatter_class=_HelpFormatter, **kwargs)

    #: the command line last parsed, for :meth:`error`'s hint (the top parser's, whatever
    #: way a subcommand's parser is handed its part)
    given: list[str] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        _Parser.given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:
        command = self.prog.removeprefix(PROG).strip()
        where = f"{command}: " if command else ""
        message += self._minus_hint(message)
        self.exit(2, f"{PROG}: error: {where}{message} (see '{self.prog} --help')\n")

    def _minus_hint(self, message: str) -> str:
        """argparse takes a value such as "-3,224,224" for an option and says only that the
        flag lacks its value: where one followed it, how to give it (with "=", it is checked)."""
        flag = re.match(r"argument ([\w/-]+): expected one argument$", message)
        names, given = (flag[1].split("/") if flag else []), _Parser.given
        for token, value in zip(given, given[1:]):
            if token in names and re.match(r"-\.?\d", value):
                return f" (a value that begins with '-' goes after '=': {token}={value})"
        return ""


def _finite_number(flag: str, value: float | None, unit: str) -> None:
    """Refuse a ``flag`` value that is not a finite number above zero, before any work."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ModelProfError(f"{flag} {value} must be a finite number of {unit} above 0")


def _memory_flag(value: float | None) -> None:
    """Refuse a ``--memory`` that ``memory_bytes=`` would refuse, before any work."""
    from modelprof.runtime.inputs import memory_bytes_arg

    if value is not None:
        try:
            memory_bytes_arg(value)
        except ModelProfError:
            raise ModelProfError(
                f"--memory {value!r} must be a finite number of bytes, at least 1 and below 2**63"
            ) from None


def _bytes_arg(text: str) -> float:
    """``--memory``'s bytes: ``24e9``, ``24GB`` or ``24G`` (powers of 1000), ``80GiB`` (1024)."""
    from modelprof.runtime.inputs import parse_bytes

    number = parse_bytes(text)
    if number is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of bytes such as 24e9, 24GB or 80GiB"
        )
    return number


#: ``--dtype``'s choices; ``--amp``'s the two half-precision ones
_FLOATS = ("float32", "float16", "bfloat16", "float64")


def _dtype_name(*allowed: str) -> Callable[[str], str]:
    """``--dtype``'s (``--amp``'s) value as ``allowed`` spell it, from any name ``dtype=`` takes
    (``bf16``); another is refused naming every spelling that works, as ``dtype=``'s error does."""
    from modelprof.runtime.inputs import DTYPE_NAMES

    def name(value: str) -> str:
        found = str(DTYPE_NAMES.get(value.strip().lower())).removeprefix("torch.")
        if found in allowed:
            return found
        taken = sorted(
            k for k, v in DTYPE_NAMES.items() if str(v).removeprefix("torch.") in allowed
        )
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (use one of {taken})")

    return name


def _switch(parser: argparse.ArgumentParser, flag: str, text: str) -> None:
    """An on/off option: ``flag`` sets True."""
    parser.add_argument(flag, action="store_true", help=text)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for all subcommands."""
    parser = _Parser(
        prog=PROG,
        description="Per-layer cost (params, MACs, FLOPs, memory traffic) and measured latency "
        "of PyTorch models.",
        epilog=f"MODEL is {MODEL_HELP}. Run '{PROG} COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sized = argparse.ArgumentParser(add_help=False)  # the commands that make inputs
    sized.add_argument(
        "--input-size",
        action="append",
        metavar="C,H,W",
        help="input shape without the batch dimension, e.g. 3,224,224 (or 3x224x224, "
        "(3,224,224)); repeat for a model with several inputs (default: the model's own)",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cpu)")
    common.add_argument(
        "--dtype",
        type=_dtype_name(*_FLOATS),
        choices=_FLOATS,
        help="cast the model and inputs; bf16, fp16, half, fp32, fp64 as in fit's --dtype "
        "(default: the model's dtype)",
    )
    common.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write reports into DIR (default: print only; with --out and no "
        "--format, csv,md are written)",
    )
    common.add_argument(
        "--format",
        metavar="LIST",
        help=f"comma-separated formats to write: {','.join(FORMATS)} "
        "(implies --out . when --out is not given)",
    )
    _switch(
        common,
        "--trust-pickle",
        "allow loading a whole pickled module from .pt/.pth (unpickling can run arbitrary code)",
    )
    common.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="most time one latency measurement may take; it stops earlier once the median is "
        "known to +-1%% (default: 5 s per measurement; throughput: 1 s per batch size)",
    )
    common.add_argument(
        "--threads",
        type=_threads_arg,
        metavar="N",
        help="torch's intra-op threads for the run (torch.set_num_threads; on a loaded machine, "
        "the cores the other work leaves idle) (default: torch's)",
    )
    _switch(
        common,
        "--progress",
        "show progress bars even when stderr is not a terminal "
        "(default: only on a terminal; needs tqdm)",
    )
    _switch(
        common,
        "--all-ranks",
        "under torchrun, every rank prints its table, warnings and progress and writes its "
        "--out files (default: rank 0 only; also MODELPROF_ALL_RANKS=1)",
    )

    table = argparse.ArgumentParser(add_help=False)
    table.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="samples per forward pass, prepended to --input-size (default: 1)",
    )
    table.add_argument(
        "--input",
        action="append",
        metavar="NAME:DTYPE[SHAPE][:VALUES]",
        dest="inputs",
        help=INPUT_HELP,
    )
    table.add_argument("--tokens", type=int, metavar="SEQ_LEN", help=TOKENS_HELP)
    _switch(
        table,
        "--no-timing",
        "no latency: static analysis only (params, MACs, FLOPs, bytes); fast (compare's "
        "--throughput still times its batch-size search)",
    )
    _switch(
        table,
        "--backward",
        "profile a training step: forward, loss (sum of the outputs), backward per layer",
    )
    table.add_argument(
        "--optimizer",
        metavar="NAME",
        help="with --backward, also the optimizer step (sgd, adam, adamw, ...)",
    )
    table.add_argument(
        "--clock",
        choices=["auto", "host", "cpu"],
        help="what the runs read: the device's clock (auto), the host's wall clock, or the CPU "
        "time of the work (cpu: what load stretches least) (default: auto)",
    )
    table.add_argument(
        "--amp",
        type=_dtype_name(*_FLOATS[1:3]),
        choices=_FLOATS[1:3],
        help="run under torch.autocast at this dtype (bf16, fp16 accepted): the counts and the "
        "times are those of the autocast pass (default: no autocast)",
    )
    _switch(table, "--channels-last", "inputs and 4-d weights in channels_last memory format")
    _switch(
        table,
        "--compile",
        "time the torch.compile'd model end to end (per-layer rows: the eager model's)",
    )

    search = argparse.ArgumentParser(add_help=False)  # the commands that search a batch size
    search.add_argument(
        "--max-batch",
        type=int,
        metavar="N",
        help="largest batch size the throughput search tries (default: 1024)",
    )

    p = sub.add_parser(
        "profile",
        parents=[common, sized, table],
        help="per-layer table of one model",
        description="Profile one model: a per-layer table and totals.",
    )
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument(
        "--style",
        choices=["modelprof", "torchstat"],
        default="modelprof",
        help="table columns: modelprof's, or torchstat's (MAdd, MemRead, ...)",
    )
    p.add_argument(
        "--depth",
        type=int,
        metavar="K",
        help="show modules down to nesting depth K (default: all), in every format written, "
        "CSV and JSON too",
    )
    p.add_argument(
        "--columns",
        metavar="LIST",
        help="the printed table's and the md/tex/html/txt files' columns, comma-separated names "
        "as in the CSV's header (module,params,macs,latency_ms,backward_latency_ms), all, or "
        "compact (the default); CSV and JSON keep every column",
    )
    p.add_argument(
        "--per-layer",
        choices=["auto", "stamps", "kernels"],
        help="per-layer times from host stamps around each call, or from the profiler's "
        "kernel times (auto: kernels on CUDA, stamps on the CPU)",
    )
    _switch(
        p,
        "--no-correct-overhead",
        "per-layer spans as read, the hooks' own cost left in (default: measured and subtracted)",
    )
    p.set_defaults(run=_run_profile)

    c = sub.add_parser(
        "compare",
        parents=[common, sized, table, search],
        help="several models side by side",
        description="Compare models: one row each, ratios to a baseline.",
    )
    c.add_argument(
        "models", nargs="+", metavar="MODEL", help=f"the models to compare: {MODEL_HELP}"
    )
    c.add_argument(
        "--baseline",
        metavar="NAME",
        help="the model ratios are taken against, by its row's name or its MODEL (default: the "
        "first)",
    )
    _switch(c, "--throughput", "also search each model's best-throughput batch size")
    c.set_defaults(run=_run_compare)

    t = sub.add_parser(
        "throughput",
        parents=[common, sized, search],
        help="best batch size and samples/s",
        description="Search the batch size that maximises samples per second.",
    )
    t.add_argument("models", nargs="+", metavar="MODEL", help=f"one or more models: {MODEL_HELP}")
    _switch(
        t,
        "--backward",
        "search whole training steps per second: forward, loss (sum of the outputs), backward",
    )
    t.add_argument(
        "--optimizer",
        metavar="NAME",
        help="with --backward, also the optimizer step (sgd, adam, adamw, ...)",
    )
    t.add_argument("--tokens", type=int, metavar="SEQ_LEN", help=TOKENS_HELP.split(";")[0])
    t.set_defaults(run=_run_throughput)
    _add_sweep_parser(sub)
    _add_fit_parser(sub)

    g = sub.add_parser(
        "generate",
        parents=[common],
        help="a language model's generation",
        description="Profile greedy generation: prefill and decode per layer, "
        "TTFT, TPOT, tokens/s, the KV cache and memory to fit; several SPECs: compared side by "
        "side end to end (TTFT, TPOT, tokens/s, ratios to the first).",
    )
    g.add_argument(
        "specs",
        nargs="+",
        metavar="SPEC",
        help="a transformers config class with overrides "
        "(LlamaConfig:hidden_size=256,num_hidden_layers=2), a config.json, or "
        "file.py:FACTORY; random weights, nothing downloaded",
    )
    g.add_argument("--prompt-len", type=int, default=128, metavar="N", help="prompt tokens")
    g.add_argument(
        "--new-tokens",
        type=int,
        default=32,
        metavar="N",
        help="tokens generated, exactly (no stop at EOS)",
    )
    g.add_argument(
        "--batch-size",
        dest="batch_sizes",
        default="1",
        metavar="LIST",
        help="one or more batch sizes, e.g. 1,8",
    )
    g.add_argument(
        "--cache",
        default="dynamic",
        choices=["dynamic", "static", "none"],
        help="the KV cache (none: every step recomputes the prefix)",
    )
    g.add_argument(
        "--contexts",
        metavar="LIST",
        help="decode contexts to profile per layer (default: first, middle, last step)",
    )
    g.add_argument(
        "--target",
        metavar="DEVICE",
        help="roofline lower bound on a datasheet device, e.g. 'H100 SXM'",
    )
    g.add_argument(
        "--memory",
        type=_bytes_arg,
        metavar="BYTES",
        help="also the largest batch and context that fit this many bytes (24e9, 24GB, 80GiB)",
    )
    _switch(g, "--no-timing", "count only (the default on --device meta)")
    _switch(g, "--no-layer-timing", "time end to end only (TTFT, TPOT), not each layer")
    g.set_defaults(run=_run_generate)
    for command in sub.choices.values():  # an unknown flag is that command's error, not the top's
        command.set_defaults(command_parser=command)
    return parser


# --- shared helpers ------------------------------------------------------------------------------


class _Context:
    """Parsed options every subcommand shares, converted once at the boundary."""

    def __init__(self, args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> None:
        from modelprof.runtime.group import is_speaker
        from modelprof.runtime.inputs import parse_device, parse_dtype

        self.args = args
        # one voice under torchrun: rank 0 prints and writes; errors reach every rank's stderr
        self.speaker = is_speaker()
        self.stdout = stdout if self.speaker else io.StringIO()
        self.stderr = stderr
        self.device = parse_device(args.device)  # refuses CUDA where it is not available
        self.dtype = parse_dtype(args.dtype)
        _refuse_clashing_flags(args)  # before any model is built: a usage error, exit 2
        sizes = [parse_input_size_arg(s) for s in getattr(args, "input_size", None) or []]
        self.input_size: Any = None if not sizes else sizes[0] if len(sizes) == 1 else sizes
        for flag in ("batch_size", "max_batch", "tokens"):
            value = getattr(args, flag, None)
            if value is not None and value < 1:
                raise ModelProfError(f"--{flag.replace('_', '-')} {value} must be >= 1")
        _finite_number("--budget", args.budget, "seconds")
        self.input_specs = [parse_input_arg(t) for t in getattr(args, "inputs", None) or []]
        self.tokens = getattr(args, "tokens", None)
        # (compare: --tokens feed the models that read token ids, --input-size the others)
        if sizes and (self.input_specs or self.tokens is not None and args.command != "compare"):
            raise ModelProfError(
                "--input-size makes float inputs; --input/--tokens give the "
                "inputs themselves: use one or the other"
            )
        # an empty --format '' names no format: refused, not ignored
        self.formats = parse_formats(args.format) if args.format is not None else ()
        self.out: Path | None = None
        self.made: list[Path] = []  # the --out directories this run created
        if self.formats or args.out is not None:
            self.out = args.out or Path(".")
            self.formats = self.formats or _DEFAULT_FORMATS
            _check_writers(self.formats)  # before any work: no half-written --out
            self.made = _prepare_out(self.out)  # before any work: a bad --out fails in a second
        self.bars = bool(args.progress or _isatty(stderr))  # rank 0 shows bars (the others: none)
        self.progress = self.bars and self.speaker

    def step_lines(self, say: Any, every_rank: bool = False) -> Any:
        """Without a progress bar, a callback printing ``say(*step)`` to stderr per finished
        step, so a long run written to a file shows it is alive; None with a bar. Rank 0's
        alone unless ``every_rank`` (a sweep's ranks each run their own steps; none where rank
        0 shows a bar)."""
        if (self.bars if every_rank else self.progress) or not (self.speaker or every_rank):
            return None
        return lambda *step: print(f"{PROG}: {say(*step)}", file=self.stderr, flush=True)

    def load(self, spec: str, sized: bool = False) -> tuple[Any, str, Any]:
        """The model (a .pt2's ExportedProgram: compare counts its layers, and it is timed
        as it runs, its flat module()), its name and its input size (None where
        --tokens/--input give the inputs themselves; with ``sized``, also beside --tokens:
        compare feeds the ids only to the models that read them)."""
        loaded = self.load_spec(spec)
        size = self.input_size if self.input_size is not None else loaded.input_size
        model = loaded.model if loaded.program is None else loaded.program
        fed = self.input_specs or self.tokens and not sized
        return model, loaded.name, None if fed else size

    def input_text(self, size: Any) -> str:
        return f"{self.tokens} tokens" if self.tokens is not None else _shape_text(size)

    def named_inputs(self, models: Sequence[Any]) -> Any:
        """The inputs ``--tokens``/``--input`` ask for (None without them), at ``--batch-size``
        and on ``--device``; token ids drawn below the smallest vocabulary of ``models``."""
        if not self.input_specs and self.tokens is None:
            return None
        from modelprof.runtime.exported import runnable
        from modelprof.runtime.inputs import build_inputs, token_inputs, vocab_size

        models = [runnable(m) for m in models]  # an ExportedProgram: the module it runs
        batch = getattr(self.args, "batch_size", None) or 1
        made: Any = {}
        if self.tokens is not None:
            vocab = min(vocab_size(m) for m in models)
            made = token_inputs(models[0], self.tokens, batch, vocab=vocab, device=self.device)
        if self.input_specs:
            if isinstance(made, tuple):
                raise ModelProfError(
                    f"--input names keyword inputs, but {type(models[0]).__name__}.forward takes "
                    "no input_ids: --tokens passes the ids positionally; give every input with "
                    "--input instead"
                )
            made = {**made, **build_inputs(self.input_specs, batch, self.device)}
        return made

    def load_spec(self, spec: str) -> Any:
        from modelprof.models import load_spec

        loaded = load_spec(spec, trust_pickle=self.args.trust_pickle)
        given = self.input_size is not None or self.input_specs or self.tokens is not None
        model = loaded.model
        if loaded.size_defaulted and not given and _takes_token_ids(model):
            raise ModelProfError(
                f"{spec}: {type(model).__name__} is a transformers model that takes token ids "
                f"({model.main_input_name}) and {loaded.size_defaulted}: pass --tokens N (the "
                "sequence length, e.g. --tokens 128) or its inputs with --input, not the "
                f"{_shape_text(loaded.input_size)} image it would be given"
            )
        if loaded.size_defaulted and not given and self.speaker:
            print(
                f"{PROG}: note: {loaded.size_defaulted}: its input is taken as "
                f"{_shape_text(loaded.input_size)} (--input-size gives another)",
                file=self.stderr,
            )
        return loaded

    def path(self, stem: str, ext: str) -> Path:
        assert self.out is not None
        _prepare_out(self.out)
        return self.out / f"{_slug(stem)}.{ext}"

    def write(self, path: Path, writer: Any) -> None:
        """Run ``writer(path)`` on the speaking rank; a file that cannot be written is the
        user's --out, named."""
        if not self.speaker:
            return
        try:
            writer(path)
        except OSError as e:
            raise ModelProfError(
                f"--out {str(self.args.out or '.')!r}: cannot write {str(path)!r}"
                f" ({e.strerror or e})"
            ) from e
        self.wrote(path)

    def write_formats(
        self,
        stem: str,
        export: Any,
        figures: Sequence[tuple[str, Any]] = (),
        stems: Mapping[str, str] = {},
    ) -> None:
        """Every chosen format: a table through ``export(fmt, path)`` (named ``stems[fmt]``, else
        ``stem``), png as each ``(stem, make_figure)`` of ``figures``."""
        for fmt in self.formats:
            if fmt != "png":
                self.write(self.path(stems.get(fmt, stem), fmt), lambda p: export(fmt, p))
                continue
            for figure_stem, make in figures:
                fig = make()
                self.write(
                    self.path(figure_stem, "png"),
                    lambda p: fig.savefig(p, dpi=150, bbox_inches="tight"),
                )

    def wrote(self, path: Path) -> None:
        print(f"wrote {path}", file=self.stderr)

    def remove_unused_out(self) -> None:
        """After a failed run: the ``--out`` directories it created, if nothing went in."""
        for folder in self.made:  # deepest first; a folder holding anything stays, and above it
            try:
                folder.rmdir()
            except OSError:
                return

    def timing_options(self) -> dict[str, Any]:
        return {} if self.args.budget is None else {"budget_s": self.args.budget}

    def mode_options(self) -> dict[str, Any]:
        """The timing modes profile's and compare's flags set (none: the defaults)."""
        a = self.args
        named = ("clock", "per_layer", "amp")
        out = {k: getattr(a, k) for k in named if getattr(a, k, None) is not None}
        out.update((k, True) for k in ("channels_last", "compile") if getattr(a, k, False))
        if getattr(a, "no_correct_overhead", False):
            out["correct_overhead"] = False
        return out

    def run_options(self, named: Any) -> dict[str, Any]:
        """What profile() and compare() take from the table options: the batch (None with
        ``named_inputs``, which carry theirs), device, dtype, timing, progress, budget and
        ``backward``/``optimizer``, when asked for."""
        if self.args.optimizer is not None and not self.args.backward:
            raise ModelProfError("--optimizer needs --backward (it times a training step)")
        step = {"backward": True, "optimizer": self.args.optimizer} if self.args.backward else {}
        return {
            "batch_size": None if named is not None else self.args.batch_size,
            "device": self.device,
            "dtype": self.dtype,
            "timing": not self.args.no_timing,
            "progress": self.progress,
            **self.timing_options(),
            **self.mode_options(),
            **step,
        }


def _refuse_clashing_flags(args: argparse.Namespace) -> None:
    """Refuse flags that every model would refuse alike, naming both: a usage error (exit 2)
    before any model is built, not each model failing on its own (compare's exit 1, "every
    model failed"): the rules are profile()'s (``refuse_idle_amp``, ``refuse_eager_only``)."""
    amp = getattr(args, "amp", None)
    if amp is not None and args.dtype == "float64":
        raise ModelProfError(
            f"--amp {amp} with --dtype float64: autocast leaves float64 as it is, so nothing "
            "would run at half precision; pass --dtype float32 with --amp, or drop --amp"
        )
    if getattr(args, "throughput", False) and str(args.device).startswith("meta"):
        raise ModelProfError(  # compare's: the throughput command refuses it for itself
            "--device meta has no clock: --throughput times real runs at each batch size; "
            "pass a real --device to search, or drop --throughput to compare costs alone"
        )
    if getattr(args, "compile", False) and getattr(args, "backward", False):
        raise ModelProfError(
            "--compile with --backward: training steps are timed eagerly, so nothing would "
            "run compiled; drop --compile to time the training step, or --backward to time "
            "the compiled forward"
        )


def _check_writers(formats: Sequence[str]) -> None:
    """Refuse a format whose package is missing before anything is profiled or written."""
    import importlib.util

    needs = {**{f.suffix: f.needs for f in table_formats() if f.needs}, "png": "matplotlib"}
    for fmt in formats:
        package = needs.get(fmt)
        if package is not None and importlib.util.find_spec(package) is None:
            raise needs_package(f"--format {fmt}", package)


def _prepare_out(out: Path) -> list[Path]:
    """Create the ``--out`` directory, or refuse one that cannot be written; the directories
    made (deepest first)."""
    from modelprof.distributed.sweep_store import make_folder

    return make_folder(out, f"--out {str(out)!r}")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _slug(name: str) -> str:
    """A file-name-safe version of a model name (``timm:org/x`` -> ``timm_org_x``)."""
    return re.sub(r"[^\w.+-]+", "_", name).strip("_") or "model"


def _shape_text(size: Any) -> str:
    from modelprof.runtime.inputs import parse_input_size

    return ", ".join("x".join(map(str, s)) for s in parse_input_size(size))


# --- profile -------------------------------------------------------------------------------------


def _run_profile(ctx: _Context) -> None:
    from modelprof.profile import profile
    from modelprof.runtime.exported import arranged

    args = ctx.args
    if args.depth is not None and args.depth < 0:
        raise ModelProfError(f"--depth {args.depth} must be >= 0")
    columns = _columns_arg(args.columns, args)  # before the run: a typo costs no profile
    loaded = ctx.load_spec(args.model)
    model, name = loaded.model, loaded.name
    size = ctx.input_size if ctx.input_size is not None else loaded.input_size
    named = ctx.named_inputs([model])
    if isinstance(named, dict) and loaded.input_names is not None:  # a .pt2 takes no other layout
        named = arranged(loaded.input_names, named, "--input")  # (args, kwargs) by its signature
    given = {"inputs": named} if named is not None else _recorded_inputs(ctx, loaded)
    if ctx.progress:
        what = "analysing" if args.no_timing else "profiling and timing"
        given_as = "given" if named is not None else "recorded"
        shapes = f"{given_as} inputs" if given else _shape_text(size)
        print(f"{what} {name} ({shapes}) ...", file=ctx.stderr, flush=True)
    with _model_run():
        try:
            report = profile(
                model if loaded.program is None else loaded.program,  # (timed as it runs: flat)
                None if given else size,
                **given,
                **ctx.run_options(named),
            )
        except ModelProfError as e:
            raise _cli_batch_hint(e, ctx) from e.__cause__
    report.model_name = name  # the name asked for (resnet50), not the class (ResNet)
    depth = {} if args.depth is None else {"depth": args.depth}
    view: dict[str, Any] = {"style": args.style, **depth}
    shown = dict(view) if columns is None else {**view, "columns": columns}  # human formats'
    print(report.to_text(**shown), file=ctx.stdout)
    print(f"\n{report.summary()}", file=ctx.stdout)
    if ctx.out is None:
        return
    # cost always; time and roofline when measured, as report.export("png", path) writes them
    figures = [(f"{name}_{figure}", draw) for figure, draw in report.figures()]
    ctx.write_formats(  # json: the whole report, independent of the table's style, at --depth
        name if args.style == "modelprof" else f"{name}_torchstat",
        lambda f, p: (
            report.to_json(p, **depth)
            if f == "json"
            else report.export(f, p, **(shown if get_format(f).human else view))
        ),
        figures,
        {"json": name},
    )


#: the column groups (``modelprof.columns``) a training step fills, and those a timed run does
_STEP_GROUPS = ("step", "step_timing", "backward_comm")
_TIMED_GROUPS = ("timing", "step_timing", "kernels", "roofline", "utilization")


def _columns_arg(text: str | None, args: Any) -> Any:
    """``--columns``: ``all``, declared column names (an empty item refused; refused by name
    before anything runs, as is one the flags given leave unfilled, naming the flag) or None:
    not given, or ``compact``, the default."""
    if text is None:
        return None
    import modelprof.columns as registry

    names = comma_items("--columns", text)
    if names in (["all"], ["compact"]):
        return None if names == ["compact"] else "all"
    unknown = [c for c in names if registry.column(c) is None]
    if unknown or not names:
        near = nearest_keywords(unknown, registry.names(), mark="")
        raise ModelProfError(
            f"--columns {text!r}: unknown column(s) {unknown}{near}; names as in the CSV's header "
            "(module,params,macs,latency_ms,...), all or compact"
        )
    for groups, unset, flag in (
        (_STEP_GROUPS, not args.backward, "a training step's: add --backward"),
        (_TIMED_GROUPS, args.no_timing, "measured: drop --no-timing"),
    ):
        unfilled = [c for c in names if registry.column(c).group in groups]
        if unset and unfilled:
            raise ModelProfError(f"--columns {text!r}: column(s) {unfilled} are {flag}")
    return names


def _recorded_inputs(ctx: _Context, loaded: Any) -> dict[str, Any]:
    """A .pt2 archive's recorded inputs (their batch and dtypes are what the program takes,
    its keyword inputs as keywords) as ``profile(inputs=)`` when no size or batch is given;
    at a ``--batch-size``, those of a program with keyword inputs (which inputs made from
    sizes, all positional, cannot call) with their rows repeated to it; else empty, and its
    recorded shapes are used."""
    args, kwargs = loaded.example_args, loaded.example_kwargs or {}
    if ctx.input_size is not None or args is None:
        return {}
    if ctx.args.batch_size is not None:
        if not kwargs:
            return {}
        args, kwargs = _rebatched((args, kwargs), ctx.args.batch_size)
    return {"inputs": (tuple(args), kwargs) if args and kwargs else args or kwargs}


def _rebatched(inputs: Any, batch: int) -> Any:
    """``inputs`` at ``batch``: the rows of each tensor whose first dimension is the first
    tensor's (the batch they were recorded at) repeated in turn, or cut, to ``batch``."""
    from modelprof.runtime.tensors import iter_tensors, map_tensors
    from modelprof.step.throughput import batch_rows

    first = next((t for t in iter_tensors(inputs) if t.dim() > 0), None)
    if first is None:
        return inputs
    recorded = first.shape[0]
    return map_tensors(
        inputs, lambda t: batch_rows(t, batch) if t.dim() > 0 and t.shape[0] == recorded else t
    )


def _takes_token_ids(model: Any) -> bool:
    """A transformers model whose main input is ``input_ids`` (BertModel, not ResNetModel)."""
    hf = type(model).__module__.startswith("transformers.")
    return hf and getattr(model, "main_input_name", None) == "input_ids"


def _cli_batch_hint(error: ModelProfError, ctx: _Context) -> ModelProfError:
    """``error`` with profile()'s batch hint in the command line's words (``--input-size``,
    ``--batch-size``)."""
    shapes, made = getattr(error, "batch_hint", None), getattr(error, "unbatched", None)
    if not (shapes or made):
        return error
    text = str(error).split("\nhint:")[0]
    given = (  # (a spec's own size: a file's INPUT_SIZE, which may hold the batch)
        " ".join(f"--input-size {s}" for s in ctx.args.input_size)
        if ctx.args.input_size is not None
        else "the spec's own input size (its file's INPUT_SIZE"
        + "".join(f" {','.join(map(str, s))}" for s in shapes or ())
        + ")"
    )
    if made:
        return ModelProfError(
            f"{text}\nhint: --input-size holds every dimension but the batch (--batch-size sets "
            f"it): {given} gave the model {made}, which the convolution read as one unbatched "
            "input (a dimension short): give every dimension but the batch (an image's "
            "channels,height,width, e.g. --input-size 3,224,224)"
        )
    fixed = " ".join(f"--input-size {','.join(map(str, s[1:]))}" for s in shapes)
    return ModelProfError(
        f"{text}\nhint: --input-size excludes the batch dimension (--batch-size sets it): {given} "
        f"was taken as the size of one sample; if its first number is the batch, pass {fixed} "
        f"--batch-size {shapes[0][0]}"
    )


# --- compare -------------------------------------------------------------------------------------


def _run_compare(ctx: _Context) -> int | None:
    from modelprof.compare import compare
    from modelprof.render.comparison import compare_caption, env_caption
    from modelprof.report.plots import plot_compare
    from modelprof.runtime.exported import runnable
    from modelprof.runtime.inputs import reads_token_ids

    args = ctx.args
    models: dict[str, Any] = {}
    sizes: dict[str, Any] = {}
    for spec in args.models:
        model, name, size = ctx.load(spec, sized=True)
        name = unique_name(name, models)
        # --tokens: ids for each model that reads them (compare's tokens=), the others at
        # --input-size or their own; with --input, one set of inputs for all
        ids = ctx.tokens is not None and reads_token_ids(runnable(model))
        models[name], sizes[name] = model, None if ids else size
    named = ctx.named_inputs(list(models.values())) if ctx.input_specs else None
    # --baseline by its row's name or by the MODEL spec given for it (a file's factory's row
    # is named lm_build, its spec lm.py:build)
    baseline = dict(zip(args.models, models)).get(args.baseline, args.baseline)
    if named is not None and args.throughput:  # (compare's own refusal names Python's call)
        raise ModelProfError(
            "--throughput searches batch sizes of an --input-size or --tokens, not --input"
        )
    df = compare(
        models,
        sizes if named is None else None,
        inputs=named,
        tokens=ctx.tokens if named is None else None,
        baseline=baseline,
        throughput=args.throughput,
        throughput_options=_throughput_options(ctx),
        on_step=ctx.step_lines(str),
        **ctx.run_options(named),
    )
    _add_sources(df, models, args.models)
    caption = compare_caption(df.attrs, inputs=df.get("input_shape"))
    print(f"# comparison ({caption})\n", file=ctx.stdout)
    # captioned by the heading above, the table bare
    print(df.render.export("markdown", standalone=False, caption=None), file=ctx.stdout)
    for note in df.attrs.get("notes") or ():
        if note not in caption:  # (a failed model's: said once, in the heading)
            print(f"note: {cli_words(note)}", file=ctx.stdout)  # (meta's: --device meta)
    if ctx.out is not None:  # the comparison's own renderers: its caption in every table
        env = df.attrs.get("env") or {}
        figure = ("comparison", lambda: plot_compare(df, title=env_caption(env)))
        ctx.write_formats("comparison", df.render.export, [figure])
    return _failed_status(df)


def _add_sources(df: Any, names: Iterable[str], specs: Iterable[str]) -> None:
    """The MODEL (SPEC) each row is, in a ``source`` column where a row is named otherwise (two
    files' factories ``r18`` and ``r18 (2)``): printed, and in every file written."""
    given = dict(zip(names, specs))
    if any(name != spec for name, spec in given.items()):
        df.insert(0, "source", [given[name] for name in df.index])


def _failed_status(df: Any) -> int | None:
    """1 where a model of a comparison failed (its row holds the error) and the others were
    compared, as a sweep with a failed configuration: a script or CI sees it."""
    return 1 if "error" in df.columns and df["error"].notna().any() else None


# --- throughput ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _model_run() -> Iterator[None]:
    """A model's run: an error its code (or torch's) raised is a failed model, exit status 1 as
    a comparison's or a sweep's failed row; modelprof's own refusal of what was typed stays 2
    (its cause, if any, one it made and never raised: an input beyond memory)."""
    try:
        yield
    except ModelProfError as e:
        e.model_failed = _raised_by_model(e)
        raise


def _raised_by_model(e: ModelProfError) -> bool:
    """Whether ``e`` stands for an error the model's code (or torch's) raised: its first cause
    that is not modelprof's own was raised (has a traceback)."""
    cause = e.__cause__
    while isinstance(cause, ModelProfError):
        cause = cause.__cause__
    return cause is not None and cause.__traceback__ is not None


def _run_throughput(ctx: _Context) -> int | None:
    from modelprof.step.spec import StepSpec
    from modelprof.step.throughput import step_measure
    from modelprof.timing import measure_throughput

    args = ctx.args
    options = _throughput_options(ctx)
    if args.optimizer is not None and not args.backward:  # before any model is built
        raise ModelProfError("--optimizer needs --backward (it times a training step)")
    steps = " (whole training steps)" if args.backward else ""
    step = StepSpec.parse(optimizer=args.optimizer) if args.backward else None
    loaded = [(spec, *ctx.load(spec)) for spec in args.models]  # a typo costs no search
    failed = []
    for spec, model, name, size in loaded:
        try:
            result = measure_throughput(
                model,
                size,
                tokens=ctx.tokens,
                device=ctx.device,
                dtype=ctx.dtype,
                progress=ctx.progress,
                on_point=ctx.step_lines(
                    lambda p, n=name: f"{n}: batch {p.batch_size}: {p.samples_per_s:,.1f} samples/s"
                ),
                measure=None if step is None else step_measure(size, step, tokens=ctx.tokens),
                **options,
            )
        except ModelProfError as e:  # the others go on, as compare's do
            if not _raised_by_model(e):  # a refusal of what was typed: a usage error, exit 2
                raise
            warn_user(f"{spec} failed, no throughput measured: {e}", ModelProfWarning)
            print(f"# {spec}  failed (the warning on stderr says why)\n", file=ctx.stdout)
            failed.append(spec)
            continue
        _show_throughput(ctx, name, size, result, steps)
    if failed:  # (every model failed: no empty --out left behind, as a failed run leaves none)
        ctx.remove_unused_out()
    return 1 if failed else None  # a run with a failed model failed, after the others


def _show_throughput(ctx: _Context, name: str, size: Any, result: Any, steps: str) -> None:
    """One model's curve and best batch size printed, its notes, and its files written."""
    from modelprof.render import to_markdown
    from modelprof.render.options import ViewOptions
    from modelprof.report.plots import plot_throughput

    best, curve = result.best, result.to_dataframe()
    print(f"# {name}  (input {ctx.input_text(size)})\n", file=ctx.stdout)
    print(to_markdown(curve), file=ctx.stdout)
    print(
        f"\nbest: {best.samples_per_s:,.1f} samples/s over all its runs at batch size "
        f"{best.batch_size}{steps}; "
        f"{result.stop_explanation}\n",
        file=ctx.stdout,
    )
    # a batch size out of line with a bigger one (its ~ cells); load and drift
    for note in [*result.notes, *result.timing_notes]:
        print(f"!! {note}\n", file=ctx.stdout)
    if ctx.out is not None:  # raw numbers in csv/json, human units elsewhere
        stem = f"{name}_throughput"
        caption = f"{name} throughput, input {ctx.input_text(size)}{steps}"  # what a sample is
        if result.timing_notes:
            caption += "; timed on a loaded or changing machine (see the notes)"
        # (each format reads its own of these; the result adds what ~ marks)
        named = ViewOptions(caption=caption, title=caption)
        ctx.write_formats(
            stem,
            lambda f, p: result.export(f, p, view=named),
            [(stem, lambda: plot_throughput(curve, title=caption))],
        )


def _int_list_arg(flag: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    items = comma_items(flag, text)  # (an empty item refused, not skipped)
    try:
        return [int(v) for v in items]
    except ValueError:
        raise ModelProfError(f"{flag} {text!r} must be comma-separated integers") from None


def _run_generate(ctx: _Context) -> None:
    from modelprof.generation import profile_generation
    from modelprof.render import to_markdown

    args = ctx.args
    if len(args.specs) > 1:
        return _compare_generation(ctx)
    _memory_flag(args.memory)
    model, name = _language_model(ctx, args.specs[0])
    timing = not args.no_timing and (ctx.device is None or ctx.device.type != "meta")
    with _model_run():
        report = profile_generation(
            model,
            args.prompt_len,
            args.new_tokens,
            _int_list_arg("--batch-size", args.batch_sizes),
            cache=None if args.cache == "none" else args.cache,
            contexts=_int_list_arg("--contexts", args.contexts),
            timing=timing,
            layer_timing=not args.no_layer_timing,
            target=args.target,
            progress=ctx.progress,
            on_step=ctx.step_lines(str),
            **ctx.timing_options(),
        )
    print(report, file=ctx.stdout)
    print("\n" + to_markdown(report.phase_table()), file=ctx.stdout)
    if args.memory is not None and report.memory is not None:
        print(f"\n{report.memory.fit_text(args.memory)}", file=ctx.stdout)
    if ctx.out is None:
        return
    stem = f"{name}_generation"
    figures = []  # per batch size where there are several (decode growth: its bytes untimed too)
    for b in report.batch_sizes:
        at = f"_batch{b}" if len(report.batch_sizes) > 1 else ""
        figures += [
            (f"{stem}{at}_decode_growth", lambda b=b: report.plot_decode_growth(batch_size=b)),
            (f"{stem}{at}_phase_share", lambda b=b: report.plot_phase_share(batch_size=b)),
        ]

    def export(fmt: str, path: Path) -> Any:  # the Markdown document: with --memory, what fits
        fits = {"memory_bytes": args.memory} if fmt == "md" else {}
        return report.export(fmt, path, **fits)

    ctx.write_formats(stem, export, figures)
    if report.peaks is not None and "csv" in ctx.formats:
        ctx.write(
            ctx.path(f"{stem}_bound", "csv"), lambda p: report.bound_table().to_csv(p, index=False)
        )


def _language_model(ctx: _Context, spec: str) -> tuple[Any, str]:
    """generate's SPEC, loaded: its model and name; a model that is no causal LM refused as
    what was typed (exit 2), named by its SPEC (the library's error names the class alone:
    ResNet for resnet18) with what generate takes, before anything runs."""
    from modelprof.generation.lm import is_hf_causal_lm
    from modelprof.generation.specs import load_language_model

    model, name = load_language_model(
        spec, ctx.device, ctx.dtype, trust_pickle=ctx.args.trust_pickle
    )
    if not is_hf_causal_lm(model):
        raise ModelProfError(
            f"SPEC {spec!r} builds {a_type(model)}, not a transformers causal LM (no "
            "config/generate): generate takes a transformers causal LM, a config SPEC "
            "(LlamaConfig:num_hidden_layers=2), a config.json or file.py:FACTORY building one"
        )
    return model, name


#: generate's options that profile one model, not a comparison of several
_ONE_MODEL_FLAGS = ("contexts", "target", "memory", "no_timing", "no_layer_timing")


def _compare_generation(ctx: _Context) -> int | None:
    """``generate SPEC SPEC ...``: ``compare_generation``'s table, its notes, its exports."""
    from modelprof.generation import compare_generation
    from modelprof.render.comparison import compare_caption

    args = ctx.args
    for flag in _ONE_MODEL_FLAGS:
        if getattr(args, flag) is not None and getattr(args, flag) is not False:  # (--memory 0)
            raise ModelProfError(
                f"--{flag.replace('_', '-')} profiles one model; several SPECs are compared "
                "end to end (TTFT, TPOT, tokens/s): give one SPEC, or drop it"
            )
    batch = _int_list_arg("--batch-size", args.batch_sizes)
    if batch is None or len(batch) != 1:
        raise ModelProfError(
            f"--batch-size {args.batch_sizes}: several SPECs are compared at one batch size"
        )
    if ctx.device is not None and ctx.device.type == "meta":
        raise ModelProfError("--device meta has no clock: several SPECs are compared by timing")
    if "png" in ctx.formats:
        raise ModelProfError("--format png: a comparison of SPECs has no figure; drop png")
    models: dict[str, Any] = {}
    for spec in args.specs:
        model, name = _language_model(ctx, spec)
        models[unique_name(name, models)] = model
    df = compare_generation(
        models,
        args.prompt_len,
        args.new_tokens,
        batch[0],
        cache=None if args.cache == "none" else args.cache,
        progress=ctx.progress,
        **ctx.timing_options(),
    )
    _add_sources(df, models, args.specs)
    caption = compare_caption(df.attrs)
    print(f"# generation comparison ({caption})\n", file=ctx.stdout)
    print(df.render.export("markdown", standalone=False, caption=None), file=ctx.stdout)
    for note in df.attrs.get("notes") or ():
        if note not in caption:  # (a failed model's: said once, in the heading)
            print(f"note: {cli_words(note)}", file=ctx.stdout)  # (meta's: --device meta)
    if ctx.out is not None:
        ctx.write_formats("generation_comparison", df.render.export)
    return _failed_status(df)


def _throughput_options(ctx: _Context) -> dict[str, Any]:
    """``measure_throughput`` options from ``--max-batch`` and ``--budget`` (per batch size)."""
    given = ctx.args.max_batch
    return {**({} if given is None else {"max_batch": given}), **ctx.timing_options()}


# --- sweep ---------------------------------------------------------------------------------------

#: What _Context reads, for the commands that take none of the common options.
_NO_COMMON: dict[str, Any] = {
    **dict.fromkeys(("input_size", "device", "dtype", "out", "format", "budget", "threads")),
    "trust_pickle": False,
}


def _add_sweep_parser(sub: Any) -> None:
    """``modelprof sweep CONFIG``: its options are its own (the grid says models, dtypes...)."""
    s = sub.add_parser(
        "sweep",
        help="many configurations, resumable, dealt across torchrun ranks",
        description="Profile every configuration of a sweep file (models x batch sizes x dtypes x "
        "modes) into one table. Under torchrun the configurations are dealt across the ranks; rank "
        "0 prints and writes the table.",
    )
    s.add_argument(
        "config",
        metavar="CONFIG",
        type=Path,
        help="a .toml or .json sweep file: models, batch_sizes, dtypes, modes, "
        "timing, device, input_size, options (or several [[grid]] tables)",
    )
    s.add_argument(
        "--out",
        dest="sweep_out",
        type=Path,
        metavar="DIR",
        help="folder for one result file per configuration and the combined sweep.csv/sweep.json "
        "(default: CONFIG's name + '_sweep' in the current folder)",
    )
    _switch(s, "--no-resume", "run every configuration again, even those DIR already holds")
    _switch(s, "--retry-failed", "run the configurations that failed last time again")
    s.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="how long a rank waits for the others before giving up",
    )
    _switch(
        s,
        "--progress",
        "show rank 0's progress bar even when stderr is not a terminal "
        "(default: only on a terminal; needs tqdm)",
    )
    s.add_argument(
        "--threads",
        type=_threads_arg,
        metavar="N",
        help="torch's intra-op threads for every configuration (torch.set_num_threads; on a "
        "loaded machine, the cores the other work leaves idle) (default: torch's)",
    )
    # a sweep file says these per grid (its own --threads, given, wins over the default)
    s.set_defaults(run=_run_sweep, **_NO_COMMON)


#: The columns ``modelprof sweep`` prints (all of them are in the files): ``root_latency_ms``
#: is what a rough median's reason (``latency_unquotable``) says to quote.
_SWEEP_SHOWN = (
    "model batch_size dtype mode timing status params macs flops latency_median_ms "
    "root_latency_ms latency_loaded cpu_work_median_ms rank wall_s"
).split()


def _run_sweep(ctx: _Context) -> int:
    from modelprof.sweep import sweep

    args = ctx.args
    _finite_number("--timeout", args.timeout, "seconds")
    out = args.sweep_out or Path(f"{_slug(args.config.stem)}_sweep")

    world = os.environ.get("WORLD_SIZE", "1")
    who = "" if world == "1" else f"rank {os.environ.get('RANK', '0')}: "

    def said(config: Any, row: Any) -> str:  # each rank says its own configurations
        again = f" (read back from an earlier run in {out}; --no-resume runs it again)"
        back = again if row.get("read_back") else ""
        return f"sweep: {who}{config.name}: {row['status']}{back}"

    df = sweep(
        args.config,
        out=out,
        resume=not args.no_resume,
        retry_failed=args.retry_failed,
        progress=ctx.progress,
        timeout_s=args.timeout,
        on_config=ctx.step_lines(said, every_rank=True),
    )
    failed = int((df["status"] != "ok").sum())
    if os.environ.get("RANK", "0") != "0":
        return int(failed > 0)  # one voice: rank 0 prints and has written the table
    shown = [c for c in _SWEEP_SHOWN if c in df.columns]
    # the text format's rules, as every printed table's: a rough median ~ (its latency_rough,
    # read from the whole frame), a missing value n/a, units in the cells
    print(export_table("text", df, columns=shown), file=ctx.stdout)
    earlier = len(df.attrs["read_back"])  # every rank's, gathered with the rows
    print(
        f"\n{len(df)} configurations: {len(df) - failed} ok, {failed} failed"
        + (f" (their errors: the error column of {out / 'sweep.csv'})" if failed else "")
        + f"; {world} rank(s)"
        + (
            f"; {earlier} read back from an earlier run in {out} (--no-resume runs them again)"
            if earlier
            else ""
        ),
        file=ctx.stdout,
    )
    for name in ("sweep.csv", "sweep.json"):
        ctx.wrote(out / name)
    return int(failed > 0)  # a run with failures failed, after writing what succeeded


# --- fit ---------------------------------------------------------------------------------------


def _add_fit_parser(sub: Any) -> None:
    """``modelprof fit SPEC``: bytes per rank for inference and training plans on a device."""
    f = sub.add_parser(
        "fit",
        help="does a model fit a device: bytes per rank per plan",
        description="Weights, KV cache and activations for inference; weights, gradients, "
        "optimizer state, master weights and saved activations for training under data parallel "
        "and ZeRO-1/2/3 (FSDP); per rank, counted on meta.",
    )
    f.add_argument(
        "spec",
        metavar="SPEC",
        help="a transformers config class with overrides "
        "(LlamaConfig:hidden_size=8192,num_hidden_layers=80) or a config.json (built as fit() "
        "builds a config: its language model, else the bare model), a torchvision name "
        "(resnet18), torchvision:NAME, timm:NAME (needs timm), file.py:FACTORY, an exported "
        ".pt2, or a saved module (.pt/.pth with --trust-pickle); random weights, never "
        "downloaded",
    )
    _switch(
        f,
        "--trust-pickle",
        "allow loading a whole pickled module from .pt/.pth (unpickling can run arbitrary code)",
    )
    f.add_argument(
        "--target",
        "--on",
        dest="fit_device",
        metavar="DEVICE",
        help="a datasheet device name, e.g. 'H100 SXM' (the default without --memory), "
        "'A100 SXM 80GB' (as generate's --target; --on is the older spelling)",
    )
    f.add_argument(
        "--memory",
        "--memory-bytes",
        dest="memory_bytes",
        type=_bytes_arg,
        metavar="BYTES",
        help="the device's memory in bytes (80e9, 80GB, 80GiB), instead of the datasheet's "
        "(--memory-bytes is the older spelling)",
    )
    f.add_argument(
        "--dtype",
        "--fit-dtype",
        dest="fit_dtype",
        default="bfloat16",
        metavar="DTYPE",
        help="weights' and activations' dtype (--fit-dtype is the older spelling)",
    )
    f.add_argument(
        "--context",
        type=int,
        default=2048,
        metavar="N",
        help="tokens per sequence (KV cache, training sequence)",
    )
    f.add_argument(
        "--batch-size",
        "--batch",
        dest="fit_batch",
        type=int,
        default=1,
        metavar="N",
        help="sequences per data-parallel rank (--batch is the older spelling)",
    )
    f.add_argument(
        "--input-size",
        dest="fit_input_size",
        type=_input_size_type,
        metavar="C,H,W",
        help="the input shape, batch excluded, at which a model fed no token ids (resnet18, "
        "vit_b_16) counts its activations; default: the one the spec records",
    )
    f.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel degree")
    f.add_argument("--ranks", type=int, default=1, metavar="N", help="data-parallel ranks")
    f.add_argument(
        "--optimizer",
        default="adam",
        help="adam, adamw, sgd, sgd_momentum or any torch.optim name (adafactor, rmsprop...)",
    )
    f.add_argument(
        "--checkpointing",
        choices=("none", "full", "selective"),
        default="none",
        help="activation checkpointing of the training plans (Korthikanti et al. 2022)",
    )
    _switch(f, "--inference-only", "no training plans")
    f.add_argument(
        "--out", type=Path, metavar="DIR", help="write the table into DIR (csv,md without --format)"
    )
    f.add_argument(
        "--format",
        metavar="LIST",
        help=f"comma-separated formats to write: {','.join(f for f in FORMATS if f != 'png')} "
        "(implies --out .)",  # (no png: fit draws no figure)
    )
    own = {k: v for k, v in _NO_COMMON.items() if k not in ("out", "format", "trust_pickle")}
    f.set_defaults(run=_run_fit, progress=False, **own)


def _run_fit(ctx: _Context) -> None:
    import torch

    from modelprof.fit import fit, takes_token_ids
    from modelprof.generation.specs import load_sized_model, load_spec_config

    a = ctx.args
    _memory_flag(a.memory_bytes)
    if "png" in ctx.formats:
        raise ModelProfError("--format png: fit draws no figure (its formats are the tables')")
    # a config is fit()'s to build, as its Python API builds it (a bare ViTModel where no
    # language-model class maps the config), not generate's language model
    named, size = load_spec_config(a.spec), None
    if named is None:
        model, name, size = load_sized_model(
            a.spec, torch.device("meta"), None, trust_pickle=a.trust_pickle
        )
        if size is not None and takes_token_ids(model):  # fed token ids: no input size
            size = None
    else:
        model, name = named
    options = dict(
        device=a.fit_device,
        memory_bytes=a.memory_bytes,
        dtype=a.fit_dtype,
        batch_size=a.fit_batch,
        context=a.context,
        tp=a.tp,
        ranks=a.ranks,
        optimizer=a.optimizer,
        training=not a.inference_only,
        checkpointing=a.checkpointing,
    )
    try:
        given = a.fit_input_size if a.fit_input_size is not None else size
        with _model_run():
            report = fit(model, input_size=given, **options)
    except ModelProfError as e:
        # the spec's own size, not asked for: its forward failing there leaves weights and states
        if a.fit_input_size is not None or not getattr(e, "forward_failed", False):
            raise
        warn_user(
            f"fit: no activations counted at the spec's own input size ({_shape_text(size)}, "
            f"not a --input-size given): profile on meta refused it: {e.forward_failed}",
            ModelProfWarning,
        )
        with _model_run():
            report = fit(model, **options)
    # the name its files have (the SPEC's), then the class counted: Llama (LlamaForCausalLM)
    counted = f" ({report.model})" if report.model not in ("", name) else ""
    report = dataclasses.replace(report, model=name + counted)
    print(report.to_text(), file=ctx.stdout)
    if ctx.out is not None:
        # named as generate names its files (a file's factory by file and name, as profile does)
        ctx.write_formats(f"{name}_fit", report.export)


# --- entry point ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _one_line_warnings(stream: TextIO, words: Any = None) -> Iterator[None]:
    """Show each warning as ``modelprof: warning: <message> (<Category>)``, without the
    library's file and line, its keywords said by ``words`` (default :func:`cli_words`)."""
    words = words or cli_words

    def show(message: Warning | str, category: type[Warning], *where: Any, **_: Any) -> None:
        text = words(str(message).removeprefix(f"{PROG}: "))  # said once
        print(f"{PROG}: warning: {text} ({category.__name__})", file=stream)

    with warnings.catch_warnings():  # puts showwarning back on exit
        warnings.showwarning = show
        yield


#: a warning's Python keywords as the command line says them: its flag where it has one, else
#: named as the Python API's (the CLI has no flag for the sampling caps)
_CLI_WORDS = (
    (re.compile(r"torch\.set_num_threads\((\w+)\)"), r"--threads \1"),
    (re.compile(r"\bprogress=True\b"), "--progress"),
    (re.compile(r"\b((?:layer|floor)_extend_s)= caps it"), r"the Python API's \1= caps it"),
)


def _flag_words(m: re.Match) -> str:
    """``prompt_len=0`` as its flag says it: ``--prompt-len 0``."""
    return f"--{m[1].replace('_', '-')} {m[2]}"


#: the keywords of a run's options as its flags (not a sweep's: its file's keys are these)
_OPTION_WORDS = (
    # (batch norm's train-mode hint: its tensors' aside and training=True are the Python API's)
    (
        re.compile(r"\bbatch_size=(\d+)( or more)?(?: \(inputs given as tensors[^)]*\))?"),
        r"--batch-size \1\2",
    ),
    (re.compile(r"\bcontext=(\d+)"), r"--context \1"),
    # (generate's and fit's own: their flags, as a trial read them in Python's words)
    (re.compile(r"\b(prompt_len|new_tokens|tp|ranks)=(-?\d+)\b"), _flag_words),
    (re.compile(r"\bdevice='([^']*)'(?= is not in the datasheet)"), r"--target \1"),  # fit's
    (re.compile(r"\b(device|target|baseline)='([^']*)'"), _flag_words),
    (re.compile(r"\bdtype='([^']*)'"), r"--dtype \1"),
    (re.compile(r"\bmemory_bytes="), "--memory"),
    (re.compile(r"\btokens=(\d+|N)\b"), r"--tokens \1"),
    (re.compile(r"\bbackward=True(?:, training=True)?\b"), "--backward"),
    (re.compile(r"\bbudget_s=(?!\w)"), "--budget"),
    (re.compile(r"\bpass backward=False\b"), "drop --backward"),
    (re.compile(r"\binput_size=(?=, batch excluded|[ ,:;)]|$)"), "--input-size"),
    (  # (a class or a factory: the Python API's alone)
        re.compile(
            r"\boptimizer='([^']*)'( is not a torch\.optim optimizer; use one of [^]]*\])?"
            r"(?:, a class or a factory)?"
        ),
        r"--optimizer \1\2",
    ),
    (re.compile(r"\bdtype=torch\.(float32|float16|bfloat16|float64)\b"), r"--dtype \1"),
    (
        re.compile(r"\binput_size=\((\d+(?:, \d+)*),?\)"),
        lambda m: "--input-size " + m[1].replace(", ", ","),
    ),
)


def cli_words(text: str, options: bool = True) -> str:
    """``text`` (a library warning or error) with each Python keyword it advises said as the
    command line's flag (``torch.set_num_threads(2)``: ``--threads 2``; ``progress=True``:
    ``--progress``), or, where the command line has none, as the Python API's; ``options``:
    the run's own too (``batch_size=2``: ``--batch-size 2``; not a sweep's, whose file's keys
    are the Python API's)."""
    for pattern, words in _CLI_WORDS + (_OPTION_WORDS if options else ()):
        text = pattern.sub(words, text)
    return text


def _threads_arg(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of threads (1, 2, ...)")
    return int(text)


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """``--threads N``: torch's intra-op threads for the command, then as they were."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _all_ranks(on: bool) -> Any:
    """``--all-ranks``: MODELPROF_ALL_RANKS=1 for the command (the environment put back)."""
    from unittest import mock

    from modelprof.runtime.group import ALL_RANKS_ENV

    return mock.patch.dict(os.environ, {ALL_RANKS_ENV: "1"}) if on else contextlib.nullcontext()


def _refuse_unknown(
    parser: argparse.ArgumentParser, args: Any, unknown: list[str], argv: Sequence[str]
) -> None:
    """Exit with the command's usage error (the top level's when the first unknown argument
    came before the command's name), suggesting the nearest flag for a misspelt one."""
    argv = list(argv)
    first = argv.index(unknown[0]) if unknown[0] in argv else len(argv)
    where = parser if first < argv.index(args.command) else args.command_parser
    flags = [f for a in where._actions for f in a.option_strings if f.startswith("--")]
    hints = []
    for arg in unknown:
        flag = arg.split("=", 1)[0]
        near = difflib.get_close_matches(flag, flags, 1, 0.75) if flag.startswith("--") else []
        hints += [f"{flag}: did you mean {near[0]}?"] if near else []
    hint = f" ({'; '.join(hints)})" if hints else ""
    where.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 2 a usage error or a ModelProfError
    refusing what was typed, 1 a bug or a model's run that failed: profile's, a sweep's failed
    configuration, a comparison's or throughput's failed model, the others done)."""
    parser = build_parser()
    stdout, stderr = sys.stdout, sys.stderr
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            _refuse_unknown(parser, args, unknown, sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed by argparse
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    # said in the flags typed; a sweep's in its file's keys (batch_size = 0), which it has none of
    sweep = getattr(args, "run", None) is _run_sweep
    words = functools.partial(cli_words, options=not sweep)
    try:
        from modelprof.runtime.group import is_speaker

        with (
            _threads(args.threads),
            _all_ranks(getattr(args, "all_ranks", False)),
            _one_line_warnings(stderr if is_speaker() else io.StringIO(), words),
        ):
            ctx = _Context(args, stdout, stderr)
            try:
                status = args.run(ctx)
            except BaseException:
                ctx.remove_unused_out()  # a refused or failed run leaves no empty --out behind
                raise
    except ModelProfError as e:
        print(f"{PROG}: error: {words(str(e))}", file=stderr)
        return 1 if getattr(e, "model_failed", False) else 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=stderr)
        return 130
    except SystemExit as e:  # the user's model code called sys.exit(): nothing was profiled
        print(
            f"{PROG}: error: the model's code called sys.exit({e.code!r}) before profiling "
            "finished",
            file=stderr,
        )
        return 2
    except Exception:  # noqa: BLE001 - a bug: show everything
        print(f"{PROG}: internal error (please report it):", file=stderr)
        traceback.print_exc(file=stderr)
        return 1
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
