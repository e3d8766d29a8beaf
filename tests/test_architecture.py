"""The shape of the package, read with `ast`: the import graph has no cycle and points
down the layers of DESIGN.md only; the top level stays small; nothing outside paging/
reaches into a
block manager's tables or pools; the functions on a request's path stay short."""

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "minipaged"

# Lowest first: a part may import the parts of lower layers (and its own folder),
# nothing else. The engine a student reads is the first nine layers; the machinery
# around it lives in minipaged/tools/ (a part each: "tools.serve", ...), and the doors
# `python -m minipaged.NAME` enters by (minipaged/chat.py, serve.py, bench.py, lab.py,
# simulate.py) sit on top.
LAYERS = [
    {"backend", "sampling", "outputs"},
    {"attention", "model", "paging", "sequence", "beam"},
    {
        "policies",
        "structured",
    },  # the seams' policies (structured output's automata too)
    {"scheduler", "runner"},
    {
        "speculative"
    },  # proposers: the n-gram lookup, and draft layers run through the runner
    {"config"},  # EngineConfig: every option, each seam's policy named
    {"engine"},
    {"llm"},  # the front door: LLM
    {"minipaged"},  # __init__: `from minipaged import LLM, SamplingParams`
    {"tools", "tools.viz"},  # pictures of paging, charts, the batch timeline
    {
        "tools.chat",
        "tools.serve",
        "tools.bench",
    },  # the chat, the server, the benchmarks
    {"tools.lab"},  # the labs: graded pieces, replayed on the benchmarks' traces
    {"tools.simulate"},  # `python -m minipaged.simulate`'s command line
    {"doors"},  # what `python -m minipaged.NAME` runs: a door into tools/
]
ENGINE_LAYERS = 9
DOORS = ["chat", "serve", "bench", "lab", "simulate"]
REQUEST_PATH = [
    "llm",
    "engine",
    "scheduler",
    "runner",
    "sequence",
    "beam",
    "sampling",
    "outputs",
    "policies",
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def imports() -> dict[str, set[str]]:
    """module -> the minipaged modules it imports (a submodule when `from pkg import
    sub`)."""
    graph = defaultdict(set)
    for name, tree in TREES.items():
        package = (
            name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
        )
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = (
                    ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1]
                    )
                    if node.level
                    else ""
                )
                source = ".".join(p for p in (base, node.module) if p)
                if not source.startswith("minipaged"):
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    graph[name].add(sub if sub in MODULES else source)
            elif isinstance(node, ast.Import):
                graph[name] |= {
                    a.name for a in node.names if a.name.startswith("minipaged")
                }
    return graph


def part(module: str) -> str:
    """The part a module belongs to: 'paging' for minipaged.paging.manager,
    'tools.serve' for
    minipaged.tools.serve.api, 'doors' for minipaged.serve (the door of `python -m`)."""
    pieces = module.split(".")
    if len(pieces) == 1:
        return "minipaged"
    if pieces[1] == "tools" and len(pieces) > 2:
        return "tools." + pieces[2]
    if len(pieces) == 2 and pieces[1] in DOORS:
        return "doors"
    return pieces[1]


def layer(module: str) -> int:
    return next(i for i, parts in enumerate(LAYERS) if part(module) in parts)


def test_every_part_has_a_layer():
    assert not {part(m) for m in MODULES} - set().union(*LAYERS)


def test_imports_point_down_the_layers_only():
    upward = [
        f"{m} imports {t}"
        for m, targets in imports().items()
        for t in targets
        if part(m) != part(t) and layer(t) >= layer(m)
    ]
    assert not upward, (
        "imports from a lower layer to a higher one (or across one layer):\n"
        + "\n".join(upward)
    )


def test_the_import_graph_has_no_cycle():
    graph, state, path = imports(), {}, []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                raise AssertionError(
                    "import cycle: "
                    + " -> ".join(path[path.index(target) :] + [target])
                )
            if target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in MODULES:
        if module not in state:
            visit(module)


def test_the_simulator_and_the_pictures_never_touch_the_model():
    graph = imports()
    for module in (
        "minipaged.tools.bench.simulate",
        "minipaged.tools.bench.workload",
        *[m for m in MODULES if part(m) == "tools.viz"],
    ):
        model_side = {
            t
            for t in graph[module]
            if part(t) in {"model", "runner", "engine", "llm", "attention"}
        }
        assert not model_side, f"{module} imports {model_side}"


def test_the_engine_and_the_machinery_are_apart_at_a_glance():
    """minipaged/ holds the engine (at most twelve modules and its folders),
    minipaged/tools/ the machinery around it, and a door of a few lines for each `python
    -m minipaged.NAME`.
    """
    top = sorted(p.stem for p in ROOT.glob("*.py"))
    engine = [name for name in top if name not in DOORS]
    assert len(engine) <= 12, engine
    folders = sorted(
        p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"
    )
    assert set(folders) <= set().union(*LAYERS[:ENGINE_LAYERS]) | {"tools"}, folders
    assert all((ROOT / f / "__init__.py").exists() for f in folders)
    tools = sorted(
        p.name for p in (ROOT / "tools").iterdir() if p.name != "__pycache__"
    )
    assert {f"tools.{Path(t).stem}" for t in tools} - {"tools.__init__"} <= set().union(
        *LAYERS
    )
    for door in DOORS:
        lines = MODULES[f"minipaged.{door}"].read_text().splitlines()
        assert len(lines) <= 10, f"minipaged/{door}.py is a door: {len(lines)} lines"
        assert all(
            t.startswith("minipaged.tools.") for t in imports()[f"minipaged.{door}"]
        )


def test_nothing_of_the_engine_imports_the_machinery():
    graph = imports()
    engine = [m for m in MODULES if layer(m) < ENGINE_LAYERS]
    reaches = {
        m: sorted(t for t in graph[m] if part(t).startswith("tools")) for m in engine
    }
    assert not {m: t for m, t in reaches.items() if t}, reaches


def block_manager_reaches(tree: ast.AST) -> list[str]:
    """`x.tables`, `x.host`, `x.allocator`, `x.device` where x is a block manager (named
    blocks / manager, or ending in .blocks): paging's internals."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in {
            "tables",
            "device",
            "host",
            "allocator",
        }:
            owner = ast.unparse(node.value)
            if owner.split(".")[-1] in {"blocks", "manager", "block_manager"}:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_outside_paging_reads_a_block_managers_tables_or_pools():
    reaches = {
        m: r
        for m, tree in TREES.items()
        if part(m) != "paging"
        for r in [block_manager_reaches(tree)]
        if r
    }
    assert not reaches, (
        f"use the block manager's views (frame_states, table_view, ...): {reaches}"
    )


def test_the_reach_detector_sees_a_reach():
    assert block_manager_reaches(ast.parse("n = len(llm.engine.blocks.tables)"))
    assert not block_manager_reaches(ast.parse("d = llm.device"))


def test_every_module_opens_with_a_docstring_of_at_most_five_lines():
    lengths = {
        m: len((ast.get_docstring(t, clean=False) or "").strip("\n").splitlines())
        for m, t in TREES.items()
    }
    bad = {m: n for m, n in lengths.items() if not 1 <= n <= 5}
    assert not bad, (
        f"a module docstring says its idea in 2-5 lines (STYLE.md); these have: {bad}"
    )


def test_no_function_on_the_request_path_is_over_forty_lines():
    long = [
        f"{m}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for m, tree in TREES.items()
        if part(m) in REQUEST_PATH
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 40
    ]
    assert not long, long


# ---- policy and mechanism: the step a lecture projects names no idea
# -----------------------------
CORE = ["minipaged.engine", "minipaged.scheduler", "minipaged.runner"]
# each idea of the series, by the words that name it; a quoted policy name counts too
IDEA_WORDS = re.compile(
    r"specul|guess|draft|ngram|n-gram|\bsjf\b|shortest|\baging|admission_window|working.set|denning|drum|"
    r"\blru\b|fifo|\bclock\b|belady|automat|regex|json|schema|['\"](priority|greedy|static)['\"]",
    re.IGNORECASE,
)
OWNERS = {
    "scheduler": "Scheduler",
    "runner": "ModelRunner",
    "attention": "PagedAttention",
}


def core_functions() -> dict[tuple[str | None, str], ast.FunctionDef]:
    """(class or None, name) -> every function of the three core files."""
    found = {}
    for module in CORE:
        for node in TREES[module].body:
            if isinstance(node, ast.FunctionDef):
                found[(None, node.name)] = node
            elif isinstance(node, ast.ClassDef):
                found.update(
                    {
                        (node.name, f.name): f
                        for f in node.body
                        if isinstance(f, ast.FunctionDef)
                    }
                )
    return found


def step_call_tree() -> set[tuple[str | None, str]]:
    """The core functions LLMEngine.step reaches: self.f(), self.scheduler.f(),
    self.runner.f(),
    self.attention.f() and module functions f(), followed through the three files."""
    functions, seen, todo = core_functions(), set(), [("LLMEngine", "step")]
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        for call in ast.walk(functions[key]):
            f = getattr(call, "func", None) if isinstance(call, ast.Call) else None
            if isinstance(f, ast.Name):
                todo += [(None, f.id)] if (None, f.id) in functions else []
            elif isinstance(f, ast.Attribute) and ast.unparse(f.value) == "self":
                todo += [(key[0], f.attr)] if (key[0], f.attr) in functions else []
            elif isinstance(f, ast.Attribute) and ast.unparse(f.value).startswith(
                "self."
            ):
                owner = OWNERS.get(ast.unparse(f.value)[5:])
                todo += [(owner, f.attr)] if (owner, f.attr) in functions else []
    return seen


def test_the_core_stays_within_its_line_budget():
    """engine + scheduler + runner hold the mechanism only: 977 lines before the seams,
    712 after."""
    lines = sum(len(MODULES[m].read_text().splitlines()) for m in CORE)
    assert lines <= 750, (
        f"the three core files have {lines} lines: move an idea onto a seam (policies/)"
    )


def test_the_steps_call_tree_stays_small():
    """Followed from LLMEngine.step through the three files: 40 functions and 458 lines
    before the seams, 31 and 341 after (nano-vllm's step: 11 functions, 170 lines, no
    docstrings).
    """
    functions = core_functions()
    tree = step_call_tree()
    lines = sum(functions[k].end_lineno - functions[k].lineno + 1 for k in tree)
    assert ("Scheduler", "_admit") in tree and (
        "ModelRunner",
        "prepare",
    ) in tree  # the walk finds the step
    assert len(tree) <= 32 and lines <= 350, (
        f"{len(tree)} functions, {lines} lines: {sorted(tree, key=str)}"
    )


def test_the_core_names_no_idea_outside_its_option_registry():
    """No idea of the series is named in the three files but in their *Config option
    lists and imports."""
    named = []
    for module in CORE:
        tree, lines = TREES[module], MODULES[module].read_text().splitlines()
        exempt = {
            n
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and node.name.endswith("Config")
            or isinstance(node, (ast.Import, ast.ImportFrom))
            for n in range(node.lineno, node.end_lineno + 1)
        }
        named += [
            f"{module}:{i}: {line.strip()}"
            for i, line in enumerate(lines, 1)
            if i not in exempt and IDEA_WORDS.search(line)
        ]
    assert not named, (
        "ask a policy on a seam instead (minipaged/policies):\n" + "\n".join(named)
    )


def test_the_idea_detector_sees_an_idea():
    assert IDEA_WORDS.search('if self.config.scheduling_policy == "priority":')
    assert IDEA_WORDS.search("self._reserve_guesses(batch)") and IDEA_WORDS.search(
        "# SJF with aging"
    )
    assert not IDEA_WORDS.search("self.order.pick(self.waiting, self.steps)")


def test_seams_import_nothing_above_paging_and_sequence():
    """A policy sees requests, sequences and the block manager: never the scheduler, the
    model or the engine."""
    allowed = {"backend", "sampling", "outputs", "paging", "sequence", "policies"}
    seams = [m for m in MODULES if part(m) == "policies"] + [
        "minipaged.paging.replacement",
        "minipaged.paging.tier",
    ]
    graph = imports()
    above = {m: sorted(t for t in graph[m] if part(t) not in allowed) for m in seams}
    assert not {m: t for m, t in above.items() if t}, above
