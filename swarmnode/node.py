"""Node lifecycle: set up the parts, resume from the newest valid checkpoint, run rounds, checkpoint, probe.

The same loop serves solo and swarm nodes; a swarm node passes an ``exchange`` hook (see rounds.py).
``run_solo`` is the entry point ``swarmnode solo`` calls with a loaded config; a swarm node starts
through join.py, which wraps a ``Node`` and is never imported from here.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from swarmnode import checkpoint, memory
from swarmnode.common import log
from swarmnode.config import NodeConfig
from swarmnode.errors import ConfigError
from swarmnode.identity import load_or_create
from swarmnode.learn.heap import return_large_blocks_on_free
from swarmnode.learn.replay import ReplayBuffer
from swarmnode.learn.trainer import Trainer
from swarmnode.metrics import NodeCollector, node_info
from swarmnode.metrics_server import TARGET_FILE, MetricsServer, retire_target
from swarmnode.policy import enable_activation_checkpointing, load_policy, state_digest
from swarmnode.probe import PROBE_FILE, Probe
from swarmnode.rounds import Exchange, RoundContext, run_round
from swarmnode.run_folder import save_config
from swarmnode.runlog import RunLog, round_line
from swarmnode.sampler import make_sampler
from swarmnode.status import LOCK_FILE
from swarmnode.stopping import Stopped, StopSignals
from swarmnode.swarm.exchange.records import PeerRoundCounts
from swarmnode.tasks import TaskBank
from swarmnode.tensorboard import TensorBoardLog


def _lock_run_dir(run_dir: Path):
    """One node per run folder: two would share an identity (one peer id) and overwrite checkpoints.

    The lock is an flock held for the life of the process, so a crashed node never leaves it behind.
    """
    handle = (run_dir / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise ConfigError(
            f"run.run_dir {run_dir} is in use by a running node ({owner}); give each node its own --run-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


class Node:
    def __init__(self, cfg: NodeConfig):
        """Set up every part, or, if that fails in a run folder this start created (a bad model name,
        a taken port), remove what was written there and re-raise: a failed first start leaves nothing."""
        self.cfg = cfg
        self.run_dir = Path(cfg.run.run_dir)
        fresh = not self.run_dir.exists() or not any(self.run_dir.iterdir())
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = self.metrics_server = self.tensorboard = None
        self.stopped_cleanly = False  # set by run(): its rounds done, or stopped by a signal (close retires)
        self._created_identity: Path | None = None
        try:
            self._set_up()
        except BaseException:
            self.close()
            if fresh:
                shutil.rmtree(self.run_dir, ignore_errors=True)
                if self._created_identity is not None:
                    self._created_identity.unlink(missing_ok=True)
            raise

    def _set_up(self) -> None:
        cfg = self.cfg
        return_large_blocks_on_free()  # before the model's tensors are allocated
        self.checkpoints = self.run_dir / "checkpoints"
        self.runlog = RunLog(self.run_dir)
        # before anything slow: without the tensorboard package this fails at once
        self.tensorboard = TensorBoardLog(self.run_dir) if cfg.run.tensorboard else None
        self.completed_rounds = 0
        self._saved_round = 0  # the round of the newest checkpoint
        has_run = self.runlog.records() or any(self.checkpoints.glob(f"{checkpoint.PREFIX}*"))
        if not cfg.run.resume and has_run:
            # Starting over here would mix two runs: the old, higher-numbered checkpoints would outlive
            # the new ones at pruning and a later resume would pick them up.
            raise ConfigError(
                f"run.resume is false but {self.run_dir} already holds a run (metrics or checkpoints); "
                "choose a new run.run_dir, delete the old run, or resume it"
            )
        self._lock = _lock_run_dir(self.run_dir)
        save_config(cfg, self.run_dir)
        # First, so that a taken port stops the node before anything slow (the node info comes later)
        self.metrics = NodeCollector({}, self.run_dir, self.runlog.write_failures)
        if cfg.run.metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics, cfg.run.metrics_host, cfg.run.metrics_port)

        self.identity_path = cfg.run.identity_path or self.run_dir / "identity.key"
        self.identity, created = load_or_create(self.identity_path)
        if created:
            self._created_identity = Path(self.identity_path)  # said once the start has succeeded
        # Validates the task mix before the slow model load; peers draw different question streams.
        stream_seed = int.from_bytes(hashlib.sha256(self.identity.peer_id.encode()).digest()[:8], "big")
        self.bank = TaskBank(cfg.tasks, default_seed=stream_seed)
        if cfg.run.cpu_threads is not None:
            torch.set_num_threads(cfg.run.cpu_threads)
        torch.manual_seed(cfg.train.seed)
        t0 = time.perf_counter()
        self.policy = load_policy(cfg.model, seed=cfg.train.seed)
        n_params = sum(p.numel() for p in self.policy.model.parameters())
        log(
            f"policy {self.policy.name}: {n_params / 1e6:.1f}M params on {self.policy.device} "
            f"({str(self.policy.dtype).removeprefix('torch.')}), loaded in {time.perf_counter() - t0:.1f}s"
        )
        probe_log = RunLog(self.run_dir, PROBE_FILE, self.runlog.write_failures)
        self.probe = Probe(cfg, self.bank, self.policy, probe_log)
        ref_model = None
        if cfg.train.kl_beta > 0:
            ref_model = copy.deepcopy(self.policy.model).requires_grad_(False)
        pad_id = self.policy.tokenizer.pad_token_id
        self.trainer = Trainer(
            self.policy.model,
            pad_id,
            cfg.train,
            offpolicy=cfg.offpolicy,
            temperature=cfg.sampling.temperature,
            ref_model=ref_model,
        )
        self._report_checkpoint_disk()
        self._plan_memory()
        self.sampler = make_sampler(cfg.sampling, self.policy, seed=cfg.train.seed)
        self.replay = None
        if cfg.replay.groups_per_round > 0:
            self.replay = ReplayBuffer(cfg.replay.capacity, cfg.replay.max_staleness, seed=cfg.train.seed)
        if cfg.run.resume:
            self._resume()
        self.metrics.observe_info(node_info(self.peer_id, self.policy.name, self.sampler.name))
        if self._created_identity is not None:
            log(f"created node identity {self.identity_path} (peer id {self.identity.peer_id})")
        if self.metrics_server is not None:
            self.metrics_server.write_target(
                self.run_dir, {"peer_id": self.peer_id, "model": self.policy.name}
            )
            url = self.metrics_server.url
            log(f"status page at {url}/ (metrics: {url}/metrics, health: {url}/health)")

    def close(self) -> None:
        """Stop the metrics server and release the run folder (the process exiting does the same). After a
        clean stop the Prometheus target is retired (metrics_server.retire_target); after a crash it stays, so
        the node's down alert fires."""
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.metrics_server is not None:
            if self.stopped_cleanly:
                with self.runlog.write_failures.guard(self.run_dir / TARGET_FILE):
                    retire_target(self.run_dir)
            self.metrics_server.close()
        if self._lock is not None:
            self._lock.close()

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def _resume(self) -> None:
        info = checkpoint.newest_valid(self.checkpoints, log=log)
        if info is None:
            # Rounds logged before the first checkpoint are lost work: they run again from the start.
            dropped = self._truncate_logs(0)
            if dropped:
                log(f"no valid checkpoint: rounds {dropped[0]}-{dropped[-1]} will run again")
            return
        checkpoint.restore(info, self.policy.model, self.trainer.optimizer)
        self._saved_round = info.round
        self.sampler.sync_weights()  # a vLLM engine holds its own copy of the weights
        self.trainer.policy_version = info.policy_version
        self.completed_rounds = info.round
        digest = state_digest(self.policy.model, self.trainer.optimizer)
        log(f"resumed from {info.path} at round {info.round} (state digest {digest})")
        if digest != info.digest:
            raise RuntimeError(f"checkpoint {info.path} restored to a different state than it saved")
        # load_state_dict brought back the saved hyperparameters; the config decides them (an lr
        # changed with --set on resume must take effect).
        train = self.cfg.train
        wanted = {"lr": train.lr, "betas": tuple(train.betas), "weight_decay": train.weight_decay}
        for group in self.trainer.optimizer.param_groups:
            for key, value in wanted.items():
                saved = tuple(group[key]) if key == "betas" else group[key]
                if saved != value:
                    log(f"train.{key}: {saved} in the checkpoint, {value} from the config")
                    group[key] = value
        dropped = self._truncate_logs(info.round)
        if dropped:
            log(f"rounds {dropped[0]}-{dropped[-1]} ran after that checkpoint and will run again")

    def _truncate_logs(self, round_: int) -> list[int]:
        """Drop what the round log and the probe log hold of rounds after ``round_`` (they run again, and
        a probe of a round that runs again measured weights no checkpoint holds); the dropped rounds."""
        self.probe.runlog.truncate_after(round_)
        return self.runlog.truncate_after(round_)

    def _report_checkpoint_disk(self) -> None:
        """Say what the checkpoints will take, and warn now rather than at the first failed save when the
        disk cannot hold them (a SmolLM2-135M checkpoint is 1.6 GB: weights and AdamW's two moments)."""
        each = checkpoint.estimated_size(self.policy.model)
        peak = each * (self.cfg.run.keep_checkpoints + 1)  # the newest is written before the oldest goes
        free = shutil.disk_usage(self.run_dir).free
        message = (
            f"checkpoints: ~{each / 1e9:.2f} GB each, up to {peak / 1e9:.2f} GB in {self.checkpoints} "
            f"(run.keep_checkpoints={self.cfg.run.keep_checkpoints}), {free / 1e9:.1f} GB free"
        )
        if free < peak:
            message += "; NOT ENOUGH: free disk space or lower run.keep_checkpoints, or checkpoints will fail"
        log(message)

    def _plan_memory(self) -> None:
        """Turn activation checkpointing on where it pays (``model.gradient_checkpointing: null``), then
        say what training will take and what to change when it may not fit (memory.py)."""
        model, cfg = self.policy.model, self.cfg
        available = memory.available_bytes()
        if cfg.model.gradient_checkpointing is None and memory.checkpointing_pays(
            model, self.policy.device, cfg.train, available
        ):
            enable_activation_checkpointing(model)
        frozen = sum(m is not None for m in (self.trainer.base_model, self.trainer.ref_model))
        frozen += cfg.sampling.lag_rounds + 1 if cfg.sampling.lag_rounds else 0  # sampler/lagging.py
        log(memory.describe(memory.estimate(model, cfg.train, frozen), cfg.model, cfg.train, available))

    def save_checkpoint(self) -> Path:
        digest = state_digest(self.policy.model, self.trainer.optimizer)
        return checkpoint.save(
            self.checkpoints,
            self.completed_rounds,
            self.trainer.policy_version,
            self.policy.model,
            self.trainer.optimizer,
            digest,
            keep=self.cfg.run.keep_checkpoints,
        )

    def _checkpoint(self, final: bool) -> None:
        """Save a checkpoint. A failed save (disk full, I/O error) leaves the previous checkpoints as they
        were; the node keeps training and tries again at the next one, except after the last round,
        where the error ends the run (nothing later would save its result)."""
        try:
            path = self.save_checkpoint()
        except OSError as exc:
            if final:
                raise
            log(
                f"checkpoint of round {self.completed_rounds} failed ({exc}); the previous checkpoint is "
                "kept and the next one will be tried in its turn. Free some disk space."
            )
            return
        self._saved_round = self.completed_rounds
        self.metrics.observe_checkpoint()
        log(f"checkpoint {path}")

    def run(
        self,
        exchange: Exchange | None = None,
        peer_counts: Callable[[], PeerRoundCounts] | None = None,
        on_trained: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        """Run until ``run.rounds`` rounds are complete (forever if None); ``peer_counts`` adds what the
        round's exchange received to its record; ``on_trained`` is told the peer groups each round trained
        on, per producer (``rounds.RoundContext``). Probe when due (probe.py). On Ctrl-C or SIGTERM, stop at
        the next safe point, checkpoint the last completed round and raise ``Stopped`` (stopping.py)."""
        stop = StopSignals()
        ctx = RoundContext(
            cfg=self.cfg,
            policy=self.policy,
            bank=self.bank,
            sampler=self.sampler,
            trainer=self.trainer,
            peer_id=self.peer_id,
            replay=self.replay,
            exchange=exchange,
            progress=self._progress,
            before_update=stop.hold,
            on_trained=on_trained,
        )
        target = self.cfg.run.rounds
        every = self.cfg.run.checkpoint_every
        self._bar = tqdm(
            total=target,
            initial=self.completed_rounds,
            unit="round",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=None,  # no bar when stderr is not a terminal: log files get clean per-round lines
        )
        try:
            with stop.installed():
                # round 0 of a fresh run, or a due probe a stop cut short; never one the log already holds
                start = self.completed_rounds
                if self.probe.due(start, target) and not self.probe.done(start):
                    self._probe(start)
                while target is None or self.completed_rounds < target:
                    round_ = self.completed_rounds + 1
                    rng_at_start = checkpoint.rng_state()
                    try:
                        record = run_round(ctx, round_)
                    except Stopped:
                        checkpoint.set_rng_state(rng_at_start)  # the abandoned round drew nothing
                        raise
                    if peer_counts is not None:
                        record = replace(record, peer=peer_counts())
                    self.completed_rounds = round_
                    line = record.as_dict()  # what leaves the process: metrics.jsonl, TensorBoard
                    self.runlog.append(line)
                    if self.tensorboard is not None:
                        self.tensorboard.append(line)
                    self.metrics.observe_round(record)
                    log(round_line(record))
                    self._bar.update(1)
                    self._bar.set_postfix(reward=f"{record.reward_mean:.3f}")
                    if round_ % every == 0 or round_ == target:
                        self._checkpoint(final=round_ == target)
                    stop.release()
                    if self.probe.due(round_, target):  # after the checkpoint: a stop here loses no round
                        self._probe(round_)
            self.stopped_cleanly = True
        except Stopped as stopped:
            if self.completed_rounds > self._saved_round:
                self._checkpoint(final=True)
            self.stopped_cleanly = True
            log(f"stopped ({stopped}) after round {self.completed_rounds}; restart with the same command")
            raise
        finally:
            self._bar.close()

    def _probe(self, round_: int) -> None:
        """The fixed probe of the weights as round ``round_`` left them (probe.py), named on the bar."""
        if not self._bar.disable:
            self._bar.set_description_str(f"probe after round {round_}")
        self.probe.run(round_)

    def _progress(self, what: str) -> None:
        """What the current round is doing: on the progress bar, or (no terminal: systemd, nohup) as one
        log line per phase of every round, so a log shows life long before each round's line."""
        round_ = self.completed_rounds + 1
        if not self._bar.disable:
            self._bar.set_description_str(f"round {round_}: {what}")
        else:
            log(f"round {round_}: {what}")


def run_solo(cfg: NodeConfig) -> None:
    """Silo mode: the full RL loop, no network."""
    node = Node(cfg)
    try:
        node.run()
    finally:
        node.close()
