"""The arms of the SAPO table and #28's experiments: silo with any group count, E2's silo-matched control
(its settings the ones E2's summaries call for), and specialists whose per-node task weights reach the node
as one whole mix, the same fingerprint on every node."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.sharing import matching
from benchmarks.sharing.arms import (
    MATCHED_MAX_GROUPS,
    MATCHED_QUESTIONS,
    TaskSplit,
    build_arms,
    parse_split,
    select_arms,
    silo_name,
    specialist_arms,
)
from benchmarks.sharing.experiments import by_arm
from benchmarks.sharing.report import load_experiment
from swarmnode.config import load_config, parse_override

EASY = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"]}
SPLIT = TaskSplit(
    "basic_arithmetic", "propositional_logic", {"basic_arithmetic": EASY, "propositional_logic": {}}
)


def node_config(arm_sets: list[str]):
    """The config a node of the arm would load: tiny.yaml (three tasks of its own) under the arm's sets."""
    return load_config("node_configs/tiny.yaml", dict(parse_override(s) for s in arm_sets))


def test_silo_takes_any_group_count_and_the_plain_name_keeps_its_meaning():
    arms = build_arms(4, ["2/2"], replay_groups=2)
    silo4, silo2, silo8, plain = select_arms(["silo-4", "silo-2", "silo-8", "silo"], arms)
    assert [(a.name, a.local, a.peer, a.swarm) for a in (silo4, silo2, silo8)] == [
        ("silo-4", 4, 0, False), ("silo-2", 2, 0, False), ("silo-8", 8, 0, False)
    ]  # fmt: skip
    assert (plain.name, plain.local, plain.peer) == ("silo", 4, 0)
    assert (
        silo_name("silo", 4) == "silo-4"
        and silo_name("silo-2", 2) == "silo-2"
        and silo_name("2/2", 2) == "2/2"
    )


def test_silo_matched_samples_more_questions_than_it_trains_on_and_is_made_on_request():
    arms = build_arms(4, ["2/2"], replay_groups=2)
    assert "silo-matched" not in [a.name for a in arms]  # not in a default run of every arm
    (arm,) = select_arms(["silo-matched"], arms)
    assert (arm.name, arm.table, arm.peer, arm.swarm) == ("silo-matched", "sharing", 0, False)
    # what sapo_table hands every node of the arm: its question count and its sets
    cfg = node_config([f"sampling.questions_per_round={arm.local}", *arm.node_sets(0, 4)])
    assert (cfg.sampling.questions_per_round, cfg.train.max_groups) == (7, 4)
    assert arm.what == "7 local groups, at most 4 informative ones trained"


def test_silo_matched_is_the_question_count_nearest_2_2s_groups_kept_in_e2s_summaries():
    """The model behind the choice, on the committed summaries (docs/sharing/e2): 2/2 kept 2.93 groups a
    round; under a cap of 4, 7 questions keep an expected 2.83; a cap of 3 needs about twice the questions."""
    root = Path(__file__).resolve().parents[2] / "docs" / "sharing"
    arms = by_arm(load_experiment("e2", root))
    assert matching.nearest_count(arms, MATCHED_MAX_GROUPS, 40) == MATCHED_QUESTIONS
    shares, rho = matching.informative_share(arms, 40), matching.overdispersion(arms, 40)
    assert matching.expected_kept(shares, MATCHED_QUESTIONS, MATCHED_MAX_GROUPS, rho) == pytest.approx(
        2.83, abs=0.01
    )
    assert matching.expected_kept(shares, 8, 3, rho) < 2.6  # 8 questions under a cap of 3 keep too few


def test_an_unknown_arm_is_refused_with_the_choices_and_the_specialist_hint():
    with pytest.raises(ValueError, match=r"'silo-0'.*silo-L \(any L\).*--specialise A B"):
        select_arms(["silo-0"], build_arms(4, ["2/2"], 2))
    with pytest.raises(ValueError, match="spec-silo"):
        select_arms(["spec-silo"], build_arms(4, ["2/2"], 2))
    with pytest.raises(ValueError, match="L \\+ E = --groups"):
        build_arms(4, ["2/1"], 2)


def test_specialists_sample_one_task_each_half_and_the_generalist_both():
    spec_silo, spec_swarm, generalist = specialist_arms(4, SPLIT)
    assert [(a.name, a.local, a.peer) for a in (spec_silo, spec_swarm, generalist)] == [
        ("spec-silo", 4, 0), ("spec-2/2", 2, 2), ("generalist-silo", 4, 0)
    ]  # fmt: skip
    for arm in (spec_silo, spec_swarm):
        weights = [
            {n: s.weight for n, s in node_config(arm.node_sets(i, 4)).tasks.mix.items()} for i in range(4)
        ]
        a_only, b_only = (
            {"basic_arithmetic": 1.0, "propositional_logic": 0.0},
            {"basic_arithmetic": 0.0, "propositional_logic": 1.0},
        )
        assert weights == [a_only, a_only, b_only, b_only]
    mix = node_config(generalist.node_sets(3, 4)).tasks.mix
    assert {n: s.weight for n, s in mix.items()} == {"basic_arithmetic": 1.0, "propositional_logic": 1.0}


def test_the_override_replaces_the_whole_mix_and_every_node_keeps_one_fingerprint():
    from swarmnode.tasks import TaskBank

    spec_swarm = specialist_arms(4, SPLIT)[1]
    configs = [node_config(spec_swarm.node_sets(i, 4)) for i in range(4)]
    for cfg in configs:  # tiny.yaml's own propositional_logic weight 3 and basic_arithmetic config are gone
        assert sorted(cfg.tasks.mix) == ["basic_arithmetic", "propositional_logic"]
        assert (
            cfg.tasks.mix["basic_arithmetic"].config == EASY
            and cfg.tasks.mix["propositional_logic"].config == {}
        )
    banks = [TaskBank(cfg.tasks) for cfg in configs]
    assert len({bank.fingerprint for bank in banks}) == 1
    assert {ref.dataset for ref in banks[0].draw(0, 16)} == {"basic_arithmetic"}  # weight 0: never drawn
    assert {ref.dataset for ref in banks[3].draw(0, 16)} == {"propositional_logic"}


def test_the_split_takes_configs_from_the_base_mix_or_inline_yaml():
    split = parse_split(["basic_arithmetic", "propositional_logic={max_vars: 2}"], {"basic_arithmetic": EASY})
    assert (split.a, split.b) == ("basic_arithmetic", "propositional_logic")
    assert split.configs == {"basic_arithmetic": EASY, "propositional_logic": {"max_vars": 2}}
    assert parse_split(["bf", "arc_1d"], {}).configs == {"bf": {}, "arc_1d": {}}  # the dataset's defaults
    with pytest.raises(ValueError, match="YAML mapping"):
        parse_split(["bf=3", "arc_1d"], {})
    with pytest.raises(ValueError, match="two different tasks"):
        parse_split(["bf", "bf={}"], {})
