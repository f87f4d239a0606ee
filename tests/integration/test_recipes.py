"""docs/recipes.md runs as written: every block marked ``# recipe: NAME`` is run by bash here.

Only the settings lines at the top of a block (``NAME=value``) are changed: fewer rounds, a free port, a
run folder under tmp_path, a namespace prefix of the test's own. The mixed-model recipe's SmolLM2 node
is swapped for a third tiny node (another tokenizer: a Llama-shaped model whose tokenizer is trained from
another seed), so the test takes seconds a round; that the SmolLM2 config would join the same swarm
(task fingerprint, swarm id, sampling shape) is checked on its own. Each recipe runs as a process group
started here (``start_new_session``), ended by its leader's PID; the NAT test deletes the namespaces it
created, by the prefix it chose, whatever happened. The two runs are ``slow`` (``pytest -m slow
tests/integration/test_recipes.py``); the doc's markers and the SmolLM2 config's fit stay in the default
suite.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from benchmarks.harness.processes import node_env, read_jsonl
from swarmnode.config import load_config
from tests.helpers import netns
from tests.helpers.swarm_procs import end_group, free_port

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "docs" / "recipes.md"
MARK = "# recipe: "
SMOLLM2_NODE = "--config node_configs/mixed-smollm2.yaml"
THIRD_TINY_NODE = "--config node_configs/mixed-tiny.yaml --set model.tiny.seed=1"
ROUNDS = 4
MIXED_LIMIT_S = 300
NAT_LIMIT_S = 360
SHORT_LIMIT_S = 30  # network set-up and teardown blocks


def recipes() -> dict[str, str]:
    """The doc's ``bash`` blocks that start with the recipe marker, by name."""
    out = {}
    for block in re.findall(r"^```bash\n(.*?)^```", RECIPES.read_text(), re.M | re.S):
        first = block.partition("\n")[0]
        if first.startswith(MARK):
            out[first.removeprefix(MARK).strip()] = block
    return out


def with_settings(block: str, **values: object) -> str:
    """The block with each ``NAME=...`` settings line's value replaced (its comment kept)."""
    for name, value in values.items():
        pattern = re.compile(rf"^{name}=\S*", re.M)
        assert len(pattern.findall(block)) == 1, f"{name}= is not a settings line of:\n{block}"
        line = f"{name}={value}"
        block = pattern.sub(lambda _, line=line: line, block)
    return block


def run_recipe(script: str, timeout_s: float) -> subprocess.CompletedProcess:
    """bash runs ``script`` in the repository root, with this venv's ``swarmnode`` first on the PATH."""
    env = {**node_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(
        ["bash", "-c", script], cwd=REPO, env=env, start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"the recipe ran past {timeout_s} s:\n{out}")
    finally:
        end_group(proc)  # the nodes a failed recipe left running, by the group's leader
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def _status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def _logs(folder: Path) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for log in sorted(folder.glob("*.log")))


def test_the_recipes_are_marked_in_the_doc():
    assert set(recipes()) == {"mixed-swarm", "nat-network", "nat-swarm", "nat-teardown"}


def test_the_smollm2_config_joins_the_tiny_nodes_swarm():
    """What the test swaps out must still fit: same swarm, task fingerprint, G and completion cap."""
    from swarmnode.tasks import TaskBank

    tiny = load_config(REPO / "node_configs" / "mixed-tiny.yaml")
    smollm2 = load_config(REPO / "node_configs" / "mixed-smollm2.yaml")
    assert smollm2.model.name == "embedded:smollm2-135m-instruct"
    assert TaskBank(smollm2.tasks).fingerprint == TaskBank(tiny.tasks).fingerprint
    for section, field in [
        ("swarm", "swarm_id"), ("swarm", "identity_work_bits"),
        ("sampling", "completions_per_question"), ("sampling", "max_new_tokens"),
    ]:  # fmt: skip
        assert getattr(getattr(smollm2, section), field) == getattr(getattr(tiny, section), field), field
    assert recipes()["mixed-swarm"].count(SMOLLM2_NODE) == 1


@pytest.mark.slow  # a 3-node swarm, 4 rounds (~30 s); test_swarm.py keeps a mixed swarm in the default suite
def test_mixed_model_recipe(tmp_path):
    folder = tmp_path / "mixed"
    block = recipes()["mixed-swarm"].replace(SMOLLM2_NODE, THIRD_TINY_NODE)
    port = free_port()
    script = with_settings(block, TINY_ROUNDS=ROUNDS, SMOLLM2_ROUNDS=ROUNDS, PORT=port, DIR=folder)
    done = run_recipe(script, MIXED_LIMIT_S)
    assert done.returncode == 0, done.stdout + _logs(folder)

    nodes = ("llama", "qwen2", "smollm2")  # "smollm2" runs the third tiny node here
    statuses = {name: _status(folder / name) for name in nodes}
    ids = {name: status["peer_id"] for name, status in statuses.items()}
    assert len({status["tokenizer"] for status in statuses.values()}) == 3, statuses
    for name in nodes:
        records = read_jsonl(folder / name / "metrics.jsonl")
        assert [r["round"] for r in records] == list(range(1, ROUNDS + 1)), _logs(folder)
        assert sum(r["groups_peer"] for r in records) >= 1, _logs(folder)
        producers = {line["producer"] for line in read_jsonl(folder / name / "peer_groups.jsonl")}
        assert producers and producers <= set(ids.values()) - {ids[name]}, (name, producers)
        assert statuses[name]["rejected"] == {}, statuses[name]
    # the first node's key came from the recipe's keygen line, so the others dialed it by its address
    for name in ("qwen2", "smollm2"):
        saved = yaml.safe_load((folder / name / "config.yaml").read_text())
        assert saved["swarm"]["initial_peers"] == [f"/ip4/127.0.0.1/tcp/{port}/p2p/{ids['llama']}"]


NAT_REASON = netns.unavailable_reason(nft=True)


@pytest.mark.slow  # ~40 s; test_netns_nat.py keeps NAT through a relay in the default suite
@pytest.mark.skipif(NAT_REASON is not None, reason=NAT_REASON or "")
def test_nat_recipe(tmp_path):
    prefix = f"rcp-{uuid.uuid4().hex[:8]}"  # not the netns helper's "sn-": its leftover checks stay its own
    folder = tmp_path / "nat"
    blocks = recipes()
    try:
        network = run_recipe(with_settings(blocks["nat-network"], NS=prefix), SHORT_LIMIT_S)
        assert network.returncode == 0, network.stdout
        assert len(_ours(prefix)) == 4, network.stdout
        swarm = run_recipe(with_settings(blocks["nat-swarm"], NS=prefix, ROUNDS=3, DIR=folder), NAT_LIMIT_S)
        ids = {}
        for name in ("a", "b"):
            records = read_jsonl(folder / name / "metrics.jsonl")
            assert [r["round"] for r in records] == [1, 2, 3], swarm.stdout + _logs(folder)
            ids[name] = _status(folder / name)["peer_id"]
        for name, other in (("a", "b"), ("b", "a")):
            # behind its NAT each ran in client mode, and trained on the other NATed node's groups
            reachability = [line for line in (folder / f"{name}.log").read_text().splitlines()
                            if "reachability:" in line]  # fmt: skip
            assert reachability and "client mode" in reachability[0], _logs(folder)
            # its join hint names the relay it joined through, not its own undialable addresses
            hints = [line for line in (folder / f"{name}.log").read_text().splitlines() if "--peers" in line]
            assert hints and all("/ip4/11.79.0.1/" in h and "/ip4/127.0.0.1/" not in h for h in hints), hints
            producers = {line["producer"] for line in read_jsonl(folder / name / "peer_groups.jsonl")}
            assert producers == {ids[other]}, (producers, _logs(folder))
        assert re.search(r"counter packets [1-9]", swarm.stdout), swarm.stdout  # the NAT refused someone
        teardown = run_recipe(with_settings(blocks["nat-teardown"], NS=prefix), SHORT_LIMIT_S)
        assert teardown.returncode == 0, teardown.stdout
        assert _ours(prefix) == []  # the doc's teardown removes all it made
    finally:
        for name in _ours(prefix):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    assert _ours(prefix) == []


def _ours(prefix: str) -> list[str]:
    return [name for name in netns.leftover_namespaces(prefix) if name.startswith(f"{prefix}-")]
