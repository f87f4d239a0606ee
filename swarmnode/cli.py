"""The ``swarmnode`` command line.

Options only pass overrides to the config (``--set section.field=value``, ``--rounds``, ``--run-dir``);
defaults live in swarmnode/config/ alone. Heavy imports (torch, transformers, hivemind) happen inside the
commands so ``--help`` and config errors answer at once, and a start checks its ports and addresses
(preflight.py) before it imports the node. Libraries' warnings and loading bars are hidden unless
``-v``. User-fixable errors are printed as one line and exit with status 2; nothing else is caught here.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from swarmnode.common import VERBOSE_ENV, quiet_libraries
from swarmnode.config import NodeConfig, load_config, parse_override
from swarmnode.errors import ConfigError, UserError
from swarmnode.preflight import check_start
from swarmnode.run_folder import CONFIG_FILE, config_for_run

app = typer.Typer(
    help="Decentralized RL post-training node (SAPO-style rollout sharing).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: typer's rich panels show flags as `--watch <bool>`
)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config (see node_configs/).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="FIELD=VALUE",
        help="Override any config field: --set train.lr=1e-5 (repeatable).",
    ),
]
RoundsOpt = Annotated[int | None, typer.Option("--rounds", help="Total rounds to run (run.rounds).")]
RunDirOpt = Annotated[Path | None, typer.Option("--run-dir", help="Run folder (run.run_dir).")]
ReconfigureOpt = Annotated[
    bool,
    typer.Option(
        "--reconfigure",
        help="Restart a run with config values that differ from those it was started with (not the model).",
    ),
]
AnnounceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--announce",
        help="A public address peers should dial, /ip4/PUBLIC_IP/tcp/PORT (repeatable); the node also "
        "listens on PORT on all interfaces (swarm.announce_maddrs, swarm.host_maddrs).",
    ),
]


def _command(name: str | None = None, group: typer.Typer = app) -> Callable:
    """Register a command listed in ``swarmnode --help`` by the whole first paragraph of its docstring:
    click would cut it at the width left beside the name and end it with '...'."""

    def register(fn: Callable) -> Callable:
        summary = " ".join(inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].split())
        return group.command(name, short_help=summary)(fn)

    return register


@app.callback()
def _main(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help=f"Show the libraries' warnings and loading bars (also {VERBOSE_ENV}=1); hidden by default.",
        ),
    ] = False,
) -> None:
    if not (verbose or os.environ.get(VERBOSE_ENV, "") not in ("", "0")):
        quiet_libraries()


@contextmanager
def _boundary():
    """The process boundary: a user-fixable error becomes its one line and exit 2, Ctrl-C exit 130;
    anything else is a bug and keeps its traceback."""
    try:
        yield
    except (UserError, FileExistsError) as exc:
        _fail(exc)
    except KeyboardInterrupt as exc:  # a node's Stopped has said what it saved; a bare Ctrl-C says this
        if not hasattr(exc, "exit_code"):
            typer.echo("interrupted", err=True)
        raise typer.Exit(getattr(exc, "exit_code", 130)) from None


def _fail(exc: Exception) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2) from None


def _announce(announce: list[str] | None, sets: list[str] | None, listen_key: str) -> dict[str, Any]:
    """Overrides for --announce: announce these addresses and listen on their ports on all interfaces
    (``listen_key``), unless the listening addresses are given with --set."""
    if not announce:
        return {}
    from swarmnode.swarm.net.reachability import tcp_ports

    ports = tcp_ports(announce)
    if len(ports) != len(announce) or 0 in ports:
        raise ConfigError(f"--announce {announce}: give full addresses with a fixed port, /ip4/IP/tcp/PORT")
    overrides: dict[str, Any] = {"swarm.announce_maddrs": announce}
    if not any(item.split("=", 1)[0].strip() == listen_key for item in sets or []):
        overrides[listen_key] = [f"/ip4/0.0.0.0/tcp/{port}" for port in ports]
    return overrides


def _overrides(sets: list[str] | None, fields: dict[str, Any]) -> dict[str, Any]:
    overrides = dict(parse_override(item) for item in sets or [])
    overrides.update({key: value for key, value in fields.items() if value is not None})
    return overrides


def _config(config: Path | None, sets: list[str] | None, **fields: Any) -> NodeConfig:
    return load_config(config, _overrides(sets, fields))


def _run_config(
    config: Path | None,
    sets: list[str] | None,
    *,
    restart: bool = False,
    reconfigure: bool = False,
    **fields: Any,
) -> NodeConfig:
    """The config of a command on a run folder: the folder's saved config under --config and --set;
    ``restart`` for the commands that go on training it (solo, join), see run_folder.config_for_run."""
    return config_for_run(config, _overrides(sets, fields), restart=restart, reconfigure=reconfigure)


def _existing_run_folder(cfg: NodeConfig) -> Path:
    """The run folder a command reads, which must exist: a typo would otherwise evaluate the untrained
    base model or print defaults, minutes of work or a silent wrong answer (ConfigError naming the run
    folders that do exist beside it)."""
    folder = Path(cfg.run.run_dir)
    if folder.is_dir():
        return folder
    parent = folder.parent if folder.parent.is_dir() else None
    nearby = sorted(p.name for p in parent.iterdir() if (p / CONFIG_FILE).is_file()) if parent else []
    hint = f"run folders in {parent}: {', '.join(nearby)}" if nearby else "no run folder beside it"
    raise ConfigError(f"run.run_dir: {folder} does not exist ({hint}); give --run-dir of a node that has run")


@_command()
def solo(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    rounds: RoundsOpt = None,
    run_dir: RunDirOpt = None,
    reconfigure: ReconfigureOpt = False,
):
    """Run a node in silo mode: the full RL loop, no network (default: the embedded SmolLM2)."""
    with _boundary():
        fields = {"run.rounds": rounds, "run.run_dir": run_dir and str(run_dir)}
        cfg = _run_config(config, set_, restart=True, reconfigure=reconfigure, **fields)
        check_start(cfg, swarm=False)
        from swarmnode.node import run_solo

        run_solo(cfg)


@_command()
def join(
    peers: Annotated[
        list[str] | None, typer.Option("--peers", help="Multiaddr of a swarm member (repeatable).")
    ] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    rounds: RoundsOpt = None,
    run_dir: RunDirOpt = None,
    announce: AnnounceOpt = None,
    reconfigure: ReconfigureOpt = False,
):
    """Join a swarm: train locally and share verified rollouts with peers (SAPO)."""
    with _boundary():
        overrides = {
            "run.rounds": rounds,
            "run.run_dir": run_dir and str(run_dir),
            "swarm.initial_peers": peers,
            **_announce(announce, set_, "swarm.host_maddrs"),
        }
        cfg = _run_config(config, set_, restart=True, reconfigure=reconfigure, **overrides)
        if cfg.swarm.require_initial_peers and not cfg.swarm.initial_peers:
            raise ConfigError(
                f"{config}: swarm.initial_peers is empty, and alone this node would start a swarm of its "
                "own. Pass --peers MULTIADDR of a bootstrap node or a member (docs/operators.md)."
            )
        check_start(cfg, swarm=True)
        from swarmnode.join import run_join

        run_join(cfg, config_path=config)


@_command()
def bootstrap(
    port: Annotated[
        int | None, typer.Option("--port", help="TCP port on all interfaces (bootstrap.host_maddrs).")
    ] = None,
    identity: Annotated[
        Path | None,
        typer.Option("--identity", help="Key file, created if missing (bootstrap.identity_path)."),
    ] = None,
    announce: AnnounceOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
):
    """Host a bootstrap node (DHT only, no model): fixed port, stable identity, metrics. docs/operators.md"""
    with _boundary():
        overrides = {
            **_announce(announce, set_, "bootstrap.host_maddrs"),
            "bootstrap.identity_path": identity and str(identity),
        }
        if port is not None:
            overrides["bootstrap.host_maddrs"] = [f"/ip4/0.0.0.0/tcp/{port}"]
        cfg = _config(config, set_, **overrides)
        from swarmnode.bootstrap import run_bootstrap

        raise typer.Exit(run_bootstrap(cfg))  # 130 after Ctrl-C, 0 after SIGTERM


@_command()
def status(
    run_dir: RunDirOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh every 2 s until Ctrl-C.")] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Write the status page (curves, peers, rejections) of the run folder to this file."
        ),
    ] = None,
):
    """Show a node's rounds, connection, peers (who helped), rollouts, rejections by reason and bans."""
    with _boundary():
        cfg = _config(config, set_, **{"run.run_dir": run_dir and str(run_dir)})
        from swarmnode.status import format_status, read_status

        folder = Path(cfg.run.run_dir)
        if html is not None:
            from swarmnode.errors import StatusError
            from swarmnode.status_page import render, saved_page

            try:
                html.write_text(render(saved_page(folder)))
            except OSError as exc:
                raise StatusError(f"cannot write {html}: {exc.strerror}") from None
            typer.echo(f"wrote {html}: open it in a browser (it needs no network)")
            return
        if not watch:
            typer.echo(format_status(read_status(folder)))
            return
        while True:
            # clear the screen, then draw (color=True: click would strip the escape codes off a pipe)
            typer.echo("\x1b[2J\x1b[H" + format_status(read_status(folder)), color=True)
            time.sleep(2.0)


@_command()
def keygen(
    out: Annotated[Path, typer.Option("--out", "-o", help="Key file to write.")] = Path("identity.key"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing key file.")] = False,
    config: ConfigOpt = None,
    work_bits: Annotated[
        int | None,
        typer.Option(
            "--work-bits",
            help="Proof of work to mint for the key (swarm.identity_work_bits; default: the config's).",
        ),
    ] = None,
):
    """Write a new Ed25519 node identity (libp2p key format, mode 0600), mint its proof of work (kept
    beside it as KEY.work) and print its peer id."""
    with _boundary():
        from swarmnode.identity import Identity
        from swarmnode.identity_work import load_or_mint_work

        overrides = {} if work_bits is None else {"swarm.identity_work_bits": work_bits}
        bits = load_config(config, overrides).swarm.identity_work_bits
        if not out.parent.is_dir():
            raise ConfigError(f"--out {out}: folder {out.parent} does not exist; create it first")
        identity = Identity.generate()
        identity.save(out, force=force)
        load_or_mint_work(identity, out, bits)
        typer.echo(identity.peer_id)


@_command("eval")
def evaluate(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run_dir: RunDirOpt = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="Checkpoint folder (default: newest valid in run dir)."),
    ] = None,
    per_task: Annotated[int, typer.Option("--per-task", help="Held-out questions per task.")] = 20,
):
    """Score a checkpoint on held-out questions: pass@1 (greedy) per task."""
    with _boundary():
        cfg = _run_config(config, set_, **{"run.run_dir": run_dir and str(run_dir)})
        if checkpoint is None:
            _existing_run_folder(cfg)
        from swarmnode.evaluate import evaluate_checkpoint, format_report

        report = evaluate_checkpoint(cfg, checkpoint, per_task)
        typer.echo(format_report(report))


@_command()
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="New folder for the Hugging Face model.")],
    run_dir: RunDirOpt = None,
    round_: Annotated[
        int | None, typer.Option("--round", help="Checkpoint of this round (default: the newest valid one).")
    ] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
):
    """Export a checkpoint as a Hugging Face folder (config.json, tokenizer, safetensors; LoRA merged)."""
    with _boundary():
        cfg = _run_config(config, set_, **{"run.run_dir": run_dir and str(run_dir)})
        _existing_run_folder(cfg)
        from swarmnode.export import export_checkpoint

        export_checkpoint(cfg, out, round_=round_)
        typer.echo(f"load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")


config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@_command("show", config_app)
def config_show(config: ConfigOpt = None, set_: SetOpt = None, run_dir: RunDirOpt = None):
    """Print the effective config as YAML: defaults < the run folder's saved config < --config < --set."""
    with _boundary():
        import yaml

        cfg = _run_config(config, set_, **{"run.run_dir": run_dir and str(run_dir)})
        if run_dir is not None:  # without one: the defaults, a question worth answering
            _existing_run_folder(cfg)
        typer.echo(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), nl=False)


def main() -> None:
    app(prog_name="swarmnode")


if __name__ == "__main__":
    main()
