"""The cohort check of benchmarks.swarm_latency (benchmarks/harness/cohorts.py): a swarm that ran as two
halves, apart in time and each training on itself, is two cohorts on both counts; one swarm is one."""

from __future__ import annotations

from benchmarks.harness.cohorts import cohorts, time_cohorts, trained_components


def _node(peer: str, start: float, producers: list[str], rounds=(2, 3)) -> dict:
    return {
        "peer": peer,
        "publish": {r: {"started": start + 20.0 * r} for r in rounds},
        "metrics": {r: {"seconds_total": 20.0} for r in rounds},
        "trained": {(producer, r) for producer in producers for r in rounds},
    }


def test_a_gap_longer_than_a_round_splits_the_starts():
    assert time_cohorts([0.0, 1.0, 12.5, 19.0], round_s=20.0) == 1
    assert time_cohorts([0.0, 1.0, 22.0, 23.0], round_s=20.0) == 2
    assert time_cohorts([], round_s=20.0) == 0


def test_components_ignore_direction_and_strangers():
    peers = ["a", "b", "c", "d"]
    assert trained_components(peers, {"a": {"b"}, "c": {"b"}, "d": {"c", "stranger"}}) == 1
    assert trained_components(peers, {"a": {"b"}, "c": {"d"}}) == 2
    assert trained_components(peers, {}) == 4


def test_two_halves_are_two_cohorts_and_one_swarm_is_one():
    halves = [
        _node("a", 0.0, ["b"]),
        _node("b", 0.5, ["a"]),
        _node("c", 21.0, ["d"]),
        _node("d", 21.5, ["c"]),
    ]
    assert cohorts(halves, 2, 3) == {"time_cohorts": 2, "trained_components": 2}
    one = [
        _node("a", 0.0, ["b", "c"]),
        _node("b", 0.5, ["d"]),
        _node("c", 1.0, ["d"]),
        _node("d", 1.5, ["a"]),
    ]
    assert cohorts(one, 2, 3) == {"time_cohorts": 1, "trained_components": 1}


def test_groups_trained_outside_the_statistics_rounds_do_not_join_cohorts():
    late = [_node("a", 0.0, []), _node("b", 0.5, [])]
    late[0]["trained"] = {("b", 9)}
    assert cohorts(late, 2, 3)["trained_components"] == 2
