"""Measures of kafka-eos's structure, read from the source (``python tests/structure.py``, or
``make structure``): the import graph's cycles, imports from a lower layer to a higher one, the
share of imports hidden inside functions, and the places that switch on a sink's kind or commit
scope. docs/architecture.md quotes them; tests/unit/test_structure.py holds them to their limits.

Layers, low to high (a module may import its own layer and those below): :data:`LAYERS`. The
provider (``kafka_eos_airflow``) and the Spark entry points (``spark_apps``) sit above the library;
the lab (``kafka_eos_lab``: benchmarks, fault matrix, soak) above everything it measures.
"""

from __future__ import annotations

import ast
import gc
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where each import package's source lives.
PACKAGES = {"kafka_eos": ROOT / "include" / "kafka_eos", "kafka_eos_lab": ROOT / "include" / "kafka_eos_lab",
            "kafka_eos_airflow": ROOT / "plugins" / "kafka_eos_airflow", "spark_apps": ROOT / "spark_apps"}

#: The library's layers, low to high: a module's layer is the first whose prefix names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("kafka_eos.errors", "kafka_eos.paths", "kafka_eos.settings", "kafka_eos.logs",
              "kafka_eos.wire", "kafka_eos.transforms", "kafka_eos.oauth", "kafka_eos.probes", "kafka_eos_lab.faults")),
    ("core", ("kafka_eos.console", "kafka_eos.spec", "kafka_eos.plan", "kafka_eos.kafka_admin", "kafka_eos.manifest", "kafka_eos.txn",
              "kafka_eos.readers", "kafka_eos.audit", "kafka_eos.topics", "kafka_eos.lease", "kafka_eos.acls",
              "kafka_eos.spark_io", "kafka_eos.formats", "kafka_eos.sample_data")),
    ("sinks", ("kafka_eos.sinks",)),
    ("run", ("kafka_eos.batch", "kafka_eos.pipeline")),
    ("capabilities", ("kafka_eos.stream", "kafka_eos.backfill", "kafka_eos.health", "kafka_eos.overview",
                      "kafka_eos.run_audit", "kafka_eos.validate", "kafka_eos.scaffold", "kafka_eos.local",
                      "kafka_eos.demo", "kafka_eos.demo_avro")),
    ("entry", ("kafka_eos.cli", "kafka_eos.__main__")),
    ("provider", ("kafka_eos_airflow", "spark_apps")),
    ("lab", ("kafka_eos_lab", "kafka_eos_lab.bench", "kafka_eos_lab.chaos", "kafka_eos_lab.soak")),
]

#: A comparison of a sink's kind or commit scope with a value: a place that chooses by scope.
SWITCH = re.compile(r"""(sink\.(kind|commit)\s*(==|!=|\bin\b))|\b(kind|commit)\s*(==|!=)\s*["'](kafka|sql|atomic|per_partition)["']""")


@dataclass
class Module:
    name: str
    path: Path
    top: set[str] = field(default_factory=set)  # internal modules imported at the top
    inner: set[str] = field(default_factory=set)  # internal modules imported inside a function
    switches: list[int] = field(default_factory=list)  # line numbers


def modules() -> dict[str, Module]:
    """Every module of the four packages, with its internal imports."""
    found: dict[str, Module] = {}
    for package, folder in PACKAGES.items():
        if not folder.exists():
            continue
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [package, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = Module(".".join(parts), path)
    for m in found.values():
        text = m.path.read_text()
        tree = parse(text, str(m.path))
        _collect(tree, m, found, inside=False)
        m.switches = [i for i, line in enumerate(text.splitlines(), 1) if SWITCH.search(line)]
    return found


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` with the garbage collector paused: on Python 3.11 a collection inside the parse
    that runs a finalizer (py4j's, in a test process with a Spark session) can fail the parse with
    "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905; seen in make test)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text, filename)
    finally:
        if enabled:
            gc.enable()


def _collect(node: ast.AST, m: Module, known: dict[str, Module], inside: bool) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _collect(child, m, known, True)
            continue
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            continue  # annotations only
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            for target in _targets(child, m, known):
                if target != m.name:
                    (m.inner if inside else m.top).add(target)
            continue
        _collect(child, m, known, inside)


def _is_type_checking(test: ast.AST) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _targets(node: ast.Import | ast.ImportFrom, m: Module, known: dict[str, Module]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = m.name.split(".")
            if not m.path.name == "__init__.py":
                pkg = pkg[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        # "from x import y": the module x.y where y is one, else x itself
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return sorted(out)


def layer_of(name: str) -> int:
    if name == "kafka_eos":  # the package itself: its version
        return 0
    for i, (_layer, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    raise KeyError(f"{name}: in no layer of tests/structure.py's LAYERS")


def cycles(found: dict[str, Module]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (every import,
    at the top or inside a function: a cycle through a function's import is still a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(found[v].top | found[v].inner):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(found):
        if v not in index:
            visit(v)
    return out


def upward(found: dict[str, Module]) -> list[tuple[str, str]]:
    """Imports from a lower layer to a higher one."""
    return sorted((m.name, t) for m in found.values() for t in m.top | m.inner if layer_of(t) > layer_of(m.name))


def inner_share(found: dict[str, Module], package: str) -> tuple[int, int]:
    """(imports inside functions, all internal imports) of ``package``'s modules."""
    ms = [m for m in found.values() if m.name == package or m.name.startswith(package + ".")]
    inner = sum(len(m.inner - m.top) for m in ms)
    return inner, inner + sum(len(m.top) for m in ms)


def switches(found: dict[str, Module]) -> list[str]:
    """The places outside the lab that compare a sink's kind or commit scope."""
    return [f"{m.path.relative_to(ROOT)}:{line}" for m in found.values() if layer_of(m.name) < layer_of("kafka_eos_lab")
            for line in m.switches]


def main() -> int:
    found = modules()
    cyc, up, sw = cycles(found), upward(found), switches(found)
    print(f"modules: {len(found)}")
    print(f"import cycles: {len(cyc)}")
    for c in cyc:
        print("  " + " -> ".join(c))
    print(f"imports from a lower layer to a higher one: {len(up)}")
    for a, b in up:
        print(f"  {a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})")
    for package in ("kafka_eos", "kafka_eos_airflow"):
        inner, total = inner_share(found, package)
        print(f"imports inside functions, {package}: {inner} of {total} ({inner / max(total, 1):.0%})")
    print(f"switches on a sink's kind or commit scope: {len(sw)}")
    for s in sw:
        print(f"  {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
