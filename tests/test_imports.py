"""The package's imports form layers: no cycle, no import of a higher layer, no private name
reached across modules. Read with ``ast`` (nothing is imported), so a cycle hidden behind a lazy
import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "modelprof"

# lowest first; a module may import its own layer and any lower one, never a higher one
LAYERS = [
    {"modelprof.errors", "modelprof.columns"},
    {"modelprof.runtime"},
    {"modelprof.counting"},
    # the exporters read frames alone: below timing, whose results (a throughput curve) export
    {"modelprof.render"},
    {"modelprof.timing"},
    {"modelprof.step", "modelprof.distributed"},
    {"modelprof.report"},
    # generation builds a Report per phase (as profile does) and loads models for its CLI
    {
        "modelprof.models",
        "modelprof.profile",
        "modelprof.compare",
        "modelprof.sweep",
        "modelprof.generation",
        "modelprof.profile_sharded",
        "modelprof.fit",
    },
    {"modelprof", "modelprof.cli", "modelprof.__main__"},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module, imported names, line) of every modelprof import in the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "modelprof" or module.startswith("modelprof."):
                found.append((module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("modelprof"):
                    found.append((alias.name, [], node.lineno))
    return found


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(module: str, names: list[str], known: dict[str, Path]) -> list[str]:
    """The modules an import statement loads: ``from pkg import submodule`` loads the submodule."""
    targets = [module] if module in known else []
    targets += [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
    return targets


def _layer(module: str) -> int:
    best, depth = None, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = i, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def _with_packages(target: str, importer: str, known: dict[str, Path]) -> set[str]:
    """``target`` and the package ``__init__`` files importing it runs first (``a.b`` for
    ``a.b.c``), less the importer's own packages, which are already running when it imports."""
    parts = target.split(".")
    out = {target}
    for i in range(1, len(parts)):
        package = ".".join(parts[:i])
        if package in known and not (importer == package or importer.startswith(package + ".")):
            out.add(package)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = set()
        for module, names, _ in _imports(path):
            for target in _resolve(module, names, known):
                edges.update(_with_packages(target, name, known))
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_cycle():
    graph = _graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_imports_a_higher_layer():
    known = _modules()
    wrong = []
    for name, path in known.items():
        for module, names, line in _imports(path):
            for target in _resolve(module, names, known):
                if target != name and _layer(target) > _layer(name):
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name} -> {target}")
    assert not wrong, "imports of a higher layer:\n" + "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module():
    known = _modules()
    wrong = []
    for name, path in known.items():
        for module, names, line in _imports(path):
            for n in names:
                if n.startswith("_") and not n.startswith("__") and f"{module}.{n}" not in known:
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} {n} from {module}")
    assert not wrong, "private names imported across modules:\n" + "\n".join(wrong)


@pytest.mark.parametrize("layer", [0, 1])
def test_the_lowest_layers_import_nothing_above_them(layer):
    # errors imports nothing of modelprof's; runtime nothing but errors and runtime
    graph = _graph()
    for name, edges in graph.items():
        if _layer(name) == layer:
            assert all(_layer(t) <= layer for t in edges), (name, edges)


def test_the_documented_layers_are_the_enforced_ones():
    # docs/development.md's diagram: one layer per unindented "names: what" entry (its names
    # may go on over unindented lines ending in a comma), lowest first
    text = (PACKAGE.parent / "docs" / "development.md").read_text()
    block = text.split("The package is in layers", 1)[1].split("```\n", 2)[1]
    layers, names = [], ""
    for line in block.splitlines():
        if line and not line.startswith(" "):
            names += line.split(":", 1)[0] + " "
            if ":" in line:
                layers.append(
                    {
                        "modelprof" if n == "__init__" else f"modelprof.{n}"
                        for n in names.replace(",", " ").split()
                    }
                )
                names = ""
    assert layers == LAYERS
