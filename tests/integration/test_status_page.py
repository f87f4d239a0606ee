"""The status page of a running tiny node, in a real headless browser (issue #30): after 3 rounds it
draws the reward curve, and in a 2-node swarm its peers table lists the other node with what this node
trained from it; a bootstrap serves a page of its own. Each screenshot is kept in the test's tmp folder
(its path is printed)."""

from __future__ import annotations

import json
import time

from benchmarks.harness.processes import read_jsonl, start_bootstrap, start_node
from tests.helpers.browser import chromium_or_skip, load

ROUNDS_SHOWN = 3
WAIT_S = 60.0


def _args(family: str) -> list[str]:
    return [
        "--config", "node_configs/tiny.yaml", "--rounds", "1000", "--set", f"model.tiny.family={family}",
        "--set", "swarm.swarm_id=it-status-page", "--set", "swarm.min_peers=1",
        "--set", "swarm.share_deadline_s=4", "--set", "swarm.wait_for_peers_s=60",
    ]  # fmt: skip


def _until(what: str, check, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} in {timeout_s:.0f} s"
        time.sleep(0.5)
    return found


def test_the_page_of_a_running_node_shows_its_reward_curve_and_its_peer(tmp_path, nodes):
    browser = chromium_or_skip()  # before any node starts
    a = start_node(tmp_path / "a", *_args("llama"))
    nodes.append(a)
    nodes.append(b := start_node(tmp_path / "b", *_args("qwen2"), peers=[a.address()]))
    a.wait_for_round(ROUNDS_SHOWN, timeout_s=WAIT_S)
    b_id = _until("status of b", lambda: (b.run_dir / "status.json").exists() and b.status()["peer_id"])
    _until("group of b trained by a", lambda: any(
        g["producer"] == b_id for g in read_jsonl(a.run_dir / "peer_groups.jsonl")))  # fmt: skip
    _until("b in a's roster", lambda: b_id in a.status()["peers"])
    [target] = json.loads((a.run_dir / "prometheus_target.json").read_text())

    dom, shot = load(browser, f"http://{target['targets'][0]}/", tmp_path)
    print(f"screenshot of the status page: {shot}")
    own = next(line for line in dom.polylines if line.get("data-series") == "own groups")
    assert int(own["data-points"]) >= ROUNDS_SHOWN and len(own["points"].split()) >= ROUNDS_SHOWN
    header, *rows = dom.tables["peers"]
    row = dict(zip(header, next(r for r in rows if r[0].startswith(b_id)), strict=True))
    assert row["model"] == "tiny-qwen2" and int(row["groups trained from it"]) >= 1, row
    assert row["round"] and row["announced"].endswith("ago") and row["tokenizer"] != "?", row
    assert dom.texts["health"].startswith("health: ") and dom.texts["connection"].startswith("connection: ")
    assert dom.texts["footer"].startswith("live: refreshed every")


def test_a_bootstrap_serves_a_page_of_its_health_and_connections(tmp_path, nodes):
    browser = chromium_or_skip()
    boot = start_bootstrap(tmp_path / "boot", "--port", "0")
    nodes.append(boot)
    url = (
        boot.wait_for_line("metrics at ", WAIT_S)
        .split("metrics at ", 1)[1]
        .split()[0]
        .removesuffix("metrics")
    )
    dom, shot = load(browser, url, tmp_path, name="bootstrap")
    print(f"screenshot of the bootstrap's page: {shot}")
    assert (
        dom.texts["title"].startswith("swarmnode bootstrap 12D3KooW") and dom.texts["health"] == "health: ok"
    )
    rows = dict(row for row in dom.tables["connections"][1:])
    assert rows["peers connected"] == "0" and rows["roster"].startswith("none: a bootstrap serves any swarm")
