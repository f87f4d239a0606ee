"""`run.tensorboard: true`: TensorBoard event files with the same per-round scalars as metrics.jsonl."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.harness.processes import node_env
from swarmnode.tensorboard import TENSORBOARD_DIR, TensorBoardLog, scalars

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "node_configs" / "tiny.yaml"
# the scalars people look for first, all of them in metrics.jsonl
KEY_SCALARS = ("reward_mean", "task_score_mean", "format_rate", "train_loss", "train_kl",
               "seconds_sample", "seconds_train", "groups_kept", "groups_total",
               "reward_by_task/propositional_logic")  # fmt: skip
ENV = node_env()


def _events(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every scalar, as TensorBoard reads the folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _without_tensorboard(run_dir: Path) -> str:
    """Python code that runs a one-round solo node with tensorboard on, as if the package were missing."""
    return textwrap.dedent(
        f"""
        import sys
        sys.modules["torch.utils.tensorboard"] = None  # as if tensorboard were not installed
        from swarmnode.cli import app
        app(["solo", "--config", {str(TINY)!r}, "--rounds", "1", "--run-dir", {str(run_dir)!r},
             "--set", "run.tensorboard=true", "--set", "run.metrics_port=null"], prog_name="swarmnode")
        """
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """This module's two node processes, started together (each is mostly start-up), by name: "with"
    (two rounds writing event files; only where tensorboard is installed) and "without" (the package
    hidden); each with its run folder and how it ended."""
    root = tmp_path_factory.mktemp("tensorboard")
    commands = {"without": [sys.executable, "-c", _without_tensorboard(root / "without")]}
    if importlib.util.find_spec("tensorboard") is not None:
        commands["with"] = [
            sys.executable, "-m", "swarmnode.cli", "solo", "--config", str(TINY), "--rounds", "2",
            "--run-dir", str(root / "with"), "--set", "run.tensorboard=true",
            "--set", "run.metrics_port=null",
        ]  # fmt: skip
    procs = {}
    for name, cmd in commands.items():  # output to files: neither can block on a pipe nobody reads yet
        with open(root / f"{name}.out", "w") as out, open(root / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=out, stderr=err, text=True)
    try:
        done = {}
        for name, proc in procs.items():
            proc.wait(timeout=600)
            out, err = ((root / f"{name}.{kind}").read_text() for kind in ("out", "err"))
            done[name] = (root / name, subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return done
    finally:
        for proc in procs.values():  # only the ones started here, by their own handle
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_solo_run_writes_the_scalars_of_metrics_jsonl(runs):
    pytest.importorskip("tensorboard")
    run_dir, proc = runs["with"]
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for tag, value in scalars(record).items():
            if tag != "round":
                expected.setdefault(tag, []).append((record["round"], value))
    assert set(KEY_SCALARS) <= set(expected)
    events = _events(run_dir / TENSORBOARD_DIR)
    assert set(events) == set(expected)
    for tag, points in expected.items():  # event files store float32
        assert [step for step, _ in events[tag]] == [step for step, _ in points], tag
        assert [v for _, v in events[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), tag


def test_a_restart_hides_the_rounds_metrics_jsonl_dropped(tmp_path):
    """A node restarted from the checkpoint of round 2 writes round 3 again: TensorBoard shows the new one."""
    pytest.importorskip("tensorboard")
    first = TensorBoardLog(tmp_path)
    for round_ in (1, 2, 3):
        first.append({"round": round_, "reward_mean": float(round_)})
    first.close()
    second = TensorBoardLog(tmp_path)
    for round_, value in ((3, 30.0), (4, 40.0)):
        second.append({"round": round_, "reward_mean": value})
    second.close()
    assert _events(tmp_path / TENSORBOARD_DIR)["reward_mean"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_without_the_package_the_node_says_what_to_install_and_leaves_nothing(runs):
    run_dir, proc = runs["without"]
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: run.tensorboard is true but the tensorboard package is not installed: "
        "pip install 'swarmnode[tensorboard]' (or set run.tensorboard=false)"
    ]
    assert not run_dir.exists()
