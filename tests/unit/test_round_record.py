"""A round's record: its metrics.jsonl keys are a published contract (users parse them), the Prometheus
gauges and the console line read the same numbers, and the record types are frozen."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, astuple
from operator import attrgetter

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from swarmnode.learn.offpolicy import correction_for
from swarmnode.metrics import ROUND_GAUGES, NodeCollector
from swarmnode.runlog import round_line
from swarmnode.swarm.exchange.records import PeerRoundCounts
from tests.helpers.round_records import RECORD, STEP, a_round_record

# the keys of a round's metrics.jsonl line, in the order they are written: renaming one breaks its readers
METRICS_JSONL_KEYS = (
    "round", "policy_version", "reward_mean", "task_score_mean", "reward_peer_mean", "format_rate",
    "reward_by_task", "groups_total", "groups_local", "groups_peer", "groups_replayed",
    "replay_dropped_stale", "reincarnated", "groups_kept", "sampled_tokens", "sample_tokens_per_s",
    "seconds_sample", "seconds_score", "seconds_share", "seconds_train", "seconds_sync", "seconds_total",
    "train_sequences", "train_tokens", "train_loss", "train_kl", "train_clip_low_frac",
    "train_clip_high_frac", "train_grad_norm", "train_masked_frac", "train_peer_gated_frac",
    "train_is_weight_mean", "train_is_weight_max", "train_ess", "train_behaviour_kl", "train_lr_scale",
    "train_seconds", "train_tokens_per_s",
)  # fmt: skip
# ... and on a swarm node, after them
PEER_KEYS = ("peer_batches_received", "peer_groups_accepted", "peer_groups_trained", "peer_rejected",
             "peer_fetch_failures", "peer_notices_sent", "peer_notices_received", "peer_pulls",
             "peer_bytes_in", "peer_bytes_out")  # fmt: skip


def test_the_metrics_jsonl_keys_are_the_documented_ones_in_order():
    assert tuple(RECORD.as_dict()) == METRICS_JSONL_KEYS
    counts = PeerRoundCounts(3, 8, 2, {"bad_signature": 1}, {"timeout": 2})
    assert tuple(a_round_record(peer=counts).as_dict()) == METRICS_JSONL_KEYS + PEER_KEYS


def test_the_line_holds_the_fields_the_update_and_the_peer_counts():
    counts = PeerRoundCounts(3, 8, 2, {"bad_signature": 1}, {"timeout": 2})
    line = a_round_record(peer=counts).as_dict()
    assert line["round"] == 7 and line["reward_by_task"] == RECORD.reward_by_task
    assert {k.removeprefix("train_"): v for k, v in line.items() if k.startswith("train_")} == STEP.as_dict()
    assert {k: line[k] for k in PEER_KEYS} == counts.as_dict()
    assert json.loads(json.dumps(line)) == line  # plain JSON: what metrics.jsonl and TensorBoard get
    line["reward_by_task"]["basic_arithmetic"] = 0.0  # the dict is the caller's, not the record's
    assert RECORD.reward_by_task["basic_arithmetic"] == 0.5


def test_the_round_line_reads_the_record():
    assert round_line(RECORD) == (
        "round    7  reward 0.625  format 75%  groups 4/5  sample 160 tok/s  "
        "step 8.5s (sample 4.0 / train 2.5)"
    )


def test_each_prometheus_gauge_is_the_number_of_its_metrics_jsonl_key():
    collector = NodeCollector({})
    collector.observe_round(RECORD)
    registry = CollectorRegistry()
    registry.register(collector)
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if not s.labels
    }
    line = RECORD.as_dict()
    assert samples["swarmnode_round"] == 7
    for attribute, (name, _) in ROUND_GAUGES.items():
        assert samples[name] == attrgetter(attribute)(RECORD) == line[attribute.replace(".", "_")], name


def test_the_records_are_frozen():
    ones = torch.ones(1, 2, dtype=torch.bool)
    stats = correction_for("tis", old_logp=torch.zeros(1, 2), behaviour_logp=torch.zeros(1, 2),
                           has_behaviour=ones, mask=ones).stats  # fmt: skip
    assert astuple(stats)[:2] == (2.0, 2.0)
    for record, field in ((RECORD, "round"), (STEP, "loss"), (stats, "ess")):
        with pytest.raises(FrozenInstanceError):
            setattr(record, field, 0)
