"""The package's layers, as a test: imports only go down, and no module grows past one sitting.

    base   config, errors, common, rollouts, prompts, identity   (no torch, hivemind, transformers,
                                                                  reasoning-gym)
    tasks  tasks                                                 (reasoning-gym: questions and rewards)
    learn/ the learner (torch)          swarm/ the network (hivemind, lazily)   -- neither imports the other;
                                                                                  learn/ not tasks either
    core   policy, sampler/, checkpoint, runlog, metrics, rounds, node, evaluate, status, bootstrap
    cli    cli

Every import counts, at module level or inside a function (a lazy upward import is still upward), except
those under ``if TYPE_CHECKING:``. The checker is a pure function of the import graph, tested on a graph
with an upward import added so that it can be seen to fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import swarmnode

PACKAGE = Path(swarmnode.__file__).resolve().parent
BASE = {"config", "errors", "common", "rollouts", "prompts", "identity", "__init__"}
HEAVY = {"torch", "hivemind", "transformers", "reasoning_gym", "vllm", "peft", "safetensors"}
LAYERS = {"base": 0, "tasks": 1, "learn": 2, "swarm": 2, "core": 3, "cli": 4}
MAX_MODULE_LINES = 550  # "about 500": a module a newcomer reads in one sitting


def layer_of(module: str) -> str:
    """``module`` is dotted and relative to the package: ``learn.trainer``, ``config``, ``sampler.hf``."""
    head = module.split(".")[0]
    if head in BASE:
        return "base"
    if head in ("tasks", "learn", "swarm", "cli"):
        return head
    return "core"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path) -> set[str]:
    """Absolute names imported anywhere in the file (``swarmnode.x.y`` or a top-level third-party name)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # a name may be a module (from swarmnode.swarm import protocol): package_graph resolves it
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")


def package_graph() -> dict[str, set[str]]:
    """module -> what it imports; package modules relative (``learn.batch``), others by top-level name."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__") for p in paths
    }

    def resolve(name: str) -> str | None:
        if not name.startswith("swarmnode."):
            return name.split(".")[0]
        parts = name.removeprefix("swarmnode.").split(".")
        while parts and ".".join(parts) not in modules:  # swarmnode.swarm.wire.protocol.X -> swarm.protocol
            parts.pop()
        return ".".join(parts) or None  # None: the package's own __init__

    graph = {}
    for path in paths:
        module = _module_name(path)
        graph[module] = {r for name in imports_of(path) if (r := resolve(name)) and r != module}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up or sideways between layers, and every base module importing a heavy
    dependency (one line each)."""
    found = []
    modules = set(graph)
    for module, names in sorted(graph.items()):
        here = layer_of(module)
        for name in sorted(names):
            if name not in modules and not any(m.startswith(name + ".") for m in modules):
                if here == "base" and name in HEAVY:
                    found.append(f"{module} (base) imports {name}")
                continue
            there = layer_of(name)
            if LAYERS[there] > LAYERS[here] or (there != here and LAYERS[there] == LAYERS[here]):
                found.append(f"{module} ({here}) imports {name} ({there})")
            elif here == "learn" and there == "tasks":
                found.append(f"{module} (learn) imports {name} (tasks)")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles among the package's modules (each reported once, from its smallest member)."""
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for name in sorted(graph.get(module, ())):
            if name not in graph:
                continue
            if state.get(name) == "open":
                circle = path[path.index(name) :]
                start = circle.index(min(circle))
                found.append(circle[start:] + circle[:start])
            elif name not in state:
                visit(name, [*path, name])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_no_import_goes_up_a_layer():
    assert violations(package_graph()) == []


def test_the_checker_sees_an_upward_import():
    graph = package_graph()
    graph["learn.trainer"] = graph["learn.trainer"] | {"swarm.exchange"}
    graph["swarm.verify"] = graph["swarm.verify"] | {"learn.grpo"}
    graph["learn.grpo"] = graph["learn.grpo"] | {"tasks"}
    graph["config"] = graph["config"] | {"torch", "node"}
    assert violations(graph) == [
        "config (base) imports node (core)",
        "config (base) imports torch",
        "learn.grpo (learn) imports tasks (tasks)",
        "learn.trainer (learn) imports swarm.exchange (swarm)",
        "swarm.verify (swarm) imports learn.grpo (learn)",
    ]


def test_the_layers_are_what_the_docstring_says():
    assert layer_of("learn.batch") == "learn" and layer_of("swarm.transport") == "swarm"
    assert layer_of("prompts") == "base" and layer_of("sampler.hf") == "core" and layer_of("cli") == "cli"


def test_no_import_circle():
    assert cycles(package_graph()) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_longer_than_one_sitting():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
