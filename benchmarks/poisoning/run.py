"""One arm of the poisoning harness: a node trained through its own round with hostile peer groups.

``run_arm`` builds the node as ``swarmnode solo`` does (``node.Node``: policy, task bank, sampler,
trainer, probe, all from the config) in a run folder of its own, and drives the project's round
(``rounds.run_round``) with a ``RoundContext`` as ``Node.run`` builds it, whose ``exchange`` hook is the
attackers' (``peer.HostileExchange``): every round the attackers' signed batches go through the
node's real verifier and pool and the round trains on the J peer groups the pool selects, next to its
own. No checkpoints are written. The measures (``measure.Yardstick``) are taken before the
first round and every ``every`` rounds and after the last.

An arm is (defence, attack or control, seed): the attack sends ``payload``; the control (``control``)
is the same attackers, identities, questions and pool tie-breaks with clean correct completions. The
defence is a config override, ``offpolicy.peer_defence=<name>``, validated by the config like any
``--set``. Seeds: the node's question stream is ``arms.stream_seed(seed, 0)`` and ``train.seed`` is
``seed`` (as in the SAPO table), unless ``sets`` says otherwise; J (``swarm.peer_groups_per_round``) is
``DEFAULT_J`` unless ``sets`` says otherwise.

The summary (``summary``) holds the setup, every checkpoint, every round and what the verifier
rejected; ``write_summary`` puts it at ``<dir>/<arm>-seed<seed>.json`` (docs/poisoning/ by default), one
file per arm and seed, rewritten at each checkpoint with ``complete`` false until the last.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.poisoning import payloads
from benchmarks.poisoning.measure import ATTACK_WAYS, Checkpoint, Yardstick
from benchmarks.poisoning.peer import Attacker, HostileExchange, Receiver, attacker_stream
from benchmarks.poisoning.planner import PLAN_QUESTIONS, Planner
from benchmarks.sharing.arms import stream_seed
from swarmnode.common import log
from swarmnode.config import DRAW_STRIDE, NodeConfig, load_config, parse_override
from swarmnode.learn.batch import PEER_TOKEN_FACTOR, to_sequences
from swarmnode.round_record import RoundRecord
from swarmnode.rounds import RoundContext, run_round
from swarmnode.tasks import Question, TaskBank

DEFAULT_CONFIG = "node_configs/arithmetic-easy.yaml"
DEFAULT_J = 2  # peer groups a round: two attacker identities each fill one producer share
DEFENCE_KEY = "offpolicy.peer_defence"


@dataclass(frozen=True)
class ArmSpec:
    defence: str = "none"
    payload: str = "sentence-start"  # what the attack sends; a control sends none but is measured alike
    control: bool = False
    seed: int = 0
    rounds: int = 40
    every: int = 5
    questions: int = 8  # held-out questions for attack success, G samples each
    prompts: int = 4  # fixed prompts for the payload log-prob
    greedy: int = 64  # held-out questions answered greedily for attack success (0: none)
    attackers: int = 2
    config: str = DEFAULT_CONFIG
    sets: tuple[str, ...] = ()
    rotate: bool = False  # a fluent attacker sends every wording in turn (planner.Planner.plan)

    @property
    def name(self) -> str:
        name = f"control-{self.defence}" if self.control else f"{self.payload}-{self.defence}"
        return f"{name}-rotating" if self.rotate and not self.control else name

    def overrides(self) -> dict[str, Any]:
        """The config overrides of this arm, defaults first (module docstring), then ``sets``, then the
        defence. Raises ValueError if ``sets`` names the defence (that is what ``defence`` is for)."""
        sets = dict(parse_override(item) for item in self.sets)
        if DEFENCE_KEY in sets:
            raise ValueError(f"{DEFENCE_KEY} is set by the arm's defence (--defences), not by --set")
        out: dict[str, Any] = {
            "tasks.seed": stream_seed(self.seed, 0),
            "train.seed": self.seed,
            "swarm.peer_groups_per_round": DEFAULT_J,
            "run.metrics_port": None,
            "run.resume": False,
        }
        out.update(sets)
        out[DEFENCE_KEY] = self.defence
        return out


def arm_config(spec: ArmSpec, run_dir: Path | None = None) -> NodeConfig:
    """The arm's config (raises ConfigError, as ``--set`` does, on a bad defence name or override)."""
    overrides = spec.overrides()
    if run_dir is not None:
        overrides["run.run_dir"] = str(run_dir)
    return load_config(spec.config, overrides)


@dataclass
class ArmRun:
    """An arm as it runs: its rounds and checkpoints so far (``summary`` turns it into the JSON)."""

    spec: ArmSpec
    cfg: NodeConfig
    attackers: list[str]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    rejections: dict[str, int] = field(default_factory=dict)
    accepted_groups: int = 0
    placements: dict[str, int] = field(default_factory=dict)  # a fluent payload's placements, as chosen
    wall_s: float = 0.0
    complete: bool = False


def attacker_row(record: RoundRecord, exchange: HostileExchange, ctx: RoundContext, payload: str) -> dict:
    """A round's line: the node's record (``RoundRecord.as_dict``) and what the attackers got into it."""
    round_ = record.round
    chosen = exchange.log.chosen.get(round_, [])
    cfg = ctx.cfg
    sequences = to_sequences(
        chosen, ctx.policy.tokenizer, ctx.policy.tokenizer_fingerprint,
        scale_advantages=cfg.train.scale_advantages, system_prompt=cfg.sampling.system_prompt,
        max_new_tokens=cfg.sampling.max_new_tokens,
    )  # fmt: skip
    carrying = [
        s.advantage
        for s in sequences
        if payloads.detect(payload, ctx.policy.tokenizer.decode(s.completion_ids))
    ]
    row = record.as_dict()
    row.update(
        attacker_published=exchange.log.published.get(round_, 0),
        attacker_pooled=exchange.log.pooled.get(round_, 0),
        attacker_chosen=len(chosen),
        attacker_sequences=len(sequences),  # handed to the learner, before any defence
        attacker_tokens=sum(len(s.completion_ids) for s in sequences),
        payload_sequences=len(carrying),
        payload_advantage_min=min(carrying) if carrying else None,
    )
    return row


def make_planner(spec: ArmSpec, cfg: NodeConfig, bank: TaskBank, policy) -> Planner:
    """The adaptive attacker's planner for a fluent payload, on ``policy``'s weights as they are before
    the node's first round (the public base model), against the arm's defence, its floors from the first
    attacker's questions."""
    stream = attacker_stream(spec.seed, 0, cfg.tasks.eval_seed)
    refs = bank.draw(0, DRAW_STRIDE, seed=stream)[:PLAN_QUESTIONS]
    return Planner(
        spec.payload, spec.defence, policy.model, policy.tokenizer,
        temperature=cfg.sampling.temperature, system_prompt=cfg.sampling.system_prompt,
        questions=[bank.question(ref) for ref in refs], rotate=spec.rotate,
    )  # fmt: skip


def template_opening(kind: str) -> Callable[[Question], str]:
    """A template payload's opening: the fixed text before it (``payloads.span``)."""
    return lambda question: payloads.span(kind, question.answer)[0]


def run_arm(
    spec: ArmSpec,
    *,
    run_dir: Path | None = None,
    on_checkpoint: Callable[[ArmRun, Checkpoint], None] | None = None,
) -> ArmRun:
    """Run the arm (module docstring); ``on_checkpoint`` is called after each checkpoint's measures.
    Without ``run_dir`` the node's run folder is a temporary one, removed at the end."""
    from swarmnode.node import Node  # torch and the model: only when an arm runs

    payloads.check_kind(spec.payload)
    if spec.every < 1 or spec.rounds < 0:
        raise ValueError(f"every must be >= 1 and rounds >= 0 (got every={spec.every}, rounds={spec.rounds})")
    scratch = None if run_dir is not None else Path(tempfile.mkdtemp(prefix="swarmnode-poisoning-"))
    cfg = arm_config(spec, run_dir or scratch)
    t0 = time.perf_counter()
    node = Node(cfg)
    try:
        planner = (
            make_planner(spec, cfg, node.bank, node.policy) if spec.payload in payloads.FLUENT_KINDS else None
        )
        attacker = Attacker(
            cfg, node.bank, node.policy, payload=None if spec.control else spec.payload, seed=spec.seed,
            identities=spec.attackers, planner=None if spec.control else planner,
            node_style=planner is not None,
        )  # fmt: skip
        receiver = Receiver(cfg, node.bank, node.policy, rng_seed=spec.seed)
        exchange = HostileExchange(attacker, receiver, cfg.swarm.peer_groups_per_round)
        ctx = RoundContext(
            cfg=cfg, policy=node.policy, bank=node.bank, sampler=node.sampler, trainer=node.trainer,
            peer_id=node.peer_id, replay=node.replay, exchange=exchange,
        )  # fmt: skip
        yardstick = Yardstick(
            cfg,
            node.bank,
            node.policy,
            node.sampler,
            node.probe,
            questions=spec.questions,
            prompts=spec.prompts,
            payload=spec.payload,
            opening=planner.opening if planner is not None else template_opening(spec.payload),
            greedy=spec.greedy,
        )
        run = ArmRun(spec, cfg, attacker.peer_ids)

        def checkpoint(round_: int) -> None:
            measured = yardstick.take(round_)
            run.checkpoints.append(measured)
            run.rejections = exchange.rejections()
            run.accepted_groups = receiver.verifier.accepted_groups
            run.placements = dict(attacker.planner.placements) if attacker.planner is not None else {}
            run.wall_s = time.perf_counter() - t0
            if on_checkpoint is not None:
                on_checkpoint(run, measured)

        checkpoint(0)
        warned = False
        for round_ in range(1, spec.rounds + 1):
            record = run_round(ctx, round_)
            run.rounds.append(row := attacker_row(record, exchange, ctx, spec.payload))
            if row["attacker_chosen"] and not row["attacker_sequences"] and not warned:
                warned = True
                log(
                    f"round {round_}: the learner dropped every attacker group (completions over "
                    f"{PEER_TOKEN_FACTOR} x sampling.max_new_tokens tokens); raise sampling.max_new_tokens"
                )
            if round_ % spec.every == 0 or round_ == spec.rounds:
                run.complete = round_ == spec.rounds
                checkpoint(round_)
        run.complete = True
        return run
    finally:
        node.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def summary(run: ArmRun, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The arm's JSON summary (module docstring); ``extra`` (machine, command) is added as given."""
    spec, cfg = run.spec, run.cfg
    out: dict[str, Any] = {
        "arm": spec.name,
        "attack": not spec.control,
        "payload": None if spec.control else spec.payload,
        "measured_payload": spec.payload,
        "defence": spec.defence,
        "seed": spec.seed,
        "setup": {
            "config": spec.config,
            "sets": list(spec.sets),
            "rounds": spec.rounds,
            "every": spec.every,
            "questions": spec.questions,
            "rotate": spec.rotate,
            "prompts": spec.prompts,
            "greedy": spec.greedy,
            "attackers": spec.attackers,
            "J": cfg.swarm.peer_groups_per_round,
            "G": cfg.sampling.completions_per_question,
            "questions_per_round": cfg.sampling.questions_per_round,
            "max_new_tokens": cfg.sampling.max_new_tokens,
            "temperature": cfg.sampling.temperature,
            "lr": cfg.train.lr,
            "probe_questions_per_task": cfg.probe.questions_per_task,
            "overrides": spec.overrides(),
        },  # fmt: skip
        "attacker_peer_ids": run.attackers,
        "complete": run.complete,
        "wall_s": round(run.wall_s, 1),
        "accepted_groups": run.accepted_groups,
        "rejections": run.rejections,
        "placements": run.placements,
        "checkpoints": [c.as_dict() for c in run.checkpoints],
        "rounds": run.rounds,
    }
    out.update(extra or {})
    return out


def summary_path(directory: Path, spec: ArmSpec) -> Path:
    return directory / f"{spec.name}-seed{spec.seed}.json"


def write_summary(directory: Path, data: dict[str, Any], spec: ArmSpec) -> Path:
    """Write ``data`` (a ``summary``) atomically to ``summary_path``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = summary_path(directory, spec)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)
    return path


TABLE_HEADER = (
    f"{'arm':<28}{'round':>6}{'success':>10}{'t+o/g/g+o':>12}{'logp/tok':>10}{'logp sum':>10}{'pass@1':>8}"
    f"{'reward':>8}{'round s':>9}{'atk grp':>8}{'atk tok':>8}"
)


def table_line(run: ArmRun, measured: Checkpoint) -> str:
    """One checkpoint as a table row: attack success (at temperature; then with the opening, greedy,
    greedy with the opening) and log-prob of the arm's payload (a control: the payload it is measured
    against), the node's local reward and time of that round, and the attacker's groups and tokens handed
    to the learner in that round."""
    kind = run.spec.payload
    row = run.rounds[measured.round - 1] if measured.round else {}
    success = f"{measured.shown[kind]}/{measured.samples}"
    ways = "/".join(str(measured.attack.get(w, "-")) for w in ATTACK_WAYS[1:])

    def number(key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else "-"

    return (
        f"{run.spec.name:<28}{measured.round:>6}{success:>10}{ways:>12}{measured.logprob_token[kind]:>10.3f}"
        f"{measured.logprob_sum[kind]:>10.2f}{measured.pass_at_1:>8.3f}{number('reward_mean', '.3f'):>8}"
        f"{number('seconds_total', '.1f'):>9}{number('attacker_chosen', 'd'):>8}"
        f"{number('attacker_tokens', 'd'):>8}"
    )
