"""What the experiment scripts share among themselves: run bookkeeping and clean-up. What they share with
the tests (starting nodes, reading their logs, the soak and chaos drivers, the report statistics) is in
``benchmarks.harness`` and the study sub-packages; machine info is ``benchmarks.machine``.

Scripts run as modules from the repository root (``python -m benchmarks.X``) and never import ``tests``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.harness.processes import NodeProc


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


@contextlib.contextmanager
def one_at_a_time(lock: Path, what: str, limit_s: float, poll_s: float = 5.0) -> Iterator[None]:
    """Run the block while holding ``lock`` (an flock, so it goes with the process), after any other
    process's block under the same lock: two checkpoint evaluations at once on 2 cores spent 32
    CPU-minutes contending without finishing a checkpoint that one alone scores in 2.5-4 min. The wait ends
    at ``limit_s``; then the block runs anyway, since a late result beats a lost one."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        deadline = time.monotonic() + limit_s
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    print(
                        f"{what}: waited {limit_s:g} s for {lock}; going on beside its holder",
                        file=sys.stderr,
                    )
                    break
                if not told:
                    print(f"{what}: waiting for the process holding {lock}", file=sys.stderr, flush=True)
                    told = True
                time.sleep(min(poll_s, left))
        yield


@contextlib.contextmanager
def behind_other_sessions(autogroup: Path = Path("/proc/self/autogroup")) -> Iterator[None]:
    """Run the block with this session's scheduler group at nice 19, so that a learning part training
    beside it (another ``setsid`` session) keeps the cores: the kernel gives each session's autogroup an
    equal share whatever its processes' nice values, so ``renice`` does nothing across sessions. Only a
    process that leads its own session does this, so a user's terminal session is never lowered."""
    try:
        leads = os.getsid(0) == os.getpid()
        before = autogroup.read_text().split("nice")[-1].strip() if leads else None
        if before is not None:
            autogroup.write_text("19")
    except OSError:  # no autogroups in this kernel
        before = None
    try:
        yield
    finally:
        if before is not None:
            with contextlib.suppress(OSError):
                autogroup.write_text(before)


def wait_all(
    nodes: list[NodeProc], limit: float, progress: Callable[[], str] | None = None, every_s: float = 300.0
) -> bool:
    """Wait for every node to exit by the monotonic time ``limit``; True if one was still running. A
    learning part runs ~30 min: ``progress()`` is printed every ``every_s`` seconds meanwhile."""
    next_report = time.monotonic() + every_s
    for node in nodes:
        while node.proc.poll() is None:
            now = time.monotonic()
            if now >= limit:
                return True
            if progress is not None and now >= next_report:
                print(progress(), file=sys.stderr, flush=True)
                next_report += every_s
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=max(min(limit, next_report) - now, 0.1))
    return False


def record_exit(info: dict, nodes: list[NodeProc], t0: float) -> None:
    """Exit codes, wall time since the monotonic ``t0`` and the load, into a run's ``info``."""
    info["exit_codes"] = [node.proc.returncode for node in nodes]
    info["wall_s"] = round(time.monotonic() - t0, 1)
    info["load_after"] = os.getloadavg()
