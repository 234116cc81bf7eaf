"""Import layering of src/, written down once: no module imports a layer above its own, and
the imports form no cycle. shardmeter never imports heloco or torch; heloco may import
shardmeter.

The imports are read with `ast` (every `import` and `from ... import`, at module level or
inside a function; those under `if TYPE_CHECKING:` are left out, they never run). A module's
layer is the entry of the longest dotted prefix of its name in LAYERS. A new module with no
entry fails `test_every_module_has_a_layer`: add it to its package's map below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Layer order, lowest first (ARCHITECTURE.md, "Layers, written down once"). A module may
# import its own layer and the ones below.
SHARDMETER_LAYERS: tuple[tuple[str, ...], ...] = (
    # errors/io: one-line errors, atomic writes, the shared-folder path
    ("shardmeter.errors", "shardmeter.io", "shardmeter.paths", "shardmeter.version"),
    # specs: what the user describes
    ("shardmeter.specs",),
    # estimate: the analytical core
    ("shardmeter.estimate",),
    # predict, analysis, quality; calibrate and memcheck (predictions of published runs);
    # fit (the layouts that fit, by the memory model)
    (
        "shardmeter.predict",
        "shardmeter.analysis",
        "shardmeter.quality",
        "shardmeter.calibrate",
        "shardmeter.memcheck",
        "shardmeter.fit",
    ),
    # search: the planner
    ("shardmeter.search",),
    # report: tables, JSON, plots
    ("shardmeter.report",),
    # cli, its argparse kit, and the package's public face (`import shardmeter` re-exports)
    ("shardmeter.cli", "shardmeter.clikit", "shardmeter.__main__", "shardmeter"),
)

# heloco's map: edit it when modules move. Target names from ARCHITECTURE.md that do not
# exist yet (inner, run, exchange) are placed already.
HELOCO_LAYERS: tuple[tuple[str, ...], ...] = (
    # types/config: shared value types, the run file, small leaves
    (
        "heloco",
        "heloco.types",
        "heloco.config",
        "heloco.curve",
        "heloco.handoff",
        "heloco.executors",
        "heloco.runfolder",
    ),
    # model, data
    ("heloco.model", "heloco.modelspec", "heloco.hf", "heloco.data"),
    # inner, outer: the worker's loop (with its payload codecs) and the server's outer step
    (
        "heloco.inner",
        "heloco.worker",
        "heloco.rounds",
        "heloco.overlap",
        "heloco.streaming",
        "heloco.worker_state",
        "heloco.codecs",
        "heloco.outer",
    ),
    # server, run: the state machine, the run controller, the library's loops over them, and
    # the events a run writes (metrics: both clocks record through it, reports read it)
    ("heloco.server", "heloco.run", "heloco.island", "heloco.outer_loop", "heloco.metrics"),
    # exchange: how a worker talks to the server each round
    ("heloco.exchange",),
    # sim, net: the two clocks
    ("heloco.sim", "heloco.net"),
    # report and what builds on results: experiments, export, plan-to-train
    (
        "heloco.report",
        "heloco.report_html",
        "heloco.timeline",
        "heloco.tensorboard",
        "heloco.experiments",
        "heloco.export",
        "heloco.plan_to_train",
        "heloco.topology",
    ),
    # cli
    ("heloco.cli", "heloco.__main__"),
)

# Imports that break the order today, each with the reason it stands. Remove an entry when
# the import goes; the test fails on an entry that no longer matches any import.
EXCEPTIONS: dict[tuple[str, str], str] = {}
# Cycles that stand today (each broken at run time by an import inside a function).
CYCLE_EXCEPTIONS: dict[frozenset[str], str] = {}
FORBIDDEN = {"shardmeter": ("heloco", "torch")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES: dict[str, Path] = {
    module_name(p): p for pkg in ("shardmeter", "heloco") for p in (SRC / pkg).rglob("*.py")
}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str) -> set[str]:
    """Every module `name` imports (absolute names; relative imports resolved)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in MODULES else base)
    found.discard(name)
    return found


def layer_of(name: str) -> tuple[str, int] | None:
    """(package, layer index) of a module by its longest mapped prefix, None if unmapped."""
    best: tuple[int, str, int] | None = None
    for package, layers in (("shardmeter", SHARDMETER_LAYERS), ("heloco", HELOCO_LAYERS)):
        for index, prefixes in enumerate(layers):
            for prefix in prefixes:
                # a bare package name ("heloco") maps its __init__ only, never a submodule
                inside = "." in prefix and name.startswith(prefix + ".")
                if (name == prefix or inside) and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), package, index)
    return None if best is None else (best[1], best[2])


GRAPH: dict[str, set[str]] = {name: imports_of(name) for name in MODULES}


def test_every_module_has_a_layer() -> None:
    missing = sorted(n for n in MODULES if layer_of(n) is None)
    assert not missing, f"place these modules in tests/test_layers.py's maps: {missing}"


def upward_imports(graph: dict[str, set[str]]) -> tuple[list[str], set[tuple[str, str]]]:
    """Imports of a higher layer of the same package not in EXCEPTIONS, and the exceptions
    that some import used."""
    above = []
    used: set[tuple[str, str]] = set()
    for name, deps in graph.items():
        here = layer_of(name)
        assert here is not None, name
        for dep in deps:
            there = layer_of(dep) if dep in MODULES else None
            if there is None or there[0] != here[0] or there[1] <= here[1]:
                continue
            key = next((k for k in EXCEPTIONS if name == k[0] and _under(dep, k[1])), None)
            if key is not None:
                used.add(key)
                continue
            above.append(f"{name} (layer {here[1]}) imports {dep} (layer {there[1]})")
    return sorted(above), used


def test_no_module_imports_a_layer_above_its_own() -> None:
    above, used = upward_imports(GRAPH)
    assert not above, "\n".join(above)
    stale = sorted(set(EXCEPTIONS) - used)
    assert not stale, f"exceptions that no import needs any more (remove them): {stale}"


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_forbidden_imports(package: str) -> None:
    bad = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        if _under(name, package)
        for dep in deps
        if any(_under(dep, f) for f in FORBIDDEN[package])
    )
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over the imports inside src/."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(d for d in GRAPH[v] if d in MODULES):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    new = [c for c in cycles if frozenset(c) not in CYCLE_EXCEPTIONS]
    assert not new, "import cycles: " + "; ".join(" <-> ".join(c) for c in new)
    stale = set(CYCLE_EXCEPTIONS) - {frozenset(c) for c in cycles}
    assert not stale, (
        f"cycle exceptions no longer needed (remove them): {sorted(map(sorted, stale))}"
    )


def test_the_walker_sees_a_violation() -> None:
    """The checks can fail: a made-up upward import is flagged, a TYPE_CHECKING one is not
    read, and an unmapped module has no layer."""
    fake = {**GRAPH, "shardmeter.specs.plan": {"shardmeter.search.topology"}}
    above, _ = upward_imports(fake)
    assert above == ["shardmeter.specs.plan (layer 1) imports shardmeter.search.topology (layer 4)"]
    assert "shardmeter.specs.rules" in GRAPH["shardmeter.specs.plan"]
    assert "shardmeter.specs.plan" not in GRAPH["shardmeter.specs.rules"]  # TYPE_CHECKING only
    assert layer_of("shardmeter.new_module") is None and layer_of("heloco.new_module") is None
