"""The soak's open-file check: a steady leak is caught in a short window; a step or a spike is not.

The shapes: a floor that steps up by 3 in the node and its p2pd late in the window (a connection opened
late), a floor that spikes for one round (a sparsely sampled round whose samples all caught streams in
flight: +3 to +7, back the next round; one such moved a short soak's least-squares slope to 1.7 in CI),
against a leak of one descriptor a round in one process, which is what the check is for.
"""

from __future__ import annotations

import pytest

from benchmarks.reliability.soak import (
    KINDS,
    SERIES,
    NodeTrace,
    Sample,
    check,
    median_rise,
    per_round,
    trace_stats,
)

WINDOW = range(3, 10)  # rounds 3-9: the short soak's window (10 rounds, warm-up 2, cool-down 1)


def trace_of(fds_by_kind: dict[str, list[float]], *, noise: float = 4.0) -> NodeTrace:
    """Two samples a round: the floor, and one with streams in flight (which only the peak sees)."""
    trace = NodeTrace()
    for i, r in enumerate(WINDOW):
        floor = {f"fds_{k}": fds_by_kind[k][i] for k in KINDS}
        for extra in (0.0, noise):
            values = dict.fromkeys(SERIES, 0.0)
            values.update({name: v + extra for name, v in floor.items()})
            values["fds_total"] = sum(values[f"fds_{k}"] for k in KINDS)
            trace.samples.append(Sample(t=float(r), round=r - 1, values=values))
    return trace


def node_report(trace: NodeTrace) -> dict:
    """A healthy node's report line, with the trace's statistics as the soak computes them."""
    return {
        "run_dir": "/runs/node02", "exit_code": 0, "rounds": 10, "error_lines": [], "rejected": {},
        "over_deadline_rounds": 0, "rounds_exchanging": 7, "window_rounds": 7,
        **trace_stats(trace, WINDOW), "anon_total_slope": 0.0,
    }  # fmt: skip


def report_of(trace: NodeTrace) -> dict:
    return {"timed_out": False, "rounds": 10, "per_node": [node_report(trace)]}


LATE_STEP = {  # the CI shape: +3 in the node and its p2pd, +1 in the DHT process, late in the window
    "node": [40, 40, 40, 40, 41, 43, 43],
    "dht": [12, 12, 12, 12, 13, 13, 13],
    "p2pd": [15, 15, 15, 15, 15, 18, 18],
}


SPIKE = {  # one round's floor caught streams in flight
    "node": [18, 18, 18, 22, 18, 18, 18],
    "dht": [31, 31, 31, 32, 31, 31, 31],
    "p2pd": [18, 18, 18, 19, 18, 18, 17],
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_leak_of_one_descriptor_a_round_in_any_process_is_flagged(kind):
    fds = {k: [20.0] * len(WINDOW) for k in KINDS}
    fds[kind] = [20.0 + i + (1 if i == 3 else 0) for i in range(len(WINDOW))]  # a leak, one round jittery
    problems = check(report_of(trace_of(fds)), max_rss_slope_kib=16384.0, max_fds_rise=0.9)
    assert any(f"open files of {kind} rise" in p for p in problems), problems


@pytest.mark.parametrize("shape", [LATE_STEP, SPIKE], ids=["late step", "spike"])
def test_a_one_off_step_or_spike_passes_the_rise_check(shape):
    assert check(report_of(trace_of(shape)), max_rss_slope_kib=16384.0, max_fds_rise=0.9) == []


def test_a_late_connection_step_passes_the_rise_check_but_not_a_slope_check():
    report = report_of(trace_of(LATE_STEP))
    assert check(report, max_rss_slope_kib=16384.0, max_fds_rise=0.9) == []
    # what the short soak used to check: the least-squares slope of the total, which one step moves
    assert check(report, max_rss_slope_kib=16384.0, max_fds_slope=0.9) != []


def test_median_rise_reads_floors_and_allows_missing_rounds():
    assert median_rise({1: 10, 2: 11, 3: 12, 5: 14}, [1, 2, 3, 5]) == 1.0
    assert median_rise({1: 10, 2: 10, 3: 16, 4: 16}, [1, 2, 3, 4]) == 0.0
    assert median_rise({1: 10}, [1]) == 0.0
    floors = per_round(trace_of(LATE_STEP, noise=9.0), "fds_node")
    assert [floors[r] for r in WINDOW] == LATE_STEP["node"]  # the floor ignores streams in flight
