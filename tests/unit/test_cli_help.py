"""`swarmnode ... --help` as a user reads it, from a subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _help(*command: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _option_line(text: str, option: str) -> str:
    [line] = [line for line in text.splitlines() if option in line.split()]
    return line


def test_status_help_shows_flags_without_a_value():
    text = _help("status")
    assert "<bool>" not in text, text
    watch = _option_line(text, "--watch")
    assert watch.split()[:2] == ["-w,", "--watch"] and watch.split()[2] == "Refresh", watch
    assert _option_line(text, "--help").split()[:2] == ["--help", "Show"], text
    assert "--set FIELD=VALUE" in text, text


@pytest.mark.parametrize("command", ["solo", "join", "bootstrap", "keygen", "eval"])
def test_no_command_shows_a_value_for_a_flag(command):
    assert "<bool>" not in _help(command)


def test_top_level_help_lists_each_command_in_full():
    """click cuts a command's summary to the width left beside its name and adds '...'; the listing is
    the whole first paragraph of each command's docstring instead."""
    listing = " ".join(_help().split("Commands:")[1].split())
    assert "..." not in listing, listing
    assert "Run a node in silo mode: the full RL loop, no network (default: the embedded SmolLM2)." in listing
    assert "mint its proof of work (kept beside it as KEY.work) and print its peer id." in listing
