"""One RL round: questions -> completions -> rewards -> (peer exchange) -> advantages -> update.

The exchange step is a hook: a solo node has none; a swarm node publishes its local groups and returns
the verified peer groups that arrived before its deadline. Sampling and training each run under the heap
setting that suits them (``learn.heap``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from swarmnode.config import NodeConfig
from swarmnode.learn.batch import TrainSequence, own_untrained_sequences, to_sequences
from swarmnode.learn.heap import return_freed_heap, sampling_heap
from swarmnode.learn.peer_defence import budget_by_producer, rescue_only
from swarmnode.learn.replay import ReplayBuffer
from swarmnode.learn.trainer import Trainer
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Provenance, RolloutGroup, TaskRef
from swarmnode.round_record import RoundRecord
from swarmnode.sampler import Sampler
from swarmnode.tasks import Question, TaskBank

Exchange = Callable[[int, list[RolloutGroup]], list[RolloutGroup]]
RESAMPLE_SEED_OFFSET = 500_000  # the ``questions`` defence's sampling seed: apart from the round's own draws


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
    refs = ctx.bank.draw(round_, ctx.cfg.sampling.questions_per_round)
    questions = [ctx.bank.question(ref) for ref in refs]
    return _sample(ctx, round_, questions, ctx.cfg.train.seed * 1_000_003 + round_)


def resample_peer_questions(
    ctx: RoundContext, round_: int, peer_groups: Sequence[RolloutGroup]
) -> tuple[list[RolloutGroup], dict[int, str], int, float]:
    """``offpolicy.peer_defence=questions`` ("questions, not text"): this node's own completions of the
    questions its peers' groups were informative on, in place of the peers' text, so no peer token is
    ever trained on and no payload can ride on one. A peer still tells the node which questions are worth
    practising (ones its policy got partly right, which a node of the same model likely gets partly right
    too: an informative group). The question is regenerated from its task reference (``TaskBank.question``),
    never read from the peer. Returns the own groups (one per distinct question, in exchange order), which
    peer pointed to each (``id(group)`` -> producer: its credit, ``trained_peer_groups``), the tokens
    sampled and the seconds spent scoring. The extra sampling is bounded by J questions a round."""
    pointed: dict[str, tuple[TaskRef, str]] = {}
    for group in peer_groups:
        pointed.setdefault(group.ref.key(), (group.ref, group.provenance.producer))
    questions = [ctx.bank.question(ref) for ref, _ in pointed.values()]
    seed = ctx.cfg.train.seed * 1_000_003 + round_ + RESAMPLE_SEED_OFFSET
    groups, tokens, seconds_score = _sample(ctx, round_, questions, seed)
    producers = {id(g): producer for g, (_, producer) in zip(groups, pointed.values(), strict=True)}
    return groups, producers, tokens, seconds_score


def _sample(
    ctx: RoundContext, round_: int, questions: list[Question], seed: int
) -> tuple[list[RolloutGroup], int, float]:
    """G completions of each of ``questions`` by this node's policy, scored by its verifier: the groups,
    the tokens sampled and the seconds spent scoring."""
    cfg = ctx.cfg
    prompts = [encode_prompt(ctx.policy.tokenizer, q.text, cfg.sampling.system_prompt) for q in questions]
    _say(ctx, f"sampling {len(prompts)} x {cfg.sampling.completions_per_question} completions")
    t_sample = time.perf_counter()
    with sampling_heap():
        completions = ctx.sampler.sample(
            prompts,
            cfg.sampling.completions_per_question,
            max_new_tokens=cfg.sampling.max_new_tokens,
            temperature=cfg.sampling.temperature,
            seed=seed,
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


def trained_peer_groups(sequences: Sequence, pointed: Mapping[int, str] | None = None) -> dict[str, int]:
    """Per producer, the distinct peer groups among ``sequences`` (the ones handed to the step, after the
    node's own scoring and peer defence) that carry signal: at least one nonzero advantage. This is what
    earns a peer standing here (``PeerBook.credit_trained``): only what this node trained on counts. With
    ``pointed`` (``resample_peer_questions``), an own group of a question a peer pointed to counts for that
    peer the same way."""
    pointed = pointed or {}
    groups: dict[str, set[int]] = defaultdict(set)
    for s in sequences:
        if s.advantage == 0:
            continue
        if s.group.provenance.source == "peer":
            groups[s.group.provenance.producer].add(id(s.group))
        elif id(s.group) in pointed:
            groups[pointed[id(s.group)]].add(id(s.group))
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
    peer_text, resampled, pointed, seconds_resample = peer_groups, [], {}, 0.0
    if defence == "questions" and peer_groups:  # counted as sampling and scoring, not sharing
        t_resample = time.perf_counter()
        peer_text = []
        resampled, pointed, more_tokens, more_score = resample_peer_questions(ctx, round_, peer_groups)
        return_freed_heap()
        sampled_tokens, seconds_score = sampled_tokens + more_tokens, seconds_score + more_score
        seconds_resample = time.perf_counter() - t_resample
    local_trained = local + resampled
    t_share = time.perf_counter()
    replayed = []
    reincarnate_after = ctx.cfg.replay.reincarnate_after
    if reincarnate_after is not None and ctx.trainer.policy_version >= reincarnate_after:
        if not ctx.trainer.reincarnated:  # after a resume past T too: the reference is the resumed policy
            ctx.trainer.reincarnate()
    elif ctx.replay is not None:
        replayed = ctx.replay.sample(ctx.cfg.replay.groups_per_round, ctx.trainer.policy_version)
        ctx.replay.add(local)
    groups = local_trained + peer_text + replayed
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
        local_trained,
        ctx.policy.tokenizer,
        ctx.policy.tokenizer_fingerprint,
        system_prompt=ctx.cfg.sampling.system_prompt,
    )
    stats = ctx.trainer.step(sequences, floor_only=untrained)
    if ctx.on_trained is not None:
        ctx.on_trained(trained_peer_groups(sequences, pointed))
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
        sample_tokens_per_s=sampled_tokens / max(t_sample - t0 + seconds_resample - seconds_score, 1e-9),
        seconds_sample=t_sample - t0 + seconds_resample - seconds_score,
        seconds_score=seconds_score,
        seconds_share=t_share - t_sample - seconds_resample,
        seconds_train=t_train - t_share,
        seconds_sync=sync_seconds,
        seconds_total=t_end - t0,
        train=stats,
    )
