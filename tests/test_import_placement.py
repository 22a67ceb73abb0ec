"""Imports sit at the top of their module, where a reader looks for them. An import inside a
function needs a reason, and the reasons are few: the dependency is optional (an extra of
pyproject.toml), the name exists only in some releases
(the import is in a ``try`` that catches its absence), or the module is one of the files below
whose reason is stated. Read with ``ast``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "modelprof"
# The core dependencies and the package itself: importable wherever modelprof is
CORE = {"modelprof", "torch", "numpy", "pandas"}
# Standard modules some platforms or Pythons lack
PLATFORM = {"fcntl": "POSIX only", "tomllib": "Python 3.11 on"}
# Files whose function-level imports have a stated reason
LAZY_FILES = {
    # each subcommand imports what it runs when it runs: `modelprof --help` and a mistyped
    # option answer without loading the counting and timing machinery
    "cli.py",
    # each entry looks up its release's names when asked: a private module one torch release
    # lacks must not fail `import modelprof` on that release
    "runtime/compat.py",
}


def _is_import(node: ast.AST) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)


def _target(node: ast.AST) -> str:
    return node.module if isinstance(node, ast.ImportFrom) else node.names[0].name


def _everywhere(module: str) -> bool:
    """Whether ``module`` imports wherever modelprof does (so its import belongs at the top),
    unlike an optional dependency or a platform's own module."""
    top = module.split(".")[0]
    return top in CORE or (top in sys.stdlib_module_names and top not in PLATFORM)


def _guarded(tree: ast.AST) -> set[int]:
    """Lines of imports inside a ``try`` body."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for stmt in node.body:
                lines.update(n.lineno for n in ast.walk(stmt) if _is_import(n))
    return lines


def _lazy_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    guarded = _guarded(tree)
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in guarded:
                continue
            module = _target(node) or ""
            if getattr(node, "level", 0):  # relative: inside the package
                module = "modelprof." + module
            if not _everywhere(module):
                continue
            found.append((node.lineno, module))
    return sorted(set(found))


def test_the_rules_see_what_they_should():
    assert not _everywhere("matplotlib.pyplot")  # an extra
    assert _everywhere("torch.distributed") and _everywhere("inspect")
    assert not _everywhere("tomllib")  # Python 3.11 on


def test_imports_inside_functions_have_a_reason():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in LAZY_FILES:
            continue
        wrong += [f"modelprof/{rel}:{line} {module}" for line, module in _lazy_imports(path)]
    assert not wrong, "imports inside functions with no stated reason:\n" + "\n".join(wrong)
