"""/health says "degraded" with the reason when a check fails, /metrics exports the same verdict, and the
server answers while an idle client holds a connection open."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from swarmnode.metrics import HEALTH_DHT_STALE_S, HEALTH_MIN_ROUND_AGE_S, NodeCollector
from swarmnode.metrics_server import MetricsServer
from swarmnode.swarm.exchange.status import DHTHealth, PeerStatus, SwarmStatus
from tests.helpers.round_records import a_round_record


def _swarm_status(now: float, **dht) -> SwarmStatus:
    peer = PeerStatus(model="tiny", tokenizer="", policy_version=0, round=0, seen_s_ago=1.0, banned=False)
    return SwarmStatus(
        peers={"12D3KooWpeer": peer},
        connected=1,
        dht=DHTHealth(**{"alive": True, "last_read_ok": now, "last_write_ok": now, **dht}),
    )


def _samples(server: MetricsServer) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as reply:  # may import hivemind
        text = reply.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_a_healthy_swarm_node_is_ok():
    collector = NodeCollector({})
    collector.observe_swarm(_swarm_status(time.time()))
    assert collector.health()["status"] == "ok" and collector.health()["reasons"] == []


def test_each_failed_check_makes_the_node_degraded_with_its_reason():
    now = time.time()
    cases = {
        "DHT process": {"alive": False},
        "DHT read": {"last_read_ok": now - HEALTH_DHT_STALE_S - 60},
        "DHT write": {"last_write_ok": now - HEALTH_DHT_STALE_S - 60},
    }
    for reason, dht in cases.items():
        collector = NodeCollector({})
        collector.observe_swarm(_swarm_status(now, **dht))
        health = collector.health()
        assert health["status"] == "degraded" and reason in " ".join(health["reasons"]), (reason, health)
    lonely = NodeCollector({})
    lonely.observe_swarm(dataclasses.replace(_swarm_status(now), peers={}))
    assert "no peer" in " ".join(lonely.health()["reasons"])


def test_no_round_for_much_longer_than_the_last_one_took_is_degraded():
    collector = NodeCollector({})
    record = a_round_record(round=3, seconds_total=10.0)
    collector.observe_round(record)
    assert collector.health()["status"] == "ok"
    collector.observe_round(record, at=time.time() - HEALTH_MIN_ROUND_AGE_S - 1)
    assert "no round for" in collector.health()["reasons"][0]


def test_health_answers_503_and_metrics_say_degraded_when_the_dht_died():
    collector = NodeCollector({})
    collector.observe_swarm(_swarm_status(time.time(), alive=False))
    server = MetricsServer(collector, "127.0.0.1", 0)
    try:
        try:
            urllib.request.urlopen(server.url + "/health", timeout=5)
            raise AssertionError("a degraded node answered 200")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and json.loads(exc.read())["status"] == "degraded"
        samples = _samples(server)
        assert samples["swarmnode_health_ok"] == 0 and samples["swarmnode_dht_alive"] == 0
    finally:
        server.close()


def test_metrics_answer_while_an_idle_client_holds_a_connection_open():
    server = MetricsServer(NodeCollector({}), "127.0.0.1", 0)
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # connects, sends nothing
    try:
        t = time.monotonic()
        assert "swarmnode_rounds_total" in _samples(server)
        assert time.monotonic() - t < 2.0
    finally:
        idle.close()
        server.close()
