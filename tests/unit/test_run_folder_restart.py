"""What a restart may change in a run folder: a folder whose start never completed a round holds no run
yet (a corrected retry just works), and the wrong-swarm hint's command works as printed."""

from __future__ import annotations

import json
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from swarmnode.config import load_config, parse_override
from swarmnode.errors import ConfigError
from swarmnode.run_folder import config_for_run, save_config
from swarmnode.runlog import METRICS_FILE
from swarmnode.swarm.exchange.announcer import lonely_line


def _started(run_dir: Path, rounds: int, **overrides) -> None:
    """A run folder as a start leaves it: its config saved, ``rounds`` rounds in the round log."""
    run_dir.mkdir()
    save_config(load_config(None, {"run.run_dir": str(run_dir), **overrides}), run_dir)
    lines = [json.dumps({"round": r}) + "\n" for r in range(1, rounds + 1)]
    (run_dir / METRICS_FILE).write_text("".join(lines))


def test_a_start_that_completed_no_round_does_not_lock_the_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _started(run_dir, rounds=0, **{"sampling.max_new_tokens": 8})
    retry = {"run.run_dir": str(run_dir), "sampling.max_new_tokens": 12}
    assert config_for_run(None, retry, restart=True).sampling.max_new_tokens == 12


def test_a_run_with_rounds_still_names_a_changed_field(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _started(run_dir, rounds=1, **{"sampling.max_new_tokens": 8})
    with pytest.raises(ConfigError, match="sampling.max_new_tokens"):
        config_for_run(None, {"run.run_dir": str(run_dir), "sampling.max_new_tokens": 12}, restart=True)


def test_the_wrong_swarm_hint_works_as_printed_on_a_run_with_rounds(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _started(run_dir, rounds=3)
    hint = lonely_line("swarmnode-local", 2, ["theirs"])
    words = shlex.split(hint.split("restart it with", 1)[1].split("(")[0])
    sets = dict(parse_override(value) for flag, value in pairwise(words) if flag == "--set")
    cfg = config_for_run(None, {"run.run_dir": str(run_dir), **sets}, restart=True)
    assert cfg.swarm.swarm_id == "theirs"
