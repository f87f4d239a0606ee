"""The status page (issue #30): the metrics port serves it at / with /page.json beside it, a bootstrap
serves its own, `swarmnode status --html` saves one from a run folder, and no peer string in it can
become markup. The page as a browser draws it: here on a saved page, in tests/integration against a node."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from swarmnode import status_page
from swarmnode.bootstrap import BootstrapCollector
from swarmnode.metrics import NodeCollector
from swarmnode.metrics_server import MetricsServer
from swarmnode.status_page import DATA_MARK, MAX_PAGE_PEERS, PAGE_FILE
from tests.helpers.browser import chromium_or_skip, load
from tests.helpers.run_folders import HELPER, RELAY, nated_node, round_record, status_json, write_run_folder

REPO = Path(__file__).resolve().parents[2]
INJECTED = "</script><script>document.title='owned'</script><img src=x onerror=alert(1)>"


def _get(url: str) -> tuple[bytes, str]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read(), reply.headers["Content-Type"]


def _embedded(html: str) -> dict:
    """The data a page was rendered with."""
    literal = html.split("const EMBEDDED = ", 1)[1].split(";\n", 1)[0]
    return json.loads(literal)


def test_the_metrics_port_serves_the_page_and_its_json_from_the_run_folder(tmp_path):
    folder = nated_node(tmp_path)
    server = MetricsServer(
        NodeCollector({"peer_id": "12D3KooWours", "model": "tiny"}, folder), "127.0.0.1", 0
    )
    try:
        html, ctype = _get(server.url + "/")
        body, json_type = _get(server.url + "/page.json")
    finally:
        server.close()
    assert ctype == "text/html; charset=utf-8" and json_type == "application/json"
    page, data = _embedded(html.decode()), json.loads(body)
    for shown in (page, data):
        assert shown["kind"] == "node" and shown["live"] and shown["health"]["status"] in ("ok", "degraded")
        assert [r["round"] for r in shown["view"]["rounds"]] == list(range(1, 9))
        assert [p["peer"] for p in shown["view"]["peers"]] == [RELAY, HELPER]
    assert DATA_MARK not in html.decode()


def test_the_page_needs_no_network_but_its_own_json():
    template = PAGE_FILE.read_text()
    assert not re.search(r"\b(src|href)\s*=|@import|url\(|<link|<iframe", template)
    assert re.findall(r"fetch\(\s*([^,)]+)", template) == ['"page.json"']


def test_a_node_that_wrote_nothing_yet_serves_its_health_only(tmp_path):
    collector = NodeCollector({}, tmp_path)
    assert collector.page()["view"] is None and collector.page()["health"]["status"] == "ok"
    assert NodeCollector({}).page()["view"] is None  # a collector without a run folder


def test_no_peer_string_becomes_markup(tmp_path):
    ban = {"peer": INJECTED, "remaining_s": 5.0, "count": 1, "reason": INJECTED}
    status = status_json(peers={RELAY: {"model": INJECTED, "tokenizer": INJECTED, "round": 1}}, bans=[ban])
    folder = write_run_folder(tmp_path, [round_record(1)], status)
    html = status_page.render(status_page.saved_page(folder))
    literal = html.split("const EMBEDDED = ", 1)[1].split(";\n", 1)[0]
    assert "<" not in literal and html.count("</script>") == 1 and "<img" not in html
    assert _embedded(html)["view"]["peers"][0]["model"] == INJECTED  # shown as the text it is


def test_status_html_saves_a_page_of_the_run_folder(tmp_path):
    folder = nated_node(tmp_path / "run")
    out = tmp_path / "page.html"
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", "status", "--run-dir", str(folder), "--html", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = _embedded(out.read_text())
    assert not data["live"] and data["running"] is None and len(data["view"]["rounds"]) == 8


def test_a_bootstrap_serves_its_connections_and_health():
    peers = {f"12D3KooW{i:04d}" for i in range(MAX_PAGE_PEERS + 10)}
    transport = SimpleNamespace(
        connected_peers=lambda: peers, connected_peer_count=lambda: len(peers), dht_alive=lambda: True,
        dht_stats=lambda: {"routing_table_peers": 12, "stored_records": 40},
    )  # fmt: skip
    page = BootstrapCollector("12D3KooWboot", transport).page()
    assert page["kind"] == "bootstrap" and page["health"]["status"] == "ok" and page["view"] is None
    assert (
        page["bootstrap"]["connected"] == MAX_PAGE_PEERS + 10
        and len(page["bootstrap"]["peers"]) == MAX_PAGE_PEERS
    )
    assert page["bootstrap"]["routing_table_peers"] == 12


def test_the_page_ships_with_the_package():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert PAGE_FILE.name in pyproject["tool"]["setuptools"]["package-data"]["swarmnode"]


def test_a_browser_draws_a_saved_page_with_peer_strings_as_text(tmp_path):
    browser = chromium_or_skip()
    status = status_json(
        peers={RELAY: {"model": INJECTED, "tokenizer": "77aa", "round": 8, "seen_s_ago": 4.0}}
    )
    folder = write_run_folder(tmp_path / "run", [round_record(r, 0.1 * r) for r in range(1, 6)], status)
    page = tmp_path / "page.html"
    page.write_text(status_page.render(status_page.saved_page(folder)))
    dom, shot = load(browser, page.as_uri(), tmp_path)
    print(f"screenshot: {shot}")
    own = next(line for line in dom.polylines if line.get("data-series") == "own groups")
    assert own["data-points"] == "5" and len(own["points"].split()) == 5
    header, relay = dom.tables["peers"]
    assert header[0] == "peer" and relay[0] == RELAY and relay[1] == INJECTED and relay[3] == "8"
    assert "img" not in dom.tags and dom.texts["title"] != "owned"
    assert dom.texts["connection"].startswith("connection: client mode")
    assert dom.texts["health"].startswith("node not running")


def test_a_live_page_refreshes_itself_from_page_json(tmp_path):
    browser = chromium_or_skip()
    folder = nated_node(tmp_path / "run")
    collector = NodeCollector({}, folder)
    asked = []
    page = collector.page
    collector.page = lambda: asked.append(1) or page()  # "/" and each /page.json ask for the data
    server = MetricsServer(collector, "127.0.0.1", 0)
    try:
        dom, _ = load(
            browser, server.url + "/", tmp_path, run_scripts_ms=int(2.5 * status_page.REFRESH_S * 1000)
        )
    finally:
        server.close()
    assert len(asked) >= 3, asked  # the page, then at least two refreshes
    assert dom.texts["footer"].startswith("live: refreshed every 5 s")
