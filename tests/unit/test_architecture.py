"""The package's layers, as a test: imports only go down, and no module grows past one sitting.

    base   config, errors, common, rollouts, prompts, identity   (no torch, hivemind, transformers,
                                                                  reasoning-gym)
    tasks  tasks                                                 (reasoning-gym: questions and rewards)
    learn/ the learner (torch)          swarm/ the network (hivemind, lazily)   -- neither imports the other;
                                                                                  learn/ not tasks either
    core   policy, sampler/, checkpoint, runlog, metrics, rounds, node, join, evaluate, status, bootstrap
    cli    cli

Every import counts, at module level, inside a function (a lazy upward import is still upward) or under
``if TYPE_CHECKING:`` (a circle hidden there is still two files that must change together). The checker is
a pure function of the import graph, tested on a graph with an upward import added so that it can be seen
to fail.

Around the package, imports go tests -> benchmarks -> swarmnode: the package imports neither (it is what
``pip install .`` ships), and the benchmarks never import the tests. The package imports no third-party
module that its runtime dependencies in pyproject.toml do not bring (scipy, from the ``test`` extra, is
for the benchmarks' statistics only).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import swarmnode

PACKAGE = Path(swarmnode.__file__).resolve().parent
BASE = {"config", "errors", "common", "rollouts", "prompts", "identity", "__init__"}
HEAVY = {"torch", "hivemind", "transformers", "reasoning_gym", "vllm", "peft", "safetensors"}
LAYERS = {"base": 0, "tasks": 1, "learn": 2, "swarm": 2, "core": 3, "cli": 4}
SWARM_LAYERS = {"wire": 0, "net": 1, "exchange": 2}  # inside swarm/
MAX_MODULE_LINES = 450  # a module a newcomer reads in one sitting; past this it is two concepts
README = PACKAGE.parent / "README.md"
REPO = PACKAGE.parent
TREES = ("swarmnode", "benchmarks", "tests")  # a tree imports itself and the trees before it, never after
PYPROJECT = REPO / "pyproject.toml"
IMPORT_NAMES = {"pyyaml": "yaml"}  # a runtime dependency whose module is not its name, "-" read as "_"
# what the package may import beyond its declared runtime dependencies: what they bring with them
# (numpy: torch and transformers; huggingface_hub: transformers; psutil: accelerate), and the vllm
# sampler's own extra, imported only by that sampler
BROUGHT = {"numpy", "huggingface_hub", "psutil", "vllm"}


def layer_of(module: str) -> str:
    """``module`` is dotted and relative to the package: ``learn.trainer``, ``config``, ``sampler.hf``."""
    head = module.split(".")[0]
    if head in BASE:
        return "base"
    if head in ("tasks", "learn", "swarm", "cli"):
        return head
    return "core"


def imports_of(path: Path) -> set[str]:
    """Absolute names imported anywhere in the file (``swarmnode.x.y`` or a top-level third-party name)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
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
            elif here == there == "swarm" and _swarm_rank(name) > _swarm_rank(module):
                found.append(f"{module} imports {name}: swarm's sub-layers are wire < net < exchange")
    return found


def _swarm_rank(module: str) -> int:
    """``swarm.net.transport`` -> 1; ``swarm`` itself (its ``__init__``) is below every sub-layer."""
    parts = module.split(".")
    return SWARM_LAYERS[parts[1]] if len(parts) > 1 else -1


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
    graph["swarm.exchange.verify"] = graph["swarm.exchange.verify"] | {"learn.grpo"}
    graph["learn.grpo"] = graph["learn.grpo"] | {"tasks"}
    graph["config"] = graph["config"] | {"torch", "node"}
    graph["swarm.wire.codec"] = graph["swarm.wire.codec"] | {"swarm.net.transport"}
    graph["swarm.net.notices"] = graph["swarm.net.notices"] | {"swarm.exchange.pool", "swarm.wire.limits"}
    assert violations(graph) == [
        "config (base) imports node (core)",
        "config (base) imports torch",
        "learn.grpo (learn) imports tasks (tasks)",
        "learn.trainer (learn) imports swarm.exchange (swarm)",
        "swarm.exchange.verify (swarm) imports learn.grpo (learn)",
        "swarm.net.notices imports swarm.exchange.pool: swarm's sub-layers are wire < net < exchange",
        "swarm.wire.codec imports swarm.net.transport: swarm's sub-layers are wire < net < exchange",
    ]


def test_the_layers_are_what_the_docstring_says():
    assert layer_of("learn.batch") == "learn" and layer_of("swarm.net.transport") == "swarm"
    assert layer_of("prompts") == "base" and layer_of("sampler.hf") == "core" and layer_of("cli") == "cli"


def test_no_import_circle():
    assert cycles(package_graph()) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_longer_than_one_sitting():
    long = {}
    for path in PACKAGE.rglob("*.py"):
        name = str(path.relative_to(PACKAGE))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES:
            long[name] = n
    assert long == {}


def test_a_circle_hidden_under_type_checking_is_seen(tmp_path):
    """The import circles of the past hid under ``if TYPE_CHECKING:``; imports_of reads them too."""
    lines = ["from typing import TYPE_CHECKING", "if TYPE_CHECKING:", "    from swarmnode import swarm"]
    (tmp_path / "m.py").write_text("\n".join(lines) + "\n")
    assert "swarmnode.swarm" in imports_of(tmp_path / "m.py")


def readme_modules(readme: str) -> set[str]:
    """Module paths (``learn/heap.py``) named by the README's layout tree: an entry is a line whose first
    word ends in ``.py`` or ``/``, placed under the nearest less indented folder entry (lines whose first
    word is neither, such as "base:" or "core", only group their children)."""
    block = readme.split("\n```\nswarmnode/\n", 1)[1].split("\n```", 1)[0]
    found, folders = set(), []  # folders: (indent, name) of the open folder entries
    for line in block.splitlines():
        stripped = line.lstrip()
        word = stripped.split(" ", 1)[0] if stripped else ""
        indent = len(line) - len(stripped)
        if not indent:
            break  # protocol/, monitoring/...: past the package
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if not (word.endswith(".py") or word.endswith("/")):
            continue
        path = "".join(name for _, name in folders) + word
        if word.endswith("/"):
            folders.append((indent, word))
        else:
            found.add(path)
    return found


def test_the_readme_layout_tree_names_every_module():
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    assert modules - readme_modules(README.read_text()) == set()


def test_the_readme_tree_reader_places_each_module_in_its_folder():
    lines = [
        "  a.py   one",
        "  sub/   two",
        "    b.py  three",
        "           wrapped",
        "  core",
        "    c.py  four",
    ]
    tree = "x\n```\nswarmnode/\n" + "\n".join(lines) + "\nprotocol/  spec\n```\n"
    assert readme_modules(tree) == {"a.py", "sub/b.py", "c.py"}


def test_no_part_of_the_data_plane_knows_the_facade():
    """The exchange's stages are handed what they use; only the node's core builds a Swarm."""
    users = {m for m, names in package_graph().items() if "swarm.exchange.swarm" in names}
    assert users and not any(m.startswith("swarm.") for m in users), users


def tree_graph() -> dict[str, set[str]]:
    """file (relative to the repository) -> the top-level trees and third-party names it imports."""
    graph = {}
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            graph[str(path.relative_to(REPO))] = {name.split(".")[0] for name in imports_of(path)}
    return graph


def tree_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports against tests -> benchmarks -> swarmnode, and third-party imports in the package that its
    runtime dependencies do not bring (one line each)."""
    found = []
    for path, names in sorted(graph.items()):
        tree = path.split("/")[0]
        allowed_trees = set(TREES[: TREES.index(tree) + 1])
        for name in sorted(names):
            if name in TREES and name not in allowed_trees:
                found.append(f"{path} ({tree}) imports {name}")
            elif tree == "swarmnode" and name not in TREES and name not in STDLIB and name not in RUNTIME:
                found.append(f"{path} imports {name}, which no runtime dependency brings")
    return found


STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def runtime_modules(pyproject: str) -> set[str]:
    """Top-level modules the package may import: its ``[project] dependencies`` (pyproject.toml) by module
    name, and ``BROUGHT``. The extras (``test``: scipy, pytest...) are not among them."""
    requirements = tomllib.loads(pyproject)["project"]["dependencies"]
    names = {re.match(r"[A-Za-z0-9._-]+", r).group().lower().replace("-", "_") for r in requirements}
    return {IMPORT_NAMES.get(n, n) for n in names} | BROUGHT


RUNTIME = runtime_modules(PYPROJECT.read_text())


def test_the_runtime_modules_are_pyprojects_dependencies():
    pyproject = '[project]\ndependencies = ["torch>=2.4", "pyyaml>=6", "reasoning-gym==0.1.25"]\n'
    pyproject += '[project.optional-dependencies]\ntest = ["scipy>=1.10"]\n'
    assert runtime_modules(pyproject) == {"torch", "yaml", "reasoning_gym"} | BROUGHT
    assert "scipy" not in RUNTIME and "pytest" not in RUNTIME


def test_imports_go_tests_then_benchmarks_then_swarmnode():
    assert tree_violations(tree_graph()) == []


def test_the_tree_checker_sees_a_planted_violation():
    graph = tree_graph()
    graph["swarmnode/node.py"] = graph["swarmnode/node.py"] | {"benchmarks", "scipy"}
    graph["swarmnode/config/node.py"] = graph["swarmnode/config/node.py"] | {"tests"}
    graph["benchmarks/bench.py"] = graph["benchmarks/bench.py"] | {"tests"}
    graph["tests/unit/test_stats.py"] = graph["tests/unit/test_stats.py"] | {"benchmarks", "scipy"}  # allowed
    assert tree_violations(graph) == [
        "benchmarks/bench.py (benchmarks) imports tests",
        "swarmnode/config/node.py (swarmnode) imports tests",
        "swarmnode/node.py (swarmnode) imports benchmarks",
        "swarmnode/node.py imports scipy, which no runtime dependency brings",
    ]


def test_no_package_code_cites_an_issue_number():
    """Docstrings and comments state the contract and the reason; history goes to docs/ and the commit log."""
    cited = {
        str(path.relative_to(REPO)): hits
        for path in PACKAGE.rglob("*.py")
        if (hits := re.findall(r"#\d+", path.read_text()))
    }
    assert cited == {}
    assert re.findall(r"#\d+", "see issue #27 and PR #3") == ["#27", "#3"]
