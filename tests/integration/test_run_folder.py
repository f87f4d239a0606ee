"""A run folder describes itself, and a newcomer's mistakes end in one line: the real ``swarmnode``
command on a tiny qwen2-shaped model (not the default model, so nothing works by accident), real
reasoning-gym tasks, real checkpoints. The run is made with its output to a file, as under systemd or
nohup: a line per phase of every round, and no library warnings or loading bars; ``-v`` shows the
libraries' output again. Children are ended only through their own pid; waits are bounded.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import COMMAND, TINY, metrics, node_env, swarmnode

QWEN = ["--config", str(TINY), "--set", "model.tiny.family=qwen2", "--set", "tasks.seed=5"]
NOISE = re.compile(r"Warning|it/s\]|█|\|#+")  # warnings, and tqdm bars as they look in a file


def to_file(cwd: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with stdout and stderr going to one file (no terminal); what it wrote there is ``stderr``."""
    out = cwd / f"{name}.log"
    with out.open("w") as f:
        proc = subprocess.run(
            [*COMMAND, *args], cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=120, env=node_env()
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout="", stderr=out.read_text())


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """A user mistake: exit 2 and exactly one line on stderr, no traceback."""
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def qwen_solo(tmp_path_factory) -> subprocess.CompletedProcess[str]:
    """Two rounds of a tiny-qwen2 solo run, checkpointed, in ``<tmp>/run``, its output to a file."""
    cwd = tmp_path_factory.mktemp("run-folder")
    proc = to_file(cwd, "solo", "solo", *QWEN, "--rounds", "2", "--run-dir", str(cwd / "run"))
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def qwen_run(qwen_solo: subprocess.CompletedProcess[str]) -> Path:
    return Path(qwen_solo.args[qwen_solo.args.index("--run-dir") + 1])


def test_each_round_says_what_it_is_doing_before_its_round_line(qwen_solo) -> None:
    """Without a terminal (a log file), each round's phases are lines, before the round line."""
    lines = qwen_solo.stderr.splitlines()
    phases = [i for i, line in enumerate(lines) if line.startswith("round 1: ")]
    done = next(i for i, line in enumerate(lines) if line.startswith("round    1 "))
    said = " | ".join(lines[i] for i in phases)
    assert phases and max(phases) < done, qwen_solo.stderr
    assert "sampling 4 x 4 completions" in said and "tok/s" in said and "training on" in said, said
    second = [i for i, line in enumerate(lines) if line.startswith("round 2: ")]
    assert second and done < min(second), qwen_solo.stderr
    for round_ in (1, 2):  # every round says each of its phases
        for phase in ("sampling", "scoring", "training"):
            assert re.search(rf"^round {round_}: .*{phase}", qwen_solo.stderr, re.M), (round_, phase)
    assert not NOISE.search(qwen_solo.stderr), qwen_solo.stderr  # nothing else: no warnings, no bars


def test_the_run_folder_saves_its_effective_config(qwen_run: Path) -> None:
    saved = yaml.safe_load((qwen_run / "config.yaml").read_text())
    assert saved["model"]["name"] == "tiny" and saved["model"]["tiny"]["family"] == "qwen2"
    assert saved["tasks"]["seed"] == 5 and saved["run"]["rounds"] == 2


def test_eval_and_config_show_need_nothing_but_the_folder(qwen_run: Path) -> None:
    proc = swarmnode("eval", "--run-dir", str(qwen_run), "--per-task", "2", cwd=qwen_run.parent)
    assert proc.returncode == 0, proc.stderr
    assert "round 2" in proc.stderr and proc.stdout.splitlines()[-1].startswith("mean")
    shown = swarmnode("config", "show", "--run-dir", str(qwen_run), cwd=qwen_run.parent)
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["model"]["tiny"]["family"] == "qwen2"


def test_a_restart_without_the_config_resumes_and_a_conflicting_one_is_named(
    qwen_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(qwen_run, run_dir)  # the two rounds of a run made with the config (QWEN)
    assert not (run_dir / "probe.jsonl").exists()
    # the probe measures the policy and never changes it: free on a restart, like the round count
    again = swarmnode(
        "solo", "--run-dir", str(run_dir), "--rounds", "3", "--set", "probe.every_rounds=3", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stderr and [r["round"] for r in metrics(run_dir)] == [1, 2, 3]
    assert [json.loads(line)["round"] for line in (run_dir / "probe.jsonl").read_text().splitlines()] == [3]

    conflict = swarmnode(
        "solo", "--run-dir", str(run_dir), "--rounds", "4", "--set", "train.lr=0.5", cwd=tmp_path
    )
    line = one_error_line(conflict)
    assert "train.lr" in line and "--reconfigure" in line
    assert [r["round"] for r in metrics(run_dir)] == [1, 2, 3]  # nothing ran

    model = swarmnode(
        "solo", "--run-dir", str(run_dir), "--set", "model.tiny.family=llama", "--reconfigure", cwd=tmp_path
    )
    assert "model.tiny.family" in one_error_line(model)

    changed = swarmnode(
        "solo",
        "--run-dir",
        str(run_dir),
        "--rounds",
        "4",
        "--set",
        "train.lr=1e-4",
        "--reconfigure",
        cwd=tmp_path,
    )
    assert changed.returncode == 0, changed.stderr
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["lr"] == 1e-4


EXPORT_CHECK = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out, prompt = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(out).eval()
tok = AutoTokenizer.from_pretrained(out)
ids = model.generate(
    torch.tensor([prompt]), do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id
)
print(json.dumps(ids[0, len(prompt):].tolist()))
"""


def test_an_exported_checkpoint_loads_with_from_pretrained_and_generates_what_the_node_does(
    qwen_run: Path, tmp_path: Path
) -> None:
    import torch

    from swarmnode.checkpoint import load_model_weights, newest_valid
    from swarmnode.policy import load_policy
    from swarmnode.prompts import encode_prompt
    from swarmnode.run_folder import config_for_run

    out = tmp_path / "hf"
    proc = to_file(tmp_path, "export", "export", "--run-dir", str(qwen_run), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert not NOISE.search(proc.stderr), proc.stderr  # no library warnings or bars in a log file
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}

    cfg = config_for_run(None, {"run.run_dir": str(qwen_run)})
    policy = load_policy(cfg.model, seed=cfg.train.seed)
    load_model_weights(newest_valid(qwen_run / "checkpoints"), policy.model)
    prompt = encode_prompt(policy.tokenizer, "What is 2 + 3?")
    with torch.no_grad():
        ids = policy.model.generate(
            input_ids=torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=12,
            pad_token_id=policy.tokenizer.pad_token_id,
        )
    node_ids = ids[0, len(prompt) :].tolist()

    fresh = subprocess.run(
        [sys.executable, "-c", EXPORT_CHECK, str(out), json.dumps(prompt)],
        capture_output=True, text=True, timeout=120, env=node_env(),
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout) == node_ids


def test_verbose_shows_the_libraries_output_again(qwen_run: Path, tmp_path: Path) -> None:
    args = ("-v", "export", "--run-dir", str(qwen_run), "--out", str(tmp_path / "v"))
    proc = to_file(tmp_path, "verbose", *args)
    assert proc.returncode == 0, proc.stderr
    assert NOISE.search(proc.stderr), proc.stderr  # the libraries' own bars, as they print them


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_stop_signal_mid_run_loses_no_completed_round(tmp_path: Path, sig: signal.Signals) -> None:
    """Checkpoints only at the end (checkpoint_every 100): what survives the signal is the stop's own."""
    run_dir = tmp_path / "run"
    args = ["solo", *QWEN, "--run-dir", str(run_dir), "--set", "run.checkpoint_every=100"]
    proc = subprocess.Popen(
        [*COMMAND, *args, "--rounds", "50"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=node_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while len(metrics(run_dir)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and "stopped" in err
    completed = [r["round"] for r in metrics(run_dir)]
    assert len(completed) >= 2 and completed == list(range(1, len(completed) + 1))

    again = swarmnode("solo", "--run-dir", str(run_dir), "--rounds", str(len(completed) + 1), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"at round {len(completed)} " in again.stderr  # resumed from the last completed round
    assert "will run again" not in again.stderr
    assert [r["round"] for r in metrics(run_dir)] == list(range(1, len(completed) + 2))


def test_a_taken_metrics_port_is_one_line_and_leaves_no_run_folder(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run_dir = tmp_path / "fresh"
        proc = swarmnode(
            "solo", *QWEN, "--run-dir", str(run_dir), "--set", f"run.metrics_port={port}", cwd=tmp_path
        )
    assert "run.metrics_port" in one_error_line(proc) and str(port) in proc.stderr
    assert not run_dir.exists()


def test_keygen_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    proc = swarmnode("keygen", "--out", str(tmp_path / "missing" / "k.key"), cwd=tmp_path)
    assert "does not exist" in one_error_line(proc)
    assert not (tmp_path / "missing").exists()


def test_a_bad_peer_address_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = swarmnode("join", "--peers", "1.2.3.4:31337", "--run-dir", str(tmp_path / "j"), cwd=tmp_path)
    assert "swarm.initial_peers" in one_error_line(proc)
    assert time.monotonic() - start < 15 and not (tmp_path / "j").exists()


def test_tiny_shape_overrides_on_another_model_are_refused(tmp_path: Path) -> None:
    proc = swarmnode("config", "show", "--set", "model.tiny.hidden_size=65", cwd=tmp_path)
    assert "model.tiny" in one_error_line(proc)


def test_commands_that_only_read_a_run_take_other_values_but_never_another_model(qwen_run: Path) -> None:
    """eval with a longer sampling cap than the run trained with is an evaluation choice, not a conflict."""
    cwd = qwen_run.parent
    shown = swarmnode(
        "config", "show", "--run-dir", str(qwen_run), "--set", "sampling.max_new_tokens=9", cwd=cwd
    )
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout)["sampling"]["max_new_tokens"] == 9
    other = swarmnode(
        "config", "show", "--run-dir", str(qwen_run), "--set", "model.tiny.family=llama", cwd=cwd
    )
    assert "model.tiny.family" in one_error_line(other)
