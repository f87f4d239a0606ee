"""monitoring/ and docker/: the Prometheus config and alert rules, the Grafana dashboard, the compose file.

The main test runs a real Prometheus on 127.0.0.1 that discovers, through file_sd target files linked into
a targets folder (as monitoring/prometheus.yml documents), an in-process solo node and a two-node swarm of
`swarmnode join` subprocesses, and then evaluates every PromQL expression of the dashboard and of the
alert rules against what it scraped; then the swarm's nodes are broken one by one (a DHT process killed,
a node stopped cleanly, a node crashed) and Prometheus and /health must say so. Prometheus is the Debian
package `prometheus` (prometheus + promtool); the tests that need it are skipped without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from benchmarks.harness.processes import start_node, stop_all
from swarmnode.config import load_config
from swarmnode.metrics_server import TARGET_FILE
from tests.helpers.prometheus import SCRAPE_S, Prometheus
from tests.helpers.swarm_procs import free_port

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
PROMETHEUS_YML = MONITORING / "prometheus.yml"
ALERTS_YML = MONITORING / "alerts.yml"
ALERTS_TEST_YML = MONITORING / "alerts_test.yml"  # promtool unit tests of the alerts' time windows
DASHBOARD = MONITORING / "grafana" / "dashboards" / "swarmnode.json"
COMPOSE = REPO / "docker" / "compose.yaml"

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="prometheus/promtool not installed (Debian package `prometheus`)",
)

# Grafana's built-in interval variables, replaced by a window that holds several test scrapes.
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


# ---------------------------------------------------------------- expressions in the dashboard and alerts


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _all_panels(panels: list[dict]) -> list[dict]:
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(_all_panels(panel.get("panels", [])))  # panels inside collapsed rows
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, PromQL with template variables substituted) for every panel target."""
    exprs = []
    for panel in _all_panels(_dashboard()["panels"]):
        for target in panel.get("targets", []):
            exprs.append((panel["title"], substitute(target["expr"])))
    return exprs


def substitute(expr: str) -> str:
    """Grafana interval variables -> a fixed window; every other variable ($x, ${x}, ${x:fmt}, [[x]]) ->
    `.*`, the dashboard's "All" value, which matches every label value."""
    for name, value in GRAFANA_INTERVALS.items():
        expr = expr.replace(name, value)
    return re.sub(r"\$\{[^}]+\}|\$\w+|\[\[\w+\]\]", ".*", expr)


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS_YML.read_text())["groups"] for rule in group["rules"]]


def _split_top_level(expr: str, words: tuple[str, ...]) -> list[str]:
    """Split at set operators (and/or/unless) outside parentheses, braces, brackets and strings."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'`":
            quote = c
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif depth == 0:
            m = re.match(r"\b({})\b".format("|".join(words)), expr[i:])
            if m and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] == "_")):
                parts.append(expr[start:i])
                i += m.end()
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts]


_TRAILING_COMPARISON = re.compile(r"\s*(==|!=|<=|>=|<|>)\s*(bool\s+)?[-+*/0-9.e\s()]+$")
_OFFSET = re.compile(r"\s+offset\s+-?[0-9]+[smhdwy]")


def alert_probe_exprs(expr: str) -> list[str]:
    """The parts of an alert expression that must return data on a healthy, running swarm.

    An alert expression is only non-empty while the alert fires, so we check what it compares instead:
    the expression is split at its top-level set operators (`and`, `or`, `unless`), and each operand loses
    a trailing comparison with a number (`> 0.5`, `== 0`, `> 1048576 / 60`). What remains (`up`,
    `deriv(...)`, the reject ratio, `time() - checkpoint time`) must return a series for every node that
    exports the metric; the full expression is separately checked to parse and evaluate. An `offset`
    (a guard that asks for hours of history, or last hour's low point) is dropped too: the test's
    Prometheus has minutes of data, and the same selector without it must return a series.
    """
    parts = _split_top_level(expr, ("and", "or", "unless"))
    return [_OFFSET.sub("", _TRAILING_COMPARISON.sub("", part)) for part in parts]


def test_alert_probes_strip_only_the_comparison():
    assert alert_probe_exprs("up == 0") == ["up"]
    assert alert_probe_exprs("deriv(m[30m]) > 1048576 / 60") == ["deriv(m[30m])"]
    assert alert_probe_exprs("deriv(m[2h]) <= 0 and m offset 2h") == ["deriv(m[2h])", "m"]
    assert alert_probe_exprs("min_over_time(m[1h]) / min_over_time(m[1h] offset 1h) - 1 > 0.1") == [
        "min_over_time(m[1h]) / min_over_time(m[1h]) - 1"
    ]
    assert alert_probe_exprs('(a{x="and"} / b) > 0.5\nand\nsum by (i) (c) > 0.01') == [
        '(a{x="and"} / b)',
        "sum by (i) (c)",
    ]
    assert substitute('rate(m{peer_id=~"$node", task=~"${task}"}[$__rate_interval])') == (
        'rate(m{peer_id=~".*", task=~".*"}[1m])'
    )


# ---------------------------------------------------------------- the dashboard's structure


def test_dashboard_structure():
    """A hand-written structural check in the spirit of a JSON schema (Grafana publishes no JSON schema for
    dashboards that a test could load offline): the fields Grafana needs to import and render it."""
    d = _dashboard()
    assert isinstance(d["uid"], str) and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"])
    assert isinstance(d["title"], str) and d["title"]
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert set(d["time"]) == {"from", "to"}
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for name, metric in (("node", "swarmnode_node_info"), ("task", "swarmnode_task_reward")):
        var = variables[name]
        assert var["type"] == "query" and var["includeAll"] and var["multi"] and var["allValue"] == ".*"
        assert (
            var["definition"].startswith(f"label_values({metric}")
            and var["query"]["query"] == var["definition"]
        )
    panels = _all_panels(d["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    known_types = {"row", "timeseries", "stat", "table", "gauge", "bargauge", "text", "piechart"}
    expr_vars = set()
    for p in panels:
        assert p["type"] in known_types, p["title"]
        assert isinstance(p.get("title"), str) and p["title"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in ("x", "y", "w", "h")), p["title"]
        assert 0 < g["w"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert isinstance(t["expr"], str) and t["expr"].strip(), p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), p["title"]
            expr_vars |= set(re.findall(r"\$(\w+)", t["expr"]))
    builtins = {name[1:] for name in GRAFANA_INTERVALS}
    assert expr_vars - builtins <= set(variables), "an expression uses an undefined template variable"
    # the panels the dashboard promises
    titles = {p["title"] for p in panels}
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", []))
    for metric in (
        "swarmnode_rounds_total", "swarmnode_reward", "swarmnode_task_reward",
        "swarmnode_answer_format_ratio", "swarmnode_sampling_tokens_per_second",
        "swarmnode_round_phase_seconds", "swarmnode_loss",
        "swarmnode_kl", "swarmnode_clip_ratio", "swarmnode_importance_weight_mean",
        "swarmnode_importance_ess_ratio", "swarmnode_policy_version",
        "swarmnode_checkpoint_timestamp_seconds",
        "swarmnode_process_resident_memory_bytes", "swarmnode_peers_known", "swarmnode_peers_connected",
        "swarmnode_peers_banned", "swarmnode_rollout_groups_total", "swarmnode_rejected_total",
        "swarmnode_fetch_failures_total",
    ):  # fmt: skip
        assert metric in exprs, metric
    assert {"Node", "Swarm"} <= titles


def _swarm_row() -> list[dict]:
    """The panels under the Swarm row (the dashboard keeps its rows expanded, panels listed after them)."""
    panels = _dashboard()["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Swarm")
    row = []
    for panel in panels[start + 1 :]:
        if panel["type"] == "row":
            break
        row.append(panel)
    return row


def _mode_panel() -> dict:
    [panel] = [p for p in _swarm_row() if p["title"] == "Swarm or solo"]
    return panel


def test_the_swarm_row_says_solo_for_a_solo_node():
    """A solo node exports no swarm metrics: the row's first panel names each node solo or swarm, and every
    other panel of the row says "solo node" instead of a bare "No data" when it has nothing to show."""
    row, mode = _swarm_row(), _mode_panel()
    assert row[0]["id"] == mode["id"]
    assert mode["type"] == "stat" and mode["targets"][0]["legendFormat"] == "{{peer_id}}"
    [mapping] = mode["fieldConfig"]["defaults"]["mappings"]
    assert mapping["type"] == "value"
    assert "solo" in mapping["options"]["0"]["text"] and mapping["options"]["1"]["text"] == "swarm"
    for panel in row[1:]:
        assert "solo" in panel["fieldConfig"]["defaults"].get("noValue", ""), panel["title"]


def test_dashboard_decodes_with_grafana_foundation_sdk():
    """Grafana's own Python model of dashboards (grafana-foundation-sdk, generated from Grafana's schemas)
    decodes the file: every panel and variable, every target as a Prometheus query with its expr. The SDK
    decodes rather than validates, so the structural test above stays the main check."""
    sdk = pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk not installed")
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import dashboard as gdash
    from grafana_foundation_sdk.models import prometheus as gprom

    assert sdk
    register_default_plugins()
    raw = _dashboard()
    model = gdash.Dashboard.from_json(raw)
    assert model.uid == raw["uid"] and model.title == raw["title"]
    assert len(model.panels) == len(raw["panels"])
    assert [v.name for v in model.templating.list_val] == [v["name"] for v in raw["templating"]["list"]]
    for decoded, panel in zip(model.panels, raw["panels"], strict=True):
        if panel["type"] == "row":
            assert isinstance(decoded, gdash.RowPanel)
            continue
        assert isinstance(decoded, gdash.Panel) and decoded.type_val == panel["type"]
        assert [t.expr for t in decoded.targets] == [t["expr"] for t in panel["targets"]]
        assert all(isinstance(t, gprom.Dataquery) for t in decoded.targets)


# ---------------------------------------------------------------- promtool


@needs_prometheus
def test_promtool_checks_config_and_rules():
    rules = subprocess.run(["promtool", "check", "rules", str(ALERTS_YML)], capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in rules.stdout
    config = subprocess.run(
        ["promtool", "check", "config", str(PROMETHEUS_YML)], capture_output=True, text=True
    )
    assert config.returncode == 0, config.stdout + config.stderr  # missing target files are only warnings
    # the only target files it names are the ones linked into monitoring/targets/
    assert "/runs/" not in config.stdout + config.stderr, config.stdout + config.stderr


@needs_prometheus
def test_alert_windows_match_their_summaries():
    """monitoring/alerts_test.yml: RewardStalled ("2 hours") is not even pending before 2 hours of data;
    MemoryClimbing is never pending on flat memory (502 -> 504 MiB), never fires on a warm-up step, and
    fires on steady growth."""
    run = subprocess.run(
        ["promtool", "test", "rules", str(ALERTS_TEST_YML)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SwarmnodeRewardStalled" in ALERTS_TEST_YML.read_text()
    assert "SwarmnodeMemoryClimbing" in ALERTS_TEST_YML.read_text()


def _rendered(template: str, labels: dict[str, str]) -> str:
    """An alert annotation as Prometheus renders it (the rules use only ``{{ $labels.NAME }}``)."""
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m.group(1)], template)


@needs_prometheus
def test_the_dht_down_alert_fires_after_one_minute_of_a_dead_dht_process(tmp_path):
    """SwarmnodeDHTDown, as shipped (its `for: 1m`), on a node whose DHT process dies at 1m: not even
    pending while alive, pending but not firing 45 s after, firing with its labels and summary from 1 minute
    after. The live swarm below checks that a killed DHT process makes the rule's expression match."""
    [rule] = [r for r in alert_rules() if r["alert"] == "SwarmnodeDHTDown"]
    labels = {"peer_id": "p", "instance": "a:1", "job": "swarmnode"}
    series = "swarmnode_dht_alive{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    firing = {
        "exp_labels": {**rule["labels"], **labels},
        "exp_annotations": {k: _rendered(v, labels) for k, v in rule["annotations"].items()},
    }
    spec = {
        "rule_files": [str(ALERTS_YML)],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [{"series": series, "values": "1x3 0x13"}],  # 1 at 0-45s, 0 from 1m
            "promql_expr_test": [
                {"expr": 'max_over_time(ALERTS{alertname="SwarmnodeDHTDown"}[59s])', "eval_time": "59s",
                 "exp_samples": []},
                {"expr": 'ALERTS{alertname="SwarmnodeDHTDown"}', "eval_time": "1m45s",
                 "exp_samples": [{"labels": 'ALERTS{alertname="SwarmnodeDHTDown", alertstate="pending", '
                                  + ", ".join(f'{k}="{v}"' for k, v in firing["exp_labels"].items()) + "}",
                                  "value": 1}]},
            ],
            "alert_rule_test": [
                {"eval_time": "1m45s", "alertname": "SwarmnodeDHTDown", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "SwarmnodeDHTDown", "exp_alerts": [firing]},
                {"eval_time": "4m", "alertname": "SwarmnodeDHTDown", "exp_alerts": [firing]},
            ],
        }],
    }  # fmt: skip
    path = tmp_path / "dht_down_test.yml"
    path.write_text(yaml.safe_dump(spec))
    run = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert rule["for"] == "1m" and "1 minute" in rule["annotations"]["summary"]


@needs_prometheus
def test_native_prometheus_logs_no_error_for_the_shipped_config(tmp_path):
    """Prometheus run natively with monitoring/prometheus.yml, as the README says: no "Error adding file
    watch" (or any other error) for paths that exist only inside the compose containers."""
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={PROMETHEUS_YML}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "Server is ready to receive web requests" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        time.sleep(2)  # file discovery starts with the scrape manager: give it time to watch its files
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    errors = [line for line in log_path.read_text().splitlines() if "level=error" in line]
    assert not errors, "\n".join(errors)


# ---------------------------------------------------------------- a real Prometheus scraping real nodes


def _wait_for_file(path: Path, proc, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"node exited before writing {path}:\n{proc.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} not written within {timeout_s}s" + (proc.output() if proc else ""))
        time.sleep(0.2)


def _swarm_args(swarm_id: str) -> list[str]:
    return [
        "--config", "node_configs/tiny.yaml",
        "--rounds", "1000",  # kept running until the test stops them (SIGINT, by pid)
        "--set", f"swarm.swarm_id={swarm_id}",
        "--set", "swarm.min_peers=1",
        "--set", "swarm.share_deadline_s=3",
        "--set", "swarm.wait_for_peers_s=60",
        "--set", "swarm.peer_groups_per_round=4",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """Prometheus scraping a solo node (in-process) and a two-node swarm (subprocesses), all running."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (Debian package `prometheus`)")
    from swarmnode.node import Node

    work = tmp_path_factory.mktemp("monitoring")
    procs, node, prom = [], None, None
    try:
        a = start_node(work / "a", *_swarm_args("it-monitoring"))
        procs.append(a)
        procs.append(start_node(work / "b", *_swarm_args("it-monitoring"), peers=[a.address()]))
        cfg = load_config(
            REPO / "node_configs" / "tiny.yaml",
            {"run.run_dir": str(work / "solo"), "run.rounds": 2, "run.metrics_port": 0},
        )
        node = Node(cfg)
        node.run()  # its metrics server keeps serving until node.close()
        target_files = [node.run_dir / "prometheus_target.json"]
        for p in procs:
            _wait_for_file(p.run_dir / "prometheus_target.json", p, timeout_s=90)
            target_files.append(p.run_dir / "prometheus_target.json")
        for p in procs:  # a finished round with a swarm exchange: round and swarm metrics exist
            _wait_for_file(p.run_dir / "status.json", p, timeout_s=90)
        prom = Prometheus(work / "prometheus", target_files)
        prom.wait_ready()
        yield prom, node, procs
    finally:
        if prom is not None:
            prom.stop()
        stop_all(procs)  # in parallel: a node whose DHT process is gone takes seconds over its offline card
        if node is not None:
            node.close()


def _wait_until(prom: Prometheus, exprs: list[str], timeout_s: float) -> dict[str, dict]:
    """Evaluate until every expression returns data or the time is up; the last answer of each."""
    deadline = time.monotonic() + timeout_s
    while True:
        answers = {e: prom.query(e) for e in exprs}
        missing = [e for e, a in answers.items() if a.get("status") != "success" or not a["data"]["result"]]
        if not missing or time.monotonic() > deadline:
            return answers
        time.sleep(SCRAPE_S)


@needs_prometheus
def test_prometheus_scrapes_every_node_and_every_expression_returns_data(scraped):
    prom, node, procs = scraped
    n_targets = 1 + len(procs)
    # every target scraped, up, at least 3 times (rate() and deriv() need 2 samples in their window)
    ready = (
        f'count(up{{job="swarmnode"}} == 1) == {n_targets} '
        f'and on() count(count_over_time(up{{job="swarmnode"}}[1m]) >= 3) == {n_targets} '
        f"and on() count(swarmnode_peers_known) == {len(procs)}"
    )
    answer = _wait_until(prom, [ready], timeout_s=60)[ready]
    assert answer["data"]["result"], (
        "not every target scraped 3 times: "
        + json.dumps(prom.query('up{job="swarmnode"}')["data"])
        + "\n"
        + prom.log()
    )
    peers = {r["metric"]["peer_id"] for r in prom.query("swarmnode_node_info")["data"]["result"]}
    assert node.peer_id in peers and len(peers) == n_targets

    checks: list[tuple[str, str]] = [(f"dashboard: {title}", e) for title, e in dashboard_exprs()]
    # the template variables' own queries, as /api/v1/series would answer label_values(METRIC, label)
    for var in _dashboard()["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var.get("definition", ""))
        if m:
            checks.append((f"variable {var['name']}", substitute(m.group(1))))
    for rule in alert_rules():
        full = prom.query(rule["expr"])
        assert full["status"] == "success", (rule["alert"], full)
        checks += [(f"alert {rule['alert']}", probe) for probe in alert_probe_exprs(rule["expr"])]

    answers = _wait_until(prom, [e for _, e in checks], timeout_s=30)
    failures = [
        f"{where}: {expr} -> {answers[expr].get('error') or 'no data'}"
        for where, expr in checks
        if answers[expr].get("status") != "success" or not answers[expr]["data"]["result"]
    ]
    assert not failures, "\n".join(failures)
    # the selectors really matched the nodes: per-task reward from the solo node, swarm data from both
    tasks = {r["metric"]["task"] for r in prom.query("swarmnode_task_reward")["data"]["result"]}
    assert tasks <= {"propositional_logic", "basic_arithmetic"} and tasks
    reasons = prom.query("swarmnode_rejected_total")["data"]["result"]
    assert {r["metric"]["peer_id"] for r in reasons} == {p.status()["peer_id"] for p in procs}
    # the rule files loaded into Prometheus: all alerts known, none firing on a healthy swarm
    rules = json.loads(urllib.request.urlopen(prom.url + "/api/v1/rules", timeout=10).read())["data"]
    loaded = {r["name"]: r for g in rules["groups"] for r in g["rules"]}
    assert set(loaded) == {r["alert"] for r in alert_rules()}
    assert all(r["health"] == "ok" for r in loaded.values()), loaded
    assert not [r for r in loaded.values() if r["state"] == "firing"]


@needs_prometheus
def test_the_swarm_or_solo_panel_names_the_solo_node_solo(scraped):
    prom, node, procs = scraped
    expr = substitute(_mode_panel()["targets"][0]["expr"])
    swarm_peers = {p.status()["peer_id"] for p in procs}
    expected = {node.peer_id: 0.0, **dict.fromkeys(swarm_peers, 1.0)}
    deadline = time.monotonic() + 30
    while True:
        answer = prom.query(expr)
        modes = {r["metric"]["peer_id"]: float(r["value"][1]) for r in answer["data"]["result"]}
        if modes == expected or time.monotonic() > deadline:
            break
        time.sleep(SCRAPE_S)
    assert modes == expected, answer


def _dht_process(pid: int):
    """The DHT process of the node with ``pid``: its child that runs p2pd."""
    import psutil

    for child in psutil.Process(pid).children():
        if any(grandchild.name() == "p2pd" for grandchild in child.children()):
            return child
    raise AssertionError(f"no DHT process under pid {pid}")


def _health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as e:  # 503 when degraded, with the same JSON
        return json.loads(e.read())


@needs_prometheus
def test_a_killed_dht_process_turns_health_degraded_and_raises_the_alert(scraped):
    """The scraped swarm's tests from here on break it: b's DHT process, a child of the node this module's
    fixture started, is killed by its PID; /health turns degraded naming it and SwarmnodeDHTDown's
    expression matches b (the alert is pending: that it fires once its `for: 1m` has passed is
    test_the_dht_down_alert_fires_after_one_minute_of_a_dead_dht_process, on the same rule file)."""
    prom, _node, procs = scraped
    b = procs[1]
    peer = b.status()["peer_id"]
    [target] = json.loads((b.run_dir / TARGET_FILE).read_text())
    health_url = f"http://{target['targets'][0]}/health"
    assert _health(health_url)["status"] == "ok"
    assert not prom.query('ALERTS{alertname="SwarmnodeDHTDown"}')["data"]["result"]
    _dht_process(b.proc.pid).kill()
    deadline = time.monotonic() + 60
    while (health := _health(health_url))["status"] == "ok" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert health["status"] == "degraded" and "DHT process" in " ".join(health["reasons"]), health
    raised = f'ALERTS{{alertname="SwarmnodeDHTDown", peer_id="{peer}"}}'  # pending, or already firing
    deadline = time.monotonic() + 60
    while not prom.query(raised)["data"]["result"]:
        assert time.monotonic() < deadline, prom.query('ALERTS{alertname="SwarmnodeDHTDown"}')
        time.sleep(SCRAPE_S / 2)
    others = prom.query('ALERTS{alertname="SwarmnodeDHTDown"}')["data"]["result"]
    assert {r["metric"]["peer_id"] for r in others} == {peer}, others  # only b's DHT is down
    assert b.proc.poll() is None, b.output()  # the node itself kept running
    assert _health(health_url)["status"] == "degraded"  # and still says so


def _up(prom: Prometheus) -> dict[str, float]:
    """peer id -> the latest `up` sample, for every target with a fresh series."""
    result = prom.query('up{job="swarmnode"}')["data"]["result"]
    return {r["metric"]["peer_id"]: float(r["value"][1]) for r in result}


def _wait_up(prom: Prometheus, done, timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while not done(up := _up(prom)) and time.monotonic() < deadline:
        time.sleep(SCRAPE_S / 2)
    return up


@needs_prometheus
def test_a_clean_stop_retires_the_target_and_a_crash_still_alerts(scraped):
    """Retiring a node: the one stopped cleanly (SIGTERM) empties its file_sd target file and leaves no `up`
    series behind, so `SwarmnodeDown` (up == 0 for 1m) never fires for it, while the one killed (SIGKILL, a
    crash) reads up == 0 and alerts. Runs after the killed-DHT test (it ends the swarm's two nodes)."""
    prom, node, procs = scraped
    stopped, crashed = procs
    stopped_id, crashed_id = (json.loads((p.run_dir / TARGET_FILE).read_text())[0]["labels"]["peer_id"]
                              for p in procs)  # fmt: skip
    every = {node.peer_id: 1.0, stopped_id: 1.0, crashed_id: 1.0}
    up = _wait_up(prom, lambda up: up == every, timeout_s=20)
    assert up == every, prom.log()

    os.kill(stopped.proc.pid, signal.SIGTERM)  # as systemd stops it; Ctrl-C takes the same path
    assert stopped.wait(timeout_s=60) == 143, stopped.output()
    assert json.loads((stopped.run_dir / TARGET_FILE).read_text()) == []
    crashed.kill()
    after = {node.peer_id: 1.0, crashed_id: 0.0}
    up = _wait_up(prom, lambda up: up == after, timeout_s=15)
    assert up == after, (up, prom.log())


# ---------------------------------------------------------------- docker/


def test_compose_references_existing_files():
    """docker/ cannot be built here (no engine): check the compose file's references instead."""
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert {"node-a", "node-b", "prometheus", "grafana"} <= set(services)
    base = COMPOSE.parent
    for name, service in services.items():
        build = service.get("build")
        if build:
            context = (base / build["context"]).resolve()
            assert (context / build["dockerfile"]).is_file(), name
            assert (context / "pyproject.toml").is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (base / source).exists(), f"{name}: {source}"
            else:
                assert source in compose["volumes"], f"{name}: volume {source}"
    # the node run folders compose uses are the ones its Prometheus config lists
    [job] = yaml.safe_load(_compose_prometheus_config(compose).read_text())["scrape_configs"]
    prom_files = {f for sd in job["file_sd_configs"] for f in sd["files"]}
    for name in ("node-a", "node-b"):
        assert f"/runs/{name}/prometheus_target.json" in prom_files
        assert f"/runs/{name}" in json.dumps(services[name])
    bases = {
        "Dockerfile.cpu": "python:3.11-slim",
        "Dockerfile.cuda": "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04",
    }
    for dockerfile, image in bases.items():
        text = (base / dockerfile).read_text()
        assert re.findall(r"^FROM (\S+)", text, re.M) == [image]
        assert "torch==2.13.0" in text and "COPY swarmnode ./swarmnode" in text
    grafana_provisioning = MONITORING / "grafana" / "provisioning"
    ds = yaml.safe_load((grafana_provisioning / "datasources" / "prometheus.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    dash = yaml.safe_load((grafana_provisioning / "dashboards" / "swarmnode.yaml").read_text())
    mounted = [v for v in services["grafana"]["volumes"] if "grafana/dashboards" in v][0]
    assert dash["providers"][0]["options"]["path"] == mounted.split(":")[1]


def _compose_mounts(compose: dict, service: str) -> dict[str, Path]:
    """Container path -> file on this machine, for the service's bind mounts."""
    mounts = {}
    for volume in compose["services"][service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (COMPOSE.parent / source).resolve()
    return mounts


def _compose_prometheus_config(compose: dict) -> Path:
    [flag] = [a for a in compose["services"]["prometheus"]["command"] if a.startswith("--config.file=")]
    return _compose_mounts(compose, "prometheus")[flag.split("=", 1)[1]]


def test_compose_prometheus_config_is_the_native_one_plus_the_compose_nodes():
    """docker/compose.yaml's Prometheus has a config of its own (its target paths exist only in the
    containers); apart from finding targets it must say what monitoring/prometheus.yml says."""
    compose = yaml.safe_load(COMPOSE.read_text())
    mounted = _compose_prometheus_config(compose)
    assert mounted != PROMETHEUS_YML.resolve()
    native, theirs = yaml.safe_load(PROMETHEUS_YML.read_text()), yaml.safe_load(mounted.read_text())
    assert theirs["global"] == native["global"] and theirs["rule_files"] == native["rule_files"]
    [native_job], [compose_job] = native["scrape_configs"], theirs["scrape_configs"]
    discovery = ("file_sd_configs", "relabel_configs")
    assert {k: v for k, v in compose_job.items() if k not in discovery} == {
        k: v for k, v in native_job.items() if k not in discovery
    }
    assert "relabel_configs" not in native_job  # relabelling /runs/NAME targets is compose's business


@needs_prometheus
def test_promtool_checks_the_compose_prometheus_config(tmp_path):
    """Its files laid out as compose mounts them (config and alert rules side by side in /etc/prometheus)."""
    compose = yaml.safe_load(COMPOSE.read_text())
    etc = tmp_path / "etc" / "prometheus"
    etc.mkdir(parents=True)
    for target, source in _compose_mounts(compose, "prometheus").items():
        if target.startswith("/etc/prometheus/"):
            shutil.copy(source, etc / Path(target).name)
    config = subprocess.run(
        ["promtool", "check", "config", str(etc / "prometheus.yml")], capture_output=True, text=True
    )
    assert config.returncode == 0, config.stdout + config.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in config.stdout
