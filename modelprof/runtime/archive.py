"""What loading a ``torch.export`` archive (``.pt2``) would run, found without loading it.

``torch.export.load`` runs code through unpickling, AOTInductor libraries, ``sympify`` of
symbolic sizes, targets resolved by name and ``exec`` of ``guards_code``. :func:`inspect_pt2`
lists what in any member these reach it cannot prove harmless (loaded only when trusted); size
and compression-ratio caps refuse a zip bomb before inflating.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from typing import Any

import torch

from modelprof.errors import ModelProfError, error_line
from modelprof.runtime.inputs import available_memory_bytes, bytes_text

__all__ = ["MAX_MEMBER_BYTES", "MAX_RATIO", "check_pt2_file", "inspect_pt2", "loadable_bytes"]

MAX_MEMBER_BYTES = 8 << 30
"""Largest member (uncompressed) an archive may hold: 8 GiB."""
MAX_RATIO = 100
"""Largest compression ratio of a member over 1 MiB. ``torch.export.save`` stores members
uncompressed (ratio 1); a re-zipped archive of real weights stays far below this."""
_RATIO_FLOOR = 1 << 20
_READ_CAP = 1 << 30  # most bytes of one member read into memory to inspect it

# members of either layout that hold plain text no loader evaluates
_PLAIN = tuple(
    "archive_format archive_version version .data/version byteorder .data/serialization_id".split()
)
_PLAIN_DIRS = ("extra/", "extra_files/")
# the older (torch <= 2.7) layout: torch.load falls back to full unpickling whatever the extension
_OLD_PROGRAM = "serialized_exported_program.json"
_OLD_PICKLES = tuple(
    """serialized_state_dict.json serialized_state_dict.pt serialized_constants.json
    serialized_constants.pt serialized_example_inputs.pt""".split()
)

# --- the names a symbolic expression or a guard may use ------------------------------------------
_SYMBOL = re.compile(r"[a-z]{1,4}[0-9]+\Z")  # s0, s77, u3, zuf0: the symbols export creates
_SYMPY_NAMES = frozenset(
    """Symbol Integer Rational Float Max Min Eq Ne Lt Le Gt Ge StrictLessThan StrictGreaterThan
    LessThan GreaterThan Equality Unequality And Or Not Add Mul Pow Abs floor ceiling sqrt oo zoo
    nan true false True False None Piecewise ITE""".split()
    # torch.utils._sympy.functions (the deserializer's sympy_functions)
    + """FloorDiv ModularIndexing Where PythonMod Mod CleanDiv CeilToInt FloorToInt CeilDiv LShift
    RShift PowByNatural FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator
    TruncToFloat TruncToInt RoundToInt RoundDecimal ToFloat Identity OpaqueUnaryFn_sqrt
    BitwiseFn_bitwise_and BitwiseFn_bitwise_or""".split()
)
_SYMPY_KEYWORDS = frozenset(
    "positive negative integer real nonnegative nonpositive finite evaluate commutative".split()
)
_GUARD_NAMES = _SYMPY_NAMES | {"L", "math", "inf"}
_GUARD_ATTRIBUTES = frozenset("size stride storage_offset dim numel floor ceil trunc sqrt".split())
_EXPR_NODES = tuple(
    getattr(ast, name)
    for name in """Expression BinOp UnaryOp BoolOp Compare Call Name Constant keyword Load operator
    unaryop boolop cmpop Tuple""".split()
)
_GUARD_NODES = (*_EXPR_NODES, ast.Subscript, ast.Attribute, ast.Slice)

# node targets the deserializer resolves by name (getattr chains under torch, operator, math)
_OPERATOR_TARGETS = frozenset(
    """eq ne le ge lt gt neg pos mul add sub floordiv mod pow truediv and_ or_ lshift rshift
    getitem not_ abs xor invert""".split()
)
_MATH_TARGETS = frozenset("trunc ceil floor sqrt".split())
_TORCH_TARGETS = frozenset(
    """sym_not sym_int sym_float sym_ite sym_max sym_min sym_sqrt sym_sum _sym_sqrt _assert _check
    _check_is_size""".split()
)
_OP_TARGET = re.compile(
    r"torch\.ops\.[A-Za-z][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*"
    r"(\.[A-Za-z_][A-Za-z0-9_]*)?\Z"
)


def _safe_expression(text: Any, *, guard: bool) -> bool:
    """Whether ``text`` names only symbols and known functions, so it can call nothing else."""
    if not isinstance(text, str) or len(text) > 100_000:
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    allowed_nodes = _GUARD_NODES if guard else _EXPR_NODES
    names = _GUARD_NAMES if guard else _SYMPY_NAMES
    for node in ast.walk(tree):
        if not isinstance(node, allowed_nodes):
            return False
        if isinstance(node, ast.Name) and node.id not in names and not _SYMBOL.match(node.id):
            return False
        if isinstance(node, ast.Attribute) and node.attr not in _GUARD_ATTRIBUTES:
            return False
        if isinstance(node, ast.keyword) and node.arg not in _SYMPY_KEYWORDS:
            return False
        if isinstance(node, ast.Call) and not isinstance(node.func, (ast.Name, ast.Attribute)):
            return False
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and not re.fullmatch(r"[A-Za-z0-9_]{0,64}", node.value)
        ):
            return False
    return True


def _safe_target(target: Any) -> bool:
    """Whether a node target names an operator, not any object reachable from ``torch``."""
    if not isinstance(target, str) or "__" in target:
        return False
    head, _, rest = target.partition(".")
    if head == "torch" and rest.startswith("ops."):
        return bool(_OP_TARGET.match(target)) and not rest.startswith(
            ("ops.load_library", "ops.import_module")
        )
    return (
        (head == "_operator" and rest in _OPERATOR_TARGETS)
        or (head == "math" and rest in _MATH_TARGETS)
        or (head == "torch" and rest in _TORCH_TARGETS)
    )


def _walk(obj: Any) -> Iterator[tuple[str, Any]]:
    """``(key, value)`` for every entry of a JSON document."""
    stack = [obj] if isinstance(obj, (dict, list)) else []
    while stack:
        node = stack.pop()
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            yield str(key), value
            if isinstance(value, (dict, list)):
                stack.append(value)


def program_findings(document: Any, member: str) -> list[str]:
    """What in a serialized program (``models/*.json``) reaches an evaluator unproven."""
    found: list[str] = []
    for key, value in _walk(document):
        if key == "expr_str" and not _safe_expression(value, guard=False):
            found.append(
                f"{member}: symbolic expression {str(value)[:60]!r} (sympify evaluates it)"
            )
        elif key == "target" and isinstance(value, str) and not _safe_target(value):
            found.append(f"{member}: node target {value[:60]!r} (resolved and called by name)")
        elif key == "as_operator" and not _safe_target(value):
            found.append(f"{member}: operator argument {str(value)[:60]!r}")
        elif key == "guards_code" and isinstance(value, list):
            for code in value:
                if not _safe_expression(code, guard=True):
                    found.append(
                        f"{member}: guard code {str(code)[:60]!r} (exec'd when the module is built)"
                    )
        elif key == "range_constraints" and isinstance(value, dict):
            found.extend(
                f"{member}: range constraint on {str(k)[:60]!r}"
                for k in value
                if not _safe_expression(k, guard=False)
            )
        if len(found) > 20:
            break
    return found


# --- reading members with caps -------------------------------------------------------------------


def _check_sizes(infos: list[zipfile.ZipInfo], where: str) -> None:
    """Refuse duplicate members and a zip bomb before any member is inflated."""
    seen: set[str] = set()
    for info in infos:
        if info.filename in seen:
            raise ModelProfError(
                f"{where} holds member {info.filename!r} twice; loaders would "
                "disagree on which one is read"
            )
        seen.add(info.filename)
        size, packed = info.file_size, max(info.compress_size, 1)
        if size > MAX_MEMBER_BYTES:
            raise ModelProfError(
                f"{where}: member {info.filename!r} inflates to {size:,} bytes "
                f"(more than {MAX_MEMBER_BYTES:,}); refused as a zip bomb"
            )
        if size > _RATIO_FLOOR and size > MAX_RATIO * packed:
            ratio = size / packed
            raise ModelProfError(
                f"{where}: member {info.filename!r} inflates {ratio:,.0f}x "
                f"({info.compress_size:,} -> {size:,} bytes, more than "
                f"{MAX_RATIO}x); refused as a zip bomb"
            )


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> bytes:
    """A member's bytes: never more than its declared size or the read cap."""
    limit = info.file_size
    if limit > _READ_CAP:
        raise ModelProfError(
            f"{where}: member {info.filename!r} ({limit:,} bytes) is "
            "too large to inspect; pass --trust-pickle (trust_pickle=True) "
            "if you trust the file"
        )
    try:
        with archive.open(info) as stream:
            out = stream.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, RuntimeError) as e:
        # damaged, encrypted or unsupported compression (NotImplementedError, a RuntimeError):
        # the archive's fault, in one line
        raise ModelProfError(
            f"{where} is corrupt or not a torch.export archive: member {info.filename!r} "
            f"cannot be read ({error_line(e)})"
        ) from e
    if len(out) > limit:
        raise ModelProfError(
            f"{where}: member {info.filename!r} inflates past its declared size; refused"
        )
    return out


def _loads_weights_only(data: bytes) -> bool:
    """Whether a ``torch.save`` payload loads with the weights-only unpickler (runs no code)."""
    if not data:
        return True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "pickle protocol 4 detected" and the like
            torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - refused or unreadable: either way not provably safe
        return False
    return True


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _config_findings(
    document: Any, base: str, members: dict[str, zipfile.ZipInfo], root: str, read: Any
) -> list[str]:
    """The payload config of ``data/weights/`` or ``data/constants/``: pickled entries must load
    weights-only; custom and opaque objects (pickles of any class) are always listed."""
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        return [f"{base} config (unreadable)"]
    found = []
    for fqn, meta in document.get("config", {}).items():
        if not isinstance(meta, dict):
            found.append(f"{base} config entry {fqn!r} (unreadable)")
            continue
        member = str(meta.get("path_name", ""))
        if member.startswith(("custom_obj_", "opaque_obj_")):
            found.append(f"{base}{member} (pickled object {fqn!r})")
        elif meta.get("use_pickle"):
            info = members.get(root + base + member)
            if info is None or not _loads_weights_only(read(info)):
                found.append(f"{base}{member} (pickled tensor {fqn!r})")
    return found


def loadable_bytes() -> tuple[int | None, str]:
    """The most bytes this process can still take and what sets it: the least of MemAvailable,
    the room under the cgroup limit (v2 or v1) and under ``ulimit -v``; ``(None, "")`` if none."""
    found: list[tuple[int, str]] = []
    available = available_memory_bytes(torch.device("cpu"))
    if available is not None:
        found.append((available, "available memory"))
    for limit, usage in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        cap, used = _read_int(f"/sys/fs/cgroup/{limit}"), _read_int(f"/sys/fs/cgroup/{usage}")
        if cap is not None and used is not None and cap < 1 << 60:
            found.append((max(cap - used, 0), "the cgroup's memory limit"))
            break
    room = _address_space_left()
    if room is not None:
        found.append((room, "ulimit -v"))
    return min(found) if found else (None, "")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):  # absent, or "max"
        return None


def _address_space_left() -> int | None:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    held = 0
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as f:
        held = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:")), 0)
    return max(int(soft) - held, 0)


def check_pt2_file(path: str | os.PathLike, where: str) -> None:
    """Refuse the ``.pt2`` file at ``path`` from its zip directory alone: not a zip, a zip bomb,
    or more than this process can hold while loading it (the file once plus every member)."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise ModelProfError(
            f"{where} is corrupt or not a torch.export archive (not a zip file: {e})"
        ) from e
    _check_sizes(infos, where)
    file_bytes = os.stat(path).st_size
    needed = file_bytes + sum(i.file_size for i in infos)
    room, source = loadable_bytes()
    if room is not None and needed > room:
        raise ModelProfError(
            f"{where} needs about {bytes_text(needed)} to load (the {bytes_text(file_bytes)} file, read "
            f"once, and its members inflated), more than the {bytes_text(room)} this process can "
            f"take ({source}); free memory or load it on a larger machine"
        )


def inspect_pt2(data: bytes, where: str, *, sizes_only: bool = False) -> list[str]:
    """What loading the ``.pt2`` archive ``data`` could run as code, in words (empty for a plain
    program); ``ModelProfError`` for a zip bomb or broken zip. ``sizes_only``: trusted file."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise ModelProfError(f"{where} is corrupt or not a torch.export archive: {e}") from e
    with archive:
        infos = archive.infolist()
        _check_sizes(infos, where)
        if sizes_only:
            return []
        members = {i.filename: i for i in infos if not i.is_dir()}
        names = list(members)
        root = names[0].split("/", 1)[0] + "/" if names and "/" in names[0] else ""
        if not all(n.startswith(root) for n in names):
            root = ""
        read = lambda info: _read(archive, info, where)  # noqa: E731
        found: list[str] = []
        for full, info in members.items():
            found.extend(_member_findings(full, full[len(root) :], info, members, root, read))
            if len(found) > 20:
                break
        return found


def _member_findings(
    full: str,
    rel: str,
    info: zipfile.ZipInfo,
    members: dict[str, zipfile.ZipInfo],
    root: str,
    read: Any,
) -> list[str]:
    """What one member would run: every member is recognised or refused."""
    for whole in (full, rel):  # the older layout has no root folder
        if whole in _PLAIN or whole.startswith(_PLAIN_DIRS):
            return []
        if whole == _OLD_PROGRAM or (whole.startswith("models/") and whole.endswith(".json")):
            document = _json(read(info))
            return (
                [f"{whole} (unreadable)"] if document is None else program_findings(document, whole)
            )
        if whole in _OLD_PICKLES:  # torch.load with a full-unpickling fallback
            return [] if _loads_weights_only(read(info)) else [f"{whole} (pickled objects)"]
    if rel.startswith("data/aotinductor/"):
        return [f"{rel} (compiled code)"]
    for base in ("data/weights/", "data/constants/"):
        if rel.startswith(base) and rel.endswith(".json"):
            return _config_findings(_json(read(info)), base, members, root, read)
        if rel.startswith(base) and "/" not in rel[len(base) :] and not rel.endswith(".pt"):
            return []  # a raw payload, or a pickle the config names (checked there)
    if rel.startswith("data/sample_inputs/") or rel.endswith((".pt", ".pkl", ".pickle")):
        return [] if _loads_weights_only(read(info)) else [f"{rel} (pickled objects)"]
    return [f"{rel} (a member modelprof does not know how torch loads)"]
