"""House rules that can be checked mechanically (ARCHITECTURE.md, "The layers").

* no production file over 600 lines, except declarative schema tables;
* no import cycles between modules (every import counts: module level, function level and
  ``TYPE_CHECKING``; a cycle hidden in a function is still a cycle);
* the layer order: a package imports only packages of its own layer or below, never upward;
* the pure cores (the codec, the metadata state machine, producer state, the coordinators' and
  the controller's decisions, the security core) import no trio and no I/O shell;
* importing a module has no side effects that register or patch anything: at module level only
  imports, definitions, constants, asserts on them and ``if TYPE_CHECKING`` blocks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("raftlog", "jepsen", "bench", "spark_connector")
LINES_MAX = 600
# Declarative tables (one schema per API and version range), not logic.
LONG_FILES_ALLOWED = {"raftlog/protocol/schemas.py"}

# Lowest first. A package may import its own layer's packages and any lower layer's.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"config", "clock", "log_budget", "gc_freezer", "protocol", "security", "metadata",
               "metrics"}),
    frozenset({"partition", "quorum", "client"}),
    frozenset({"server", "replication"}),
    frozenset({"controller", "group", "txn"}),
    frozenset({"broker"}),
    frozenset({"tools", "node", "cli", "__main__", "observe"}),
)
PURE_MODULES = (
    "raftlog/protocol/",
    "raftlog/metadata/",
    "raftlog/security/",
    "raftlog/metrics/",
    "raftlog/partition/replica_state.py",
    "raftlog/partition/producer_state.py",
    "raftlog/partition/append.py",
    "raftlog/partition/verified_ranges.py",
    "raftlog/partition/change_journal.py",
    "raftlog/controller/core.py",
    "raftlog/controller/elections.py",
    "raftlog/controller/config_changes.py",
    "raftlog/controller/decisions.py",
    "raftlog/group/coordinator.py",
    "raftlog/group/model.py",
    "raftlog/group/offsets.py",
    "raftlog/group/records.py",
    "raftlog/txn/coordinator.py",
    "raftlog/server/quota_core.py",
)
IMPURE_IMPORTS = ("trio", "socket", "threading", "asyncio", "subprocess")


def _python_files() -> Iterator[Path]:
    for directory in SOURCE_DIRS:
        yield from sorted((ROOT / directory).rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module this file imports, at any level, resolved to dotted names."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            # ``from package import module`` imports the module.
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in _python_files()}
    return {
        name: {imported for imported in _imports(path) if imported in files and imported != name}
        for name, path in files.items()
    }


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "raftlog" or len(parts) < 2:
        return None
    for index, packages in enumerate(LAYERS):
        if parts[1] in packages:
            return index
    raise AssertionError(f"{module}: its package is in no layer; add it to LAYERS")


def test_no_production_file_is_over_600_lines() -> None:
    too_long = {
        _relative(path): count
        for path in _python_files()
        if (count := len(path.read_text().splitlines())) > LINES_MAX
        and _relative(path) not in LONG_FILES_ALLOWED
    }
    assert not too_long, f"split these along their seams: {too_long}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(sorted(graph[start]))))
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycles() -> None:
    assert not _cycles(_graph())


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_package_imports_a_higher_layer() -> None:
    upward = []
    for module, imported in sorted(_graph().items()):
        layer = _layer_of(module)
        if layer is None:
            continue
        for target in sorted(imported):
            target_layer = _layer_of(target)
            if target_layer is not None and target_layer > layer:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


@pytest.mark.parametrize("place", PURE_MODULES)
def test_pure_cores_import_no_io_shell(place: str) -> None:
    paths = sorted((ROOT / place).rglob("*.py")) if place.endswith("/") else [ROOT / place]
    assert paths, place
    offending = {
        f"{_relative(path)} -> {name}"
        for path in paths
        for name in _imports(path)
        if name.split(".")[0] in IMPURE_IMPORTS
    }
    assert not offending, offending


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_main_guard(test: ast.expr) -> bool:
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and (
        test.left.id == "__name__")


def _side_effects(path: Path) -> list[str]:
    found = []
    for statement in ast.parse(path.read_text(), str(path)).body:
        allowed = isinstance(statement, (
            ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
            ast.Assert))  # an assert states an invariant of the constants above it
        if isinstance(statement, ast.Expr):
            allowed = isinstance(statement.value, ast.Constant)  # a docstring
        elif isinstance(statement, ast.Assign):
            allowed = all(isinstance(t, (ast.Name, ast.Tuple)) for t in statement.targets)
        elif isinstance(statement, ast.AnnAssign):
            allowed = isinstance(statement.target, ast.Name)
        elif isinstance(statement, ast.If):
            allowed = _is_type_checking(statement.test) or _is_main_guard(statement.test)
        elif isinstance(statement, ast.Try):
            allowed = all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in statement.body)
        if not allowed:
            found.append(f"{_relative(path)}:{statement.lineno}: {ast.unparse(statement)[:80]}")
    return found


def test_importing_a_module_registers_or_patches_nothing() -> None:
    found = [line for path in _python_files() if path.name != "__main__.py"
             for line in _side_effects(path)]
    assert not found, "module-level statements with side effects:\n" + "\n".join(found)
