"""A run folder that does not exist is an error for the commands that read one (issue #30: `eval
--run-dir runs/nope` evaluated the untrained base model for minutes; `config show --run-dir runs/nope`
printed the defaults with exit 0). The real CLI, in a subprocess; the error comes before any model
loads, within seconds, and names the run folders that do exist."""

from __future__ import annotations

import time

import pytest

from tests.helpers.cli import TINY, swarmnode

LIMIT_S = 30.0  # the CLI's imports on a loaded 2-core machine; no model is loaded on this path


@pytest.mark.parametrize(
    "command",
    [["eval"], ["export", "--out", "exported"], ["config", "show"]],
    ids=["eval", "export", "config-show"],
)
def test_a_run_folder_that_does_not_exist_is_a_one_line_error(tmp_path, command):
    (tmp_path / "runs" / "real").mkdir(parents=True)
    (tmp_path / "runs" / "real" / "config.yaml").write_text("{}\n")
    started = time.monotonic()
    result = swarmnode(*command, "--config", str(TINY), "--run-dir", "runs/nope", cwd=tmp_path)
    assert result.returncode != 0, result.stdout + result.stderr
    assert time.monotonic() - started < LIMIT_S
    assert "runs/nope does not exist" in result.stderr and "real" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "exported").exists()


def test_config_show_without_a_run_folder_still_prints_the_defaults(tmp_path):
    result = swarmnode("config", "show", cwd=tmp_path)
    assert result.returncode == 0 and "swarm_id" in result.stdout, result.stderr
