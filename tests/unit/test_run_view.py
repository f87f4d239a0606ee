"""The run-folder reader behind `status` and the status page is bounded: whoever reaches the metrics port
may ask for the page as often as they like, and a run folder grows every round for months."""

from __future__ import annotations

import json
import math
import os
import time
import tracemalloc

import pytest

from swarmnode import run_view
from swarmnode.errors import StatusError
from swarmnode.run_view import MAX_ROUNDS, MAX_TAIL_BYTES, RunFolderReader, read_run
from tests.helpers.run_folders import (
    HELPER,
    nated_node,
    peer_group,
    round_record,
    status_json,
    write_run_folder,
)

LONG_RUN_ROUNDS = 20_000  # 6 MiB of metrics.jsonl; with 4 groups a round, 20 MiB of peer_groups.jsonl
MAX_PEAK_BYTES = 8 * MAX_TAIL_BYTES  # what one look may allocate, whatever the files' sizes


def test_a_long_run_is_read_from_the_tail_within_the_byte_bound(tmp_path):
    rounds = [round_record(r) for r in range(1, LONG_RUN_ROUNDS + 1)]
    groups = [peer_group(r, HELPER) for r in range(1, LONG_RUN_ROUNDS + 1) for _ in range(4)]
    folder = write_run_folder(tmp_path, rounds, status_json(), groups)
    assert (folder / "metrics.jsonl").stat().st_size > 4 * MAX_TAIL_BYTES
    tracemalloc.start()
    started = time.process_time()
    view = read_run(folder)
    cpu_s, (_, peak) = time.process_time() - started, tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert cpu_s < 1.0 and peak < MAX_PEAK_BYTES, (cpu_s, peak)
    assert [r["round"] for r in view.rounds] == list(
        range(LONG_RUN_ROUNDS - MAX_ROUNDS + 1, LONG_RUN_ROUNDS + 1)
    )
    assert view.rounds_cut and view.helpers_from_round > LONG_RUN_ROUNDS - 10_000
    helper = next(row for row in view.peers if row.peer == HELPER)
    assert helper.last_trained_round == LONG_RUN_ROUNDS


def test_an_oversized_status_json_is_refused_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(run_view, "MAX_STATUS_BYTES", 4096)
    status = status_json(peers={f"12D3KooW{i}": {"model": "m" * 100} for i in range(100)})
    folder = write_run_folder(tmp_path, [round_record(1)], status)
    with pytest.raises(StatusError, match="over"):
        read_run(folder)


def test_the_reader_reads_again_only_when_a_file_changed(tmp_path):
    folder = nated_node(tmp_path)
    reader = RunFolderReader(folder)
    first = reader.read()
    for _ in range(50):
        assert reader.read() is first
    assert reader.reads == 1
    with (folder / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(round_record(9)) + "\n")
    assert reader.read().rounds[-1]["round"] == 9 and reader.reads == 2
    status = folder / "status.json"
    os.utime(status, ns=(status.stat().st_atime_ns, status.stat().st_mtime_ns + 1_000_000))
    reader.read()
    assert reader.reads == 3


def test_peer_strings_are_made_printable_and_numbers_that_json_lacks_become_none(tmp_path):
    hostile = "tiny\x9b2J\u202egnp.exe</script>" + "\u202e" * 500
    status = status_json(peers={"12D3KooW\u202epeer": {"model": hostile, "round": 3, "seen_s_ago": 1.0}})
    rounds = [round_record(1), {**round_record(2), "reward_mean": math.nan}]
    folder = write_run_folder(tmp_path, rounds, status, [peer_group(2, "12D3KooW\u202epeer", hostile)])
    view = read_run(folder)
    (row,) = view.peers
    assert row.peer == "12D3KooW\\u202epeer" and row.groups_trained == 1  # the same id in both files
    assert row.model.startswith("tiny\\x9b2J\\u202egnp.exe</script>") and len(row.model) <= 128
    assert view.rounds[1]["reward_mean"] is None
    json.dumps(view.as_dict(), allow_nan=False)  # what the page's JSON takes


def test_a_folder_with_nothing_written_says_where_it_looked(tmp_path):
    with pytest.raises(StatusError, match="no metrics.jsonl or status.json"):
        read_run(tmp_path)
