"""The house's arrows: llamay's import graph, read from the source with `ast` (module-level
and function-local imports alike), has no cycle, and every import between rooms follows
the room table of the design card (`docs/architecture.md`), so that no room reaches up.

A module's imports count from every place they run: the module body, functions, methods,
and `importlib.import_module("...")` / `__import__("...")` with a literal name.
An import under `if TYPE_CHECKING:` does not (it never runs; it names a type). Importing
`a.b.c` runs `a/__init__` and `a/b/__init__` first, so it is an edge to each of those
packages too (except the importer's own, already running). `import llamay` and
`from llamay import load` reach `llamay.api` (the root face loads it on first use).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"llamay": REPO / "llamay", "llamay_cli": REPO / "cli"}

#: Rooms by module prefix (the longest prefix wins).
ROOM_OF = {
    "llamay.errors": "base",
    "llamay.files": "base",
    "llamay.runtime": "base",
    "llamay.gguf": "gguf",
    "llamay.quant": "quant",
    "llamay.kernels": "kernels",
    "llamay.kernels_pallas": "kernels",
    "llamay.kernels_cpu": "kernels",
    "llamay.arch": "arch",
    "llamay.model": "model",
    "llamay.tok": "tok",
    "llamay.kv": "kv",
    "llamay.sample": "sample",
    "llamay.constrain": "constrain",
    "llamay.engine": "engine",
    "llamay.store": "store",
    "llamay.ollama": "ollama",
    "llamay.library": "library",
    "llamay.eval": "eval",
    "llamay.api": "api",
    "llamay.multimodal": "api",
    "llamay.bench": "api",
    "llamay": "api",  # the root face: `load` and `Model`, loaded lazily from llamay.api
    "llamay.eval.lm_eval_adapter": "lm-eval plugin",
    "llamay.eval.lm_eval_hook": "lm-eval plugin",
    "llamay.serve": "serve",
    "llamay.ocr": "ocr",
    "llamay.vision": "vision",
    "llamay_cli": "cli",
}

#: What each room may import directly; what those may import it may import too. The
#: design card's table, with what it leaves implicit spelled out: `base` (errors, durable
#: files, the JAX settings) is everyone's; quant reads GGML's type ids from gguf; model's
#: step functions take the KV state; the lm-eval plugin and library sit above `llamay.load`.
MAY_IMPORT = {
    "base": set(),
    "gguf": set(),
    "quant": {"gguf"},
    "kernels": {"quant"},
    "arch": {"quant", "kernels"},
    "model": {"gguf", "arch", "quant", "kv"},
    "tok": {"gguf"},
    "kv": set(),
    "sample": {"tok", "kernels"},  # the vocabulary reductions (argmax, log-sum-exp)
    "constrain": {"sample", "tok"},
    "engine": {"model", "kv", "sample", "constrain", "tok"},
    "store": {"gguf"},
    "ollama": {"store"},  # Ollama's manifests are llamay.store.manifest's format
    "eval": {"model", "kv", "sample"},
    "vision": {"gguf", "quant", "arch"},  # mmproj files, image preprocessing, the vision tower
    "api": {"engine", "eval", "store", "ollama", "vision"},
    "library": {"store", "ollama", "api"},
    "lm-eval plugin": {"api", "eval"},
    "serve": {"engine", "tok", "store", "library", "api"},
    "ocr": {"constrain", "arch", "gguf", "store"},
    "cli": {"serve", "library", "ocr", "lm-eval plugin"},
}

#: Rooms that must not load JAX when imported (function-local imports may, with a reason).
LIGHT = {"gguf", "tok", "store", "ollama", "library"}
HEAVY = ("jax", "jaxlib")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (or package)
    line: int
    local: bool  # inside a function: runs when called, not when the module is imported


def _modules() -> dict[str, Path]:
    out = {}
    for name, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((name, *parts))] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _named(base: str, name: str) -> str:
    """What `from base import name` imports: the submodule if there is one, else `base`."""
    full = f"{base}.{name}"
    if full in MODULES:
        return full
    if base == "llamay":
        return "llamay.api" if name in ("load", "Model") else "llamay"
    return base


def _dynamic_import(node: ast.AST) -> str | None:
    """The module of `importlib.import_module("m")` / `__import__("m")`, so none hides an
    arrow (counted as function-local: it runs when reached)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f, arg = node.func, node.args[0]
    named = (isinstance(f, ast.Name) and f.id in ("__import__", "import_module")) or (
        isinstance(f, ast.Attribute) and f.attr == "import_module"
    )
    if named and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def _raw_imports(module: str, path: Path) -> Iterator[tuple[str, int, bool]]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, local: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    yield from visit(stmt, local)
                continue
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for a in child.names:
                    yield ("llamay.api" if a.name == "llamay" else a.name), child.lineno, inner
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*up, base] if base else up)
                for a in child.names:
                    yield _named(base, a.name), child.lineno, inner
            else:
                dynamic = _dynamic_import(child)
                if dynamic is not None:
                    yield dynamic, child.lineno, True
                yield from visit(child, inner)

    yield from visit(ast.parse(path.read_text(encoding="utf-8")), False)


@cache
def imports() -> tuple[Import, ...]:
    """Every import of one of our modules, with the packages it runs first."""
    out = []
    for module, path in MODULES.items():
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        for target, line, local in _raw_imports(module, path):
            if target.split(".")[0] not in PACKAGES:
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                step = ".".join(parts[:i])
                if step in MODULES and step != module and (step not in own or step == target):
                    out.append(Import(module, step, line, local))
    return tuple(out)


def room(module: str) -> str:
    best = max((p for p in ROOM_OF if module == p or module.startswith(p + ".")), key=len)
    return ROOM_OF[best]


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for r in MAY_IMPORT[todo.pop()]:
            if r not in seen:
                seen.add(r)
                todo.append(r)
    return seen


def test_every_module_has_a_room():
    assert {room(m) for m in MODULES} <= set(MAY_IMPORT)


def test_the_room_table_itself_has_no_cycle():
    for r in MAY_IMPORT:
        assert r not in _reachable(r), f"the room table lets {r} reach itself"


def test_no_import_cycle():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in imports():
        graph[imp.source].add(imp.target)
    cycles = _cycles(graph)
    assert not cycles, "import cycles (counting function-local imports):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_no_arrow_up_the_room_table():
    allowed = {r: _reachable(r) | {"base", r} for r in MAY_IMPORT}
    bad = sorted(
        {
            f"{i.source}:{i.line} ({room(i.source)}) imports {i.target} ({room(i.target)})"
            for i in imports()
            if room(i.target) not in allowed[room(i.source)]
        }
    )
    assert not bad, "imports up the room table:\n" + "\n".join(bad)


def test_base_modules_import_only_errors():
    for i in imports():
        if room(i.source) == "base":
            assert i.target == "llamay.errors", f"{i.source}:{i.line} imports {i.target}"


def test_light_rooms_do_not_load_jax_on_import():
    """Following module-level imports only (a function-local import is how a light room
    defers JAX until it is needed), no light room reaches a module that imports JAX."""
    eager: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in imports():
        if not i.local:
            eager[i.source].add(i.target)
    heavy = {
        m
        for m, path in MODULES.items()
        if any(t.split(".")[0] in HEAVY and not local for t, _, local in _raw_imports(m, path))
    }
    for m in MODULES:
        if room(m) not in LIGHT:
            continue
        assert m not in heavy, f"{m} imports JAX at module level"
        seen, todo = {m}, [m]
        while todo:
            for t in eager[todo.pop()] - seen:
                assert t not in heavy, f"importing {m} loads JAX (through {t})"
                seen.add(t)
                todo.append(t)


def test_the_checker_sees_function_local_imports_and_cycles():
    """The oracle itself: a known function-local import is found, and a planted cycle is."""
    found = {(i.source, i.target, i.local) for i in imports()}
    assert ("llamay.library", "llamay.api", True) in found  # `import llamay` inside load()
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
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
                out.append(_one_cycle(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first node, for the message."""
    start = min(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError("not a cycle")
