"""What the experiment scripts share beyond tests/helpers/ (node processes, machine info, run logs).

Scripts run as modules from the repository root (``python -m benchmarks.X``).
"""

from __future__ import annotations

import shutil
from pathlib import Path


def drop_checkpoints(run_dirs: list[Path]) -> None:
    """Delete the checkpoints of finished experiment runs, whose results are their metrics.jsonl: a
    SmolLM2-135M checkpoint is 1.6 GB, and one experiment of 32 node runs filled a disk with them."""
    freed = 0
    for run_dir in run_dirs:
        folder = run_dir / "checkpoints"
        if folder.is_dir():
            freed += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            shutil.rmtree(folder)
    if freed:
        print(f"removed {freed / 1e9:.1f} GB of checkpoints of finished runs", flush=True)
