"""One RL round: questions -> completions -> rewards -> (peer exchange) -> advantages -> update.

The exchange step is a hook: a solo node has none; a swarm node publishes its local groups and returns
the verified peer groups that arrived before its deadline. Sampling and training each run under the heap
setting that suits them (``learn.heap``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from swarmnode.config import NodeConfig
from swarmnode.learn.batch import TrainSequence, own_untrained_sequences, to_sequences
from swarmnode.learn.heap import return_freed_heap, sampling_heap
from swarmnode.learn.peer_defence import budget_by_producer, rescue_only
from swarmnode.learn.replay import ReplayBuffer
from swarmnode.learn.trainer import Trainer
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Provenance, RolloutGroup
from swarmnode.round_record import RoundRecord
from swarmnode.sampler import Sampler
from swarmnode.tasks import TaskBank

Exchange = Callable[[int, list[RolloutGroup]], list[RolloutGroup]]


@dataclass
class RoundContext:
    cfg: NodeConfig
    policy: object  # swarmnode.policy.Policy
    bank: TaskBank
    sampler: Sampler
    trainer: Trainer
    peer_id: str
    replay: ReplayBuffer | None = None
    exchange: Exchange | None = None
    progress: Callable[[str], None] | None = None  # told what the round is doing now (the console)
    before_update: Callable[[], None] | None = None  # called just before the weights start to change
    # told, after the step, how many peer groups of each producer it trained on (``trained_peer_groups``)
    on_trained: Callable[[dict[str, int]], None] | None = None


def _say(ctx: RoundContext, what: str) -> None:
    if ctx.progress is not None:
        ctx.progress(what)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def sample_local(ctx: RoundContext, round_: int) -> tuple[list[RolloutGroup], int, float]:
    """This round's local question groups, scored; also returns the number of sampled tokens and the
    seconds spent scoring."""
    cfg = ctx.cfg
    refs = ctx.bank.draw(round_, cfg.sampling.questions_per_round)
    questions = [ctx.bank.question(ref) for ref in refs]
    prompts = [encode_prompt(ctx.policy.tokenizer, q.text, cfg.sampling.system_prompt) for q in questions]
    _say(ctx, f"sampling {len(prompts)} x {cfg.sampling.completions_per_question} completions")
    t_sample = time.perf_counter()
    with sampling_heap():
        completions = ctx.sampler.sample(
            prompts,
            cfg.sampling.completions_per_question,
            max_new_tokens=cfg.sampling.max_new_tokens,
            temperature=cfg.sampling.temperature,
            seed=cfg.train.seed * 1_000_003 + round_,
        )
    provenance = Provenance(
        source="local",
        producer=ctx.peer_id,
        policy_version=ctx.trainer.policy_version,
        round=round_,
        model_name=ctx.policy.name,
        tokenizer_fingerprint=ctx.policy.tokenizer_fingerprint,
    )
    t_score = time.perf_counter()
    tokens = sum(len(c.token_ids or ()) for group in completions for c in group)
    _say(ctx, f"sampled {tokens} tokens ({tokens / max(t_score - t_sample, 1e-9):.0f} tok/s); scoring")
    groups = [ctx.bank.score_group(q, c, provenance) for q, c in zip(questions, completions, strict=True)]
    return groups, tokens, time.perf_counter() - t_score


def trained_peer_groups(sequences: Sequence) -> dict[str, int]:
    """Per producer, the distinct peer groups among ``sequences`` (the ones handed to the step, after the
    node's own scoring and peer defence) that carry signal: at least one nonzero advantage. This is what
    earns a peer standing here (``PeerBook.credit_trained``): only what this node trained on counts."""
    groups: dict[str, set[int]] = defaultdict(set)
    for s in sequences:
        if s.group.provenance.source == "peer" and s.advantage != 0:
            groups[s.group.provenance.producer].add(id(s.group))
    return {producer: len(ids) for producer, ids in groups.items()}


def cap_groups(
    sequences: list[TrainSequence], max_groups: int | None
) -> tuple[list[TrainSequence], list[TrainSequence]]:
    """``train.max_groups``: the sequences of the first ``max_groups`` groups among ``sequences`` (every
    one of them informative: ``to_sequences`` dropped the rest), and the node's own sequences of the groups
    left out, at advantage 0 (they train on nothing, but are its own text of the round, which the span
    gate's floors read). None: no cap.

    The first in batch order: own groups in sampling order, then peer, then replayed. A round's question
    slots are drawn one by one, independently (``TaskBank.draw``), so the slot a group comes from says
    nothing of its task, difficulty or rewards: the first N informative own groups are as unbiased a sample
    of them as a seeded random choice, with no randomness to seed, and they are the groups a node sampling
    fewer questions would have had (slot j is the same question whatever the count), which keeps a capped
    node paired with uncapped ones of the same question stream. A swarm node's cap prefers its own groups.
    """
    if max_groups is None:
        return sequences, []
    kept_groups: set[int] = set()
    kept, left_out = [], []
    for s in sequences:
        if id(s.group) in kept_groups or len(kept_groups) < max_groups:
            kept_groups.add(id(s.group))
            kept.append(s)
        elif s.group.provenance.source == "local":
            left_out.append(replace(s, advantage=0.0))
    return kept, left_out


def run_round(ctx: RoundContext, round_: int) -> RoundRecord:
    """Run round ``round_`` and return its record."""
    t0 = time.perf_counter()
    local, sampled_tokens, seconds_score = sample_local(ctx, round_)
    return_freed_heap()
    t_sample = time.perf_counter()
    if ctx.exchange is not None:
        _say(ctx, "sharing with peers")
    peer_groups = ctx.exchange(round_, local) if ctx.exchange else []
    defence = ctx.cfg.offpolicy.peer_defence
    if defence == "rescue":
        peer_groups = rescue_only(peer_groups, local)
    t_share = time.perf_counter()
    replayed = []
    reincarnate_after = ctx.cfg.replay.reincarnate_after
    if reincarnate_after is not None and ctx.trainer.policy_version >= reincarnate_after:
        if not ctx.trainer.reincarnated:  # after a resume past T too: the reference is the resumed policy
            ctx.trainer.reincarnate()
    elif ctx.replay is not None:
        replayed = ctx.replay.sample(ctx.cfg.replay.groups_per_round, ctx.trainer.policy_version)
        ctx.replay.add(local)
    groups = local + peer_groups + replayed
    sequences = to_sequences(
        groups,
        ctx.policy.tokenizer,
        ctx.policy.tokenizer_fingerprint,
        scale_advantages=ctx.cfg.train.scale_advantages,
        system_prompt=ctx.cfg.sampling.system_prompt,
        max_new_tokens=ctx.cfg.sampling.max_new_tokens,
    )
    sequences, capped_out = cap_groups(sequences, ctx.cfg.train.max_groups)
    if defence == "token_budget":
        sequences = budget_by_producer(sequences)
    _say(ctx, f"training on {len(sequences)} sequences ({sum(s.length for s in sequences)} tokens)")
    if ctx.before_update is not None:
        ctx.before_update()
    # the span gate's floors read all of the round's own text, trained or not (learn/peer_defence.py)
    untrained = capped_out + own_untrained_sequences(
        local,
        ctx.policy.tokenizer,
        ctx.policy.tokenizer_fingerprint,
        system_prompt=ctx.cfg.sampling.system_prompt,
    )
    stats = ctx.trainer.step(sequences, floor_only=untrained)
    if ctx.on_trained is not None:
        ctx.on_trained(trained_peer_groups(sequences))
    ctx.trainer.release_gradients()
    return_freed_heap()
    t_train = time.perf_counter()
    with sampling_heap():
        sync_seconds = ctx.sampler.sync_weights()
    t_end = time.perf_counter()

    local_rewards = [r for g in local for r in g.rewards]
    per_task: dict[str, list[float]] = defaultdict(list)
    for g in local:
        per_task[g.ref.dataset].extend(g.rewards)
    return RoundRecord(
        round=round_,
        policy_version=ctx.trainer.policy_version,
        reward_mean=_mean(local_rewards),
        task_score_mean=_mean([s for g in local for s in g.task_scores]),
        reward_peer_mean=_mean([r for g in peer_groups for r in g.rewards]),
        format_rate=_mean([float(ok) for g in local for ok in g.format_ok]),
        reward_by_task={task: _mean(v) for task, v in sorted(per_task.items())},
        groups_total=len(groups),
        groups_local=len(local),
        groups_peer=len(peer_groups),
        groups_replayed=len(replayed),
        replay_dropped_stale=ctx.replay.dropped_stale if ctx.replay is not None else 0,
        reincarnated=ctx.trainer.reincarnated,
        groups_kept=len({id(s.group) for s in sequences}),
        sampled_tokens=sampled_tokens,
        sample_tokens_per_s=sampled_tokens / max(t_sample - t0 - seconds_score, 1e-9),
        seconds_sample=t_sample - t0 - seconds_score,
        seconds_score=seconds_score,
        seconds_share=t_share - t_sample,
        seconds_train=t_train - t_share,
        seconds_sync=sync_seconds,
        seconds_total=t_end - t0,
        train=stats,
    )
