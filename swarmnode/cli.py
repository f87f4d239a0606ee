"""The ``swarmnode`` command line.

Options only pass overrides to the config (``--set section.field=value``, ``--rounds``, ``--run-dir``);
defaults live in config.py alone. Heavy imports (torch, transformers, hivemind) happen inside the
commands so ``--help`` and config errors answer at once. User-fixable errors are printed as one line
and exit with status 2; nothing else is caught here.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from swarmnode.config import ConfigError, NodeConfig, load_config, parse_override

app = typer.Typer(
    help="Decentralized RL post-training node (SAPO-style rollout sharing).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config (see node_configs/).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override any config field: --set train.lr=1e-5 (repeatable)."),
]
RoundsOpt = Annotated[int | None, typer.Option("--rounds", help="Total rounds to run (run.rounds).")]
RunDirOpt = Annotated[Path | None, typer.Option("--run-dir", help="Run folder (run.run_dir).")]


def _user_errors() -> tuple[type[Exception], ...]:
    """Exception types that mean 'the user can fix this'; imported lazily to keep --help light."""
    from swarmnode.policy import PolicyError
    from swarmnode.tasks import TaskError

    return (ConfigError, TaskError, PolicyError, FileExistsError)


@contextmanager
def _boundary():
    try:
        yield
    except Exception as exc:
        if isinstance(exc, _user_errors()):
            _fail(exc)
        raise
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None


def _fail(exc: Exception) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2) from None


def _config(config: Path | None, sets: list[str] | None, **fields: Any) -> NodeConfig:
    overrides = dict(parse_override(item) for item in sets or [])
    overrides.update({key: value for key, value in fields.items() if value is not None})
    return load_config(config, overrides)


@app.command()
def solo(config: ConfigOpt = None, set_: SetOpt = None, rounds: RoundsOpt = None, run_dir: RunDirOpt = None):
    """Run a node in silo mode: the full RL loop, no network (default: the embedded SmolLM2)."""
    with _boundary():
        cfg = _config(config, set_, **{"run.rounds": rounds, "run.run_dir": run_dir and str(run_dir)})
        from swarmnode.node import Node

        Node(cfg).run()


@app.command()
def keygen(
    out: Annotated[Path, typer.Option("--out", "-o", help="Key file to write.")] = Path("identity.key"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing key file.")] = False,
):
    """Write a new Ed25519 node identity (libp2p key format, mode 0600) and print its peer id."""
    with _boundary():
        from swarmnode.identity import Identity

        identity = Identity.generate()
        identity.save(out, force=force)
        typer.echo(identity.peer_id)


@app.command("eval")
def evaluate(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run_dir: RunDirOpt = None,
    checkpoint: Annotated[
        Path | None, typer.Option("--checkpoint", help="Checkpoint folder (default: newest valid in run dir).")
    ] = None,
    per_task: Annotated[int, typer.Option("--per-task", help="Held-out questions per task.")] = 20,
):
    """Score a checkpoint on held-out questions: pass@1 (greedy) per task."""
    with _boundary():
        cfg = _config(config, set_, **{"run.run_dir": run_dir and str(run_dir)})
        from swarmnode.evaluate import evaluate_checkpoint, format_report

        report = evaluate_checkpoint(cfg, checkpoint, per_task)
        typer.echo(format_report(report))


def main() -> None:
    app(prog_name="swarmnode")


if __name__ == "__main__":
    main()
