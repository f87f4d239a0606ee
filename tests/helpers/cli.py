"""Running the real ``swarmnode`` command in tests: one compute thread, unbuffered, bounded in time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.harness.processes import REPO, node_env

TINY = REPO / "node_configs" / "tiny.yaml"
_SCRIPT = Path(sys.executable).with_name("swarmnode")
COMMAND = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "swarmnode.cli"]


def swarmnode(*args: str, cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion (subprocess.run kills only its own child if the timeout passes)."""
    return subprocess.run(
        [*COMMAND, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=node_env()
    )


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
