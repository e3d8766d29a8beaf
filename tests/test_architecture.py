"""The shape of the package, read with `ast`: the import graph has no cycle and points down the
layers of DESIGN.md only; the top level stays small; nothing outside paging/ reaches into a
block manager's tables or pools; the functions on a request's path stay short."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "minipaged"

# Lowest first: a part may import the parts of lower layers (and its own folder), nothing else.
LAYERS = [
    {"backend", "sampling", "outputs"},
    {"attention", "model", "paging", "sequence", "beam"},
    {"policies"},  # the seams' policies: they see requests and the block manager, nothing above
    {"scheduler", "runner", "viz"},
    {"speculative"},  # proposers: the n-gram lookup, and draft layers run through the runner
    {"config"},  # EngineConfig: every option, each seam's policy named
    {"engine"},
    {"llm"},
    {"chat", "serve", "bench", "lab", "minipaged"},  # the doors (and __init__)
    {"simulate"},  # `python -m minipaged.simulate`, the alias of minipaged.bench.simulate
]
REQUEST_PATH = ["llm", "engine", "scheduler", "runner", "sequence", "beam", "sampling", "outputs", "policies"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def imports() -> dict[str, set[str]]:
    """module -> the minipaged modules it imports (a submodule when `from pkg import sub`)."""
    graph = defaultdict(set)
    for name, tree in TREES.items():
        package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
                source = ".".join(p for p in (base, node.module) if p)
                if not source.startswith("minipaged"):
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    graph[name].add(sub if sub in MODULES else source)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name.startswith("minipaged")}
    return graph


def part(module: str) -> str:
    """The top-level part a module belongs to: 'paging' for minipaged.paging.manager."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "minipaged"


def layer(module: str) -> int:
    return next(i for i, parts in enumerate(LAYERS) if part(module) in parts)


def test_every_part_has_a_layer():
    assert not {part(m) for m in MODULES} - set().union(*LAYERS)


def test_imports_point_down_the_layers_only():
    upward = [f"{m} imports {t}" for m, targets in imports().items() for t in targets
              if part(m) != part(t) and layer(t) >= layer(m)]
    assert not upward, "imports from a lower layer to a higher one (or across one layer):\n" + "\n".join(upward)


def test_the_import_graph_has_no_cycle():
    graph, state, path = imports(), {}, []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in MODULES:
        if module not in state:
            visit(module)


def test_the_simulator_and_the_pictures_never_touch_the_model():
    graph = imports()
    for module in ("minipaged.bench.simulate", "minipaged.bench.workload", *[m for m in MODULES if part(m) == "viz"]):
        model_side = {t for t in graph[module] if part(t) in {"model", "runner", "engine", "llm", "attention"}}
        assert not model_side, f"{module} imports {model_side}"


def test_the_top_level_holds_at_most_twelve_modules_and_each_folder_one_part():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 12, top
    folders = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert set(folders) <= set().union(*LAYERS), folders
    assert all((ROOT / f / "__init__.py").exists() for f in folders)


def block_manager_reaches(tree: ast.AST) -> list[str]:
    """`x.tables`, `x.host`, `x.allocator`, `x.device` where x is a block manager (named
    blocks / manager, or ending in .blocks): paging's internals."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in {"tables", "device", "host", "allocator"}:
            owner = ast.unparse(node.value)
            if owner.split(".")[-1] in {"blocks", "manager", "block_manager"}:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_outside_paging_reads_a_block_managers_tables_or_pools():
    reaches = {m: r for m, tree in TREES.items() if part(m) != "paging" for r in [block_manager_reaches(tree)] if r}
    assert not reaches, f"use the block manager's views (frame_states, table_view, ...): {reaches}"


def test_the_reach_detector_sees_a_reach():
    assert block_manager_reaches(ast.parse("n = len(llm.engine.blocks.tables)"))
    assert not block_manager_reaches(ast.parse("d = llm.device"))


def test_every_module_opens_with_a_docstring_of_at_most_five_lines():
    lengths = {m: len((ast.get_docstring(t, clean=False) or "").strip("\n").splitlines()) for m, t in TREES.items()}
    bad = {m: n for m, n in lengths.items() if not 1 <= n <= 5}
    assert not bad, f"a module docstring says its idea in 2-5 lines (STYLE.md); these have: {bad}"


def test_no_function_on_the_request_path_is_over_forty_lines():
    long = [f"{m}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for m, tree in TREES.items() if part(m) in REQUEST_PATH
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 40]
    assert not long, long
