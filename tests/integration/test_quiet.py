"""A node run with its output to a file, as under systemd or nohup: a line per phase of every round, and
no library warnings or loading bars; ``-v`` shows the libraries' output again."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.helpers.cli import COMMAND, TINY, node_env

NOISE = re.compile(r"Warning|it/s\]|█|\|#+")  # warnings, and tqdm bars as they look in a file


def _to_file(tmp_path: Path, name: str, *args: str) -> str:
    """Run the CLI with stdout and stderr going to a file (no terminal) and return what it wrote."""
    out = tmp_path / f"{name}.log"
    with out.open("w") as f:
        proc = subprocess.run(
            [*COMMAND, *args], cwd=tmp_path, stdout=f, stderr=subprocess.STDOUT, timeout=120, env=node_env()
        )
    text = out.read_text()
    assert proc.returncode == 0, text
    return text


def test_a_logged_run_says_each_phase_of_every_round_and_nothing_else(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    solo = _to_file(tmp_path, "solo", "solo", "--config", str(TINY), "--rounds", "3", "--run-dir", run_dir)
    for round_ in (1, 2, 3):
        for phase in ("sampling", "scoring", "training"):
            assert re.search(rf"^round {round_}: .*{phase}", solo, re.M), (round_, phase, solo)
    export = _to_file(tmp_path, "export", "export", "--run-dir", run_dir, "--out", str(tmp_path / "hf"))
    assert not NOISE.search(solo + export), solo + export
    verbose_args = ("-v", "export", "--run-dir", run_dir, "--out", str(tmp_path / "v"))
    verbose = _to_file(tmp_path, "verbose", *verbose_args)
    assert NOISE.search(verbose), verbose  # the libraries' own bars, as they print them
