"""Section ``run``: the run folder (checkpoints, metrics.jsonl, the node key), how long a run lasts, and
the node's process: its /metrics endpoint, CPU threads and TensorBoard files."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from swarmnode.config.strict import Strict


class RunConfig(Strict):
    rounds: int | None = Field(None, ge=0, description="Rounds to run in total (None = until stopped).")
    run_dir: Path = Field(Path("runs/solo"), description="Checkpoints, metrics.jsonl and the node key.")
    checkpoint_every: int = Field(5, gt=0, description="Write a checkpoint every K rounds.")
    keep_checkpoints: int = Field(3, gt=0, description="Newest checkpoints kept on disk.")
    resume: bool = Field(True, description="Resume from the newest valid checkpoint in run_dir.")
    identity_path: Path | None = Field(None, description="Ed25519 key file (default run_dir/identity.key).")
    metrics_host: str = Field("127.0.0.1", description="Address of /metrics and /health (0.0.0.0 = all).")
    metrics_port: int | None = Field(
        0, ge=0, le=65535, description="Port of /metrics and /health (0 = any free port, None = off)."
    )
    cpu_threads: int | None = Field(
        None,
        gt=0,
        description="Torch CPU threads (None = torch's default: all cores); 1 when nodes share a machine.",
    )
    tensorboard: bool = Field(
        False,
        description="Also write each round's scalars as TensorBoard event files in run_dir/tensorboard/ "
        "(pip install 'swarmnode[tensorboard]').",
    )
