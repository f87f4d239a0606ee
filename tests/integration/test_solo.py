"""The solo node end to end: the real `swarmnode` command on the tiny model and real reasoning-gym tasks.

Every run uses node_configs/tiny.yaml with a fixed question stream (``tasks.seed``), so runs in different
folders see the same questions and can be compared round for round. Children are ended only through
their own pid, and every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from swarmnode import checkpoint
from tests.helpers.cli import COMMAND, REPO, TINY, metrics, node_env, swarmnode

# Reward variance (so real AdamW steps) from round 1 on: the untrained tiny model's round-1 answers all
# score 0 with 4 x 4 completions since propositional_logic stopped paying for restated premises and
# tautologies (#13); 8 questions x 8 completions give informative groups in rounds 1 and 2 (seeds 1-5).
SOLO = ["solo", "--config", str(TINY), "--set", "tasks.seed=5", "--set", "sampling.questions_per_round=8",
        "--set", "sampling.completions_per_question=8"]  # fmt: skip

ROUND_LINE = re.compile(
    r"^round\s+(\d+)\s+reward \d+\.\d{3}\s+format \d+%\s+groups \d+/\d+\s+sample \d+ tok/s"
)
RESUMED = re.compile(r"^resumed from (\S+) at round (\d+) \(state digest ([0-9a-f]{64})\)$", re.MULTILINE)
# Per-round fields that do not depend on timing: equal in two runs of the same rounds.
DETERMINISTIC = ("policy_version", "reward_mean", "task_score_mean", "format_rate", "reward_by_task",
                 "groups_kept", "sampled_tokens", "train_sequences", "train_tokens", "train_loss",
                 "train_grad_norm")  # fmt: skip


def rounds_of(run_dir: Path) -> list[int]:
    return [r["round"] for r in metrics(run_dir)]


def checkpoint_names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def manifest_digest(ckpt: Path) -> str:
    return json.loads((ckpt / "manifest.json").read_text())["digest"]


def same_rounds(a: list[dict], b: list[dict]) -> None:
    for ra, rb in zip(a, b, strict=True):
        assert {k: ra[k] for k in DETERMINISTIC} == {k: rb[k] for k in DETERMINISTIC}, f"round {ra['round']}"


@dataclass
class Run:
    dir: Path
    proc: subprocess.CompletedProcess[str]
    seconds: float


@pytest.fixture(scope="module")
def three_rounds(tmp_path_factory) -> Run:
    """An uninterrupted 3-round run; later tests compare against it and must not modify it."""
    cwd = tmp_path_factory.mktemp("solo")
    run_dir = cwd / "run"
    start = time.monotonic()
    proc = swarmnode(*SOLO, "--rounds", "3", "--run-dir", str(run_dir), cwd=cwd)
    return Run(run_dir, proc, time.monotonic() - start)


def test_three_rounds_leave_checkpoints_metrics_and_one_line_per_round(three_rounds: Run) -> None:
    run, proc = three_rounds, three_rounds.proc
    assert proc.returncode == 0, proc.stderr
    assert run.seconds < 60
    assert "Traceback" not in proc.stderr

    assert checkpoint_names(run.dir) == ["round-000001", "round-000002", "round-000003"]
    for n in (1, 2, 3):
        info = checkpoint.validate(run.dir / "checkpoints" / f"round-{n:06d}")
        assert (info.round, info.policy_version) == (n, metrics(run.dir)[n - 1]["policy_version"])

    records = metrics(run.dir)
    assert [r["round"] for r in records] == [1, 2, 3]
    for r in records:
        assert 0 <= r["reward_mean"] <= 1.1 and 0 <= r["format_rate"] <= 1
        assert r["sample_tokens_per_s"] > 0 and r["sampled_tokens"] > 0
        assert r["seconds_total"] >= r["seconds_sample"] + r["seconds_train"] > 0
        assert set(r["reward_by_task"]) <= {"propositional_logic", "basic_arithmetic"}
        assert r["groups_local"] == r["groups_total"] == 8 and r["groups_peer"] == 0
    assert sum(r["train_sequences"] for r in records) > 0  # the tiny config really trains

    lines = proc.stderr.splitlines()
    round_lines = [int(m.group(1)) for line in lines if (m := ROUND_LINE.match(line))]
    assert round_lines == [1, 2, 3], proc.stderr
    # stderr is not a terminal: no progress-bar frames mixed into the log
    assert "\r" not in proc.stderr and not any("round/s" in line for line in lines), proc.stderr
    assert [line for line in lines if line.startswith("checkpoint ")] == [
        f"checkpoint {run.dir / 'checkpoints' / f'round-{n:06d}'}" for n in (1, 2, 3)
    ]


@dataclass
class Resumed:
    dir: Path
    before_kill: list[dict]  # metrics.jsonl when the node was killed
    newest: checkpoint.CheckpointInfo  # newest valid checkpoint after the kill
    newest_manifest: dict  # its manifest.json (pruned by the restart)
    restart: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory) -> Resumed:
    """A 20-round run SIGKILLed once 2 rounds are logged, then restarted in the same folder up to round 3."""
    cwd = tmp_path_factory.mktemp("resume")
    run_dir = cwd / "run"
    args = [*SOLO, "--set", "run.checkpoint_every=1", "--run-dir", str(run_dir)]
    with (cwd / "killed.stderr").open("w+") as err:
        proc = subprocess.Popen(
            [*COMMAND, *args, "--rounds", "20"],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=node_env(),
        )
        try:
            deadline = time.monotonic() + 90
            log = run_dir / "metrics.jsonl"
            while not log.exists() or log.read_text().count("\n") < 2:  # complete lines only
                if proc.poll() is not None:
                    err.seek(0)
                    pytest.fail(f"node exited with {proc.returncode} before round 2:\n{err.read()}")
                if time.monotonic() > deadline:
                    pytest.fail("no second round within 90 s")
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    before_kill = metrics(run_dir)
    newest = checkpoint.newest_valid(run_dir / "checkpoints", log=lambda _: None)
    assert newest is not None
    manifest = json.loads((newest.path / "manifest.json").read_text())
    restart = swarmnode(*args, "--rounds", "3", cwd=cwd)
    return Resumed(run_dir, before_kill, newest, manifest, restart)


def test_sigkill_then_restart_resumes_from_the_exact_saved_state(killed_and_resumed: Resumed) -> None:
    r = killed_and_resumed
    # Killed while checkpointing round 2 or during round 3: the newest valid checkpoint is the last or
    # the second-last logged round, and the restart has rounds to redo.
    logged = [x["round"] for x in r.before_kill]
    assert len(logged) >= 2 and logged == list(range(1, len(logged) + 1))
    assert r.newest.round in (logged[-1], logged[-1] - 1) and r.newest.round < 3
    # The state at the checkpoint is non-trivial: AdamW has taken real steps (moments saved too).
    assert sum(x["train_sequences"] for x in r.before_kill[: r.newest.round]) > 0
    assert r.newest.policy_version > 0

    assert r.restart.returncode == 0, r.restart.stderr
    resumed = RESUMED.findall(r.restart.stderr)
    assert len(resumed) == 1, r.restart.stderr
    path, k, digest = resumed[0]
    # The digest the restarted node computes from its restored weights + optimizer equals the one the
    # killed node computed from its in-memory state when it saved that checkpoint.
    assert (Path(path), int(k)) == (r.newest.path, r.newest.round)
    assert digest == r.newest_manifest["digest"]

    # Rounds after the checkpoint were lost and re-run, never duplicated.
    assert rounds_of(r.dir) == [1, 2, 3]
    round_lines = [int(m.group(1)) for line in r.restart.stderr.splitlines() if (m := ROUND_LINE.match(line))]
    assert round_lines == list(range(r.newest.round + 1, 4))
    assert checkpoint.newest_valid(r.dir / "checkpoints").round == 3
    assert not list((r.dir / "checkpoints").glob(".tmp-*"))  # a save cut by the kill left no debris


def test_a_killed_and_resumed_run_matches_an_uninterrupted_one(
    killed_and_resumed: Resumed, three_rounds: Run
) -> None:
    """Same questions (tasks.seed), per-round sampling seeds, restored optimizer: bit-identical training."""
    assert three_rounds.proc.returncode == 0
    assert killed_and_resumed.newest.round < 3  # round 3 ran in the restarted process
    same_rounds(metrics(killed_and_resumed.dir), metrics(three_rounds.dir))
    a = manifest_digest(three_rounds.dir / "checkpoints" / "round-000003")
    b = manifest_digest(killed_and_resumed.dir / "checkpoints" / "round-000003")
    assert a == b


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_previous_one_used(
    three_rounds: Run, tmp_path
) -> None:
    assert three_rounds.proc.returncode == 0
    run_dir = tmp_path / "run"
    shutil.copytree(three_rounds.dir, run_dir)
    newest = run_dir / "checkpoints" / "round-000003"
    original_digest = manifest_digest(newest)
    weights = newest / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)

    proc = swarmnode(*SOLO, "--rounds", "3", "--run-dir", str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    corrupt = "model.safetensors does not match its checksum (corrupt or truncated)"
    assert f"skipping checkpoint {newest}: {corrupt}" in lines
    resumed = [(Path(p), int(k)) for p, k, _ in RESUMED.findall(proc.stderr)]
    assert resumed == [(run_dir / "checkpoints" / "round-000002", 2)]
    assert "rounds 3-3 ran after that checkpoint and will run again" in lines
    assert rounds_of(run_dir) == [1, 2, 3]
    # Round 3 re-ran from checkpoint 2 and reproduced the lost checkpoint exactly.
    assert checkpoint.validate(newest).digest == original_digest
    same_rounds(metrics(run_dir), metrics(three_rounds.dir))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], list[str], bool]]:
    """name -> (CLI arguments, words the error line must contain, fails before touching the run dir)."""
    malformed = _write(tmp / "malformed.yaml", "train:\n  lr: [1e-3,\n")
    negative = _write(tmp / "negative.yaml", TINY.read_text().replace("lr: 1.0e-3", "lr: -1"))
    return {
        "malformed yaml": (["--config", str(malformed)], [str(malformed), "malformed YAML", "line 3"], True),
        "unknown key": ([*SOLO, "--set", "train.lrr=1"], [str(TINY), "unknown field 'train.lrr'"], True),
        "bad value": (["--config", str(negative)], [str(negative), "'train.lr'", "greater than 0"], True),
        "bad override": ([*SOLO, "--set", "train.lr"], ["override 'train.lr'", "KEY=VALUE"], True),
        "unknown task": (
            [*SOLO, "--set", "tasks.mix.basic_arithmetik={}"],
            ["tasks.mix.basic_arithmetik", "unknown reasoning-gym dataset", "basic_arithmetic"],
            False,
        ),
        # a model that cannot load leaves no run folder (no identity) behind, with the config or without
        "missing model": ([*SOLO, "--set", "model.name=./does-not-exist"], ["./does-not-exist"], True),
        "bad model name": (["--set", f"model.name={tmp / 'nothing'}"], [str(tmp / "nothing")], True),
    }


def test_bad_input_exits_2_with_one_error_line_and_no_traceback(tmp_path: Path) -> None:
    cases = _bad_inputs(tmp_path)
    procs = {}
    try:
        for name, (args, _, _) in cases.items():  # started together: most of the time is importing
            if args[0] != "solo":
                args = ["solo", *args]
            procs[name] = subprocess.Popen(
                [*COMMAND, *args, "--run-dir", str(tmp_path / name.replace(" ", "-")), "--rounds", "1"],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=node_env(),
            )
        results = {name: (proc, *proc.communicate(timeout=90)) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

    for name, (proc, out, err) in results.items():
        _, words, early = cases[name]
        lines = err.strip().splitlines()
        assert proc.returncode == 2, (name, err)
        assert "Traceback" not in err and out == "", (name, err)
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1 and lines[-1] == errors[0], (name, err)
        assert all(word in errors[0] for word in words), (name, errors[0], words)
        if early:  # config problems answer before anything is created
            assert lines == errors, (name, err)
            assert not (tmp_path / name.replace(" ", "-")).exists()
        else:  # the only other line allowed: the identity created in the fresh run dir
            assert all(line.startswith("created node identity ") for line in lines[:-1]), (name, err)


def test_eval_prints_pass_at_1_per_task(three_rounds: Run) -> None:
    assert three_rounds.proc.returncode == 0
    run_dir = three_rounds.dir
    proc = swarmnode("eval", "--config", str(TINY), "--run-dir", str(run_dir), "--per-task", "3", cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    assert f"evaluating {three_rounds.dir / 'checkpoints' / 'round-000003'} (round 3)" in proc.stderr
    header, *rows = proc.stdout.strip().splitlines()
    assert header.split() == ["task", "pass@1", "score", "format"]
    table = {row.split()[0]: [float(x) for x in row.split()[1:]] for row in rows}
    assert set(table) == {"propositional_logic", "basic_arithmetic", "mean"}
    for values in table.values():
        assert len(values) == 3 and all(0 <= v <= 1 for v in values)
    for task in ("propositional_logic", "basic_arithmetic"):
        assert table[task][0] in (0.0, 0.33, 0.67, 1.0)  # pass@1 over 3 questions, 2 decimals


def test_keygen_writes_a_private_key_and_refuses_to_overwrite(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    first = swarmnode("keygen", "--out", str(key), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    peer_id = first.stdout.strip()
    assert re.fullmatch(r"12D3KooW[1-9A-HJ-NP-Za-km-z]{44}", peer_id)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    content = key.read_bytes()

    again = swarmnode("keygen", "--out", str(key), cwd=tmp_path)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.startswith("error:") and "--force" in again.stderr
    assert len(again.stderr.splitlines()) == 1
    assert key.read_bytes() == content

    forced = swarmnode("keygen", "--out", str(key), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert re.fullmatch(r"12D3KooW\w{44}", forced.stdout.strip()) and forced.stdout.strip() != peer_id
    assert key.read_bytes() != content and stat.S_IMODE(key.stat().st_mode) == 0o600


def _node_config(run_dir: Path, **overrides):
    from swarmnode.config import load_config

    return load_config(TINY, {"tasks.seed": 5, "run.run_dir": str(run_dir), **overrides})


def test_rounds_logged_before_any_checkpoint_run_again(tmp_path: Path, capsys) -> None:
    """A node killed before its first checkpoint restarts from round 0 and must not log rounds twice."""
    from swarmnode.node import Node

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"round": n}) + "\n" for n in (1, 2)))
    node = Node(_node_config(run_dir))
    assert node.completed_rounds == 0 and metrics(run_dir) == []
    assert "no valid checkpoint: rounds 1-2 will run again" in capsys.readouterr().err


def test_a_last_record_without_newline_does_not_swallow_the_next_one(tmp_path: Path) -> None:
    from swarmnode.node import Node
    from swarmnode.runlog import RunLog

    run_dir = tmp_path / "run"
    node = Node(_node_config(run_dir))
    node.completed_rounds = 1
    node.save_checkpoint()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"round": 1}))  # the newline was never written
    node.close()  # the "crashed" node lets go of the run folder
    Node(_node_config(run_dir)).runlog.append({"round": 2})
    assert RunLog(run_dir).records() == [{"round": 1}, {"round": 2}]


def test_resume_off_refuses_a_run_dir_that_holds_a_run(tmp_path: Path) -> None:
    """Starting over on top of an old run would mix them: its higher-numbered checkpoints would survive
    pruning and be picked up by the next resume."""
    from swarmnode.errors import ConfigError
    from swarmnode.node import Node

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"round": 1}) + "\n")
    with pytest.raises(ConfigError, match=rf"run\.resume is false but {run_dir} already holds a run"):
        Node(_node_config(run_dir, **{"run.resume": False}))
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]  # nothing created


def test_hyperparameters_changed_on_resume_take_effect(tmp_path: Path, capsys) -> None:
    """AdamW.load_state_dict restores the saved lr; a --set train.lr=... on resume must still win."""
    from swarmnode.node import Node

    run_dir = tmp_path / "run"
    node = Node(_node_config(run_dir))
    node.completed_rounds = 1
    node.save_checkpoint()
    node.close()
    resumed = Node(_node_config(run_dir, **{"train.lr": 5e-4, "train.weight_decay": 0.01}))
    assert resumed.completed_rounds == 1
    assert [(g["lr"], g["weight_decay"]) for g in resumed.trainer.optimizer.param_groups] == [(5e-4, 0.01)]
    err = capsys.readouterr().err
    assert "train.lr: 0.001 in the checkpoint, 0.0005 from the config" in err
    assert "train.betas" not in err


def test_start_up_says_what_checkpoints_will_take_and_warns_when_the_disk_cannot_hold_them(
    tmp_path: Path, capsys
) -> None:
    """Session 3's experiment arms left 49 GB of SmolLM2 checkpoints behind without a word; a node now
    states the size up front, and a keep count the free space cannot hold is flagged before round 1."""
    import shutil

    from swarmnode.node import Node

    Node(_node_config(tmp_path / "fits")).close()
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "checkpoints: ~" in x)
    assert "run.keep_checkpoints=3" in line and "NOT ENOUGH" not in line
    keep = shutil.disk_usage(tmp_path).free  # as many checkpoints as free bytes: cannot fit
    Node(_node_config(tmp_path / "full", **{"run.keep_checkpoints": keep})).close()
    assert "NOT ENOUGH: free disk space or lower run.keep_checkpoints" in capsys.readouterr().err


def test_a_second_node_on_the_same_run_dir_is_refused(tmp_path):
    """Two nodes in one run folder would share one identity; the second gets a one-line error."""
    from swarmnode.config import load_config
    from swarmnode.errors import ConfigError
    from swarmnode.node import Node

    cfg = load_config(REPO / "node_configs" / "tiny.yaml", {"run.run_dir": str(tmp_path)})
    first = Node(cfg)
    with pytest.raises(ConfigError, match="in use by a running node \\(pid \\d+\\)"):
        Node(cfg)
    first.close()
    assert Node(cfg).completed_rounds == 0  # free again once the first node is closed


def test_status_watch_redraws_until_interrupted(tmp_path):
    import signal
    import subprocess
    import threading
    import time

    from swarmnode.config import load_config
    from swarmnode.node import Node

    cfg = load_config(REPO / "node_configs" / "tiny.yaml", {"run.run_dir": str(tmp_path), "run.rounds": 1})
    node = Node(cfg)
    node.run()
    node.close()
    cmd = [sys.executable, "-m", "swarmnode.cli", "status", "--watch", "--run-dir", str(tmp_path)]
    # as from a terminal: a shell's background job (CI's runner may be one) starts with SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler, so Ctrl-C would not reach the watch loop
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    clear = "\x1b[2J\x1b[H"
    chunks: list[str] = []  # its stdout as it comes (click flushes each redraw)

    def read() -> None:
        while char := proc.stdout.read(1):
            chunks.append(char)

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 30
    while "".join(chunks).count(clear) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # until two frames are out: one redraw (every 2 s) after the first
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    reader.join(10)  # the rest of stdout, to its end
    out, err = "".join(chunks), proc.stderr.read()
    assert proc.returncode == 130, err
    frames = out.split(clear)[1:]
    assert len(frames) >= 2, out
    not_running, last_round = frames[0].splitlines()[:2]  # the node was closed: status says so first
    assert not_running.startswith("node not running") and last_round.startswith("round 1  policy v")
    assert "solo node" in frames[0]
