"""Security review, as tests: what a stranger on the network (or a damaged file) must never reach.

- No code from data: no pickle, marshal, eval/exec, unsafe YAML or unrestricted ``torch.load`` anywhere
  in the package (an AST scan of the source, checked against known-bad snippets so it can fail), and no
  reasoning-gym scorer that executes answer text on a swarm node (every dataset is tried with answers
  that would run code).
- Every msgpack decode has explicit limits (same scan).
- Key files are created 0600; the metrics server listens on 127.0.0.1 unless told otherwise.

Per-peer resource caps are tested where they live: tests/integration/test_transport.py (streams per peer
and in all, request/serve deadlines, frame caps), tests/unit/swarm/test_peers.py (batch and byte rates, bans,
bounded peer table), tests/unit/swarm/test_swarm_state.py (bounded exchange state).
"""

from __future__ import annotations

import ast
import os
import socket
import stat
import urllib.request
from pathlib import Path

import pytest

import swarmnode
from swarmnode.config import NodeConfig, TasksConfig, TaskSpec
from swarmnode.errors import ConfigError
from swarmnode.identity import load_or_create

PACKAGE = Path(swarmnode.__file__).resolve().parent
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
MSGPACK_LIMITS = {"max_str_len", "max_bin_len", "max_array_len", "max_map_len", "max_ext_len"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def unsafe_code(source: str) -> list[str]:
    """What in ``source`` could turn data into code, or decode msgpack without limits (one line each)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                if name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"line {line}: imports {name}")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        keywords = {k.arg: k.value for k in node.keywords}
        if name in FORBIDDEN_CALLS:
            found.append(f"line {line}: calls {name}()")
        elif name == "torch.load":
            weights_only = keywords.get("weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                found.append(f"line {line}: torch.load without weights_only=True")
        elif name in {"yaml.load", "yaml.unsafe_load", "yaml.full_load"}:
            found.append(f"line {line}: {name} (use yaml.safe_load)")
        elif name in {"msgpack.unpackb", "msgpack.loads", "msgpack.unpack", "msgpack.Unpacker"}:
            missing = MSGPACK_LIMITS - keywords.keys()
            if missing:
                found.append(f"line {line}: {name} without {', '.join(sorted(missing))}")
        elif name.endswith("numpy.load") or name == "np.load":
            allow = keywords.get("allow_pickle")
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                found.append(f"line {line}: {name} with allow_pickle")
    return found


@pytest.mark.parametrize(
    "snippet",
    [
        "import pickle",
        "from pickle import loads",
        "import marshal",
        "x = eval(data)",
        "exec(code)",
        "torch.load(path)",
        "torch.load(path, weights_only=False)",
        "yaml.load(text, Loader=yaml.Loader)",
        "msgpack.unpackb(data)",
        "msgpack.unpackb(data, max_str_len=1, max_bin_len=1, max_array_len=1, max_map_len=1)",
        "np.load(path, allow_pickle=True)",
    ],
)
def test_the_scan_finds_unsafe_code(snippet):
    assert unsafe_code(snippet), snippet


def test_the_scan_accepts_safe_code():
    safe = """
import json, yaml, msgpack, torch, ast
torch.load(path, weights_only=True, map_location="cpu")
yaml.safe_load(text)
msgpack.unpackb(data, max_str_len=1, max_bin_len=1, max_array_len=1, max_map_len=1, max_ext_len=0)
ast.literal_eval(text)
"""
    assert unsafe_code(safe) == []


def test_no_code_from_data_and_no_unbounded_msgpack_in_the_package():
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 20
    found = {str(p.relative_to(PACKAGE)): unsafe_code(p.read_text()) for p in sources}
    assert {name: lines for name, lines in found.items() if lines} == {}


def _payloads(marker: Path) -> list[str]:
    """Answers that create ``marker`` if the scorer executes them, in the syntaxes scorers parse."""
    call = f"__import__('builtins').open({str(marker)!r}, 'w').close()"
    return [call, f"[{call}]", f"({call}, 1)", f"[[{call}]]", f"{call} + 1"]


def test_no_reasoning_gym_scorer_runs_answer_text_except_the_refused_ones(tmp_path):
    """Every reasoning-gym dataset scores answers that would run code. Only the datasets listed in
    ``CODE_EVAL_SCORERS`` run them, and those are exactly the ones a swarm node refuses."""
    from reasoning_gym.factory import DATASETS

    from swarmnode.errors import TaskError
    from swarmnode.tasks import CODE_EVAL_SCORERS, TaskBank

    executed, scored = set(), 0
    for name in sorted(DATASETS):
        try:
            bank = TaskBank(TasksConfig(mix={name: TaskSpec()}, seed=1))
        except TaskError:  # needs a config to exist at all (e.g. composite)
            continue
        question = bank.question(bank.draw(1, 1)[0])
        marker = tmp_path / name
        for payload in _payloads(marker):
            bank.score(question, f"<answer>{payload}</answer>")
            bank.score(question, payload)
        scored += 1
        if marker.exists():
            executed.add(name)
    assert scored >= 100
    assert executed == CODE_EVAL_SCORERS


def test_a_swarm_node_refuses_datasets_whose_scorer_runs_answer_text():
    from swarmnode.swarm.exchange.peers import PeerBook
    from swarmnode.swarm.exchange.verify import Verifier
    from swarmnode.tasks import TaskBank

    bank = TaskBank(TasksConfig(mix={"countdown": TaskSpec(), "basic_arithmetic": TaskSpec()}, seed=1))
    with pytest.raises(ConfigError, match=r"tasks\.mix\.countdown: .*evaluating the answer text as Python"):
        Verifier(bank, "s", PeerBook())
    Verifier(TaskBank(TasksConfig(mix={"basic_arithmetic": TaskSpec()}, seed=1)), "s", PeerBook())


def test_a_node_identity_is_created_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        identity, created = load_or_create(tmp_path / "new-dir" / "identity.key")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "new-dir" / "identity.key").stat().st_mode)
    assert created and mode == 0o600, oct(mode)


def _lan_address() -> str | None:
    """An address of this machine other than loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks a route
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_metrics_listen_on_loopback_unless_asked():
    from swarmnode.metrics import NodeCollector
    from swarmnode.metrics_server import MetricsServer

    run = NodeConfig().run
    assert run.metrics_host == "127.0.0.1"
    server = MetricsServer(NodeCollector({"peer_id": "p"}), run.metrics_host, 0)
    try:
        assert server._server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"{server.url}/health", timeout=5) as reply:
            assert reply.status == 200
        lan = _lan_address()
        if lan is not None:  # the same port on the machine's LAN address is closed
            with pytest.raises(OSError):
                socket.create_connection((lan, server.port), timeout=2).close()
    finally:
        server.close()
