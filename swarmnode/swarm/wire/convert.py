"""Rollouts <-> wire types. Rewards on the wire are claims, never inputs.

The publishing side turns this node's ``RolloutGroup``s into a ``RolloutBatch`` (``make_rollout_batch``);
the receiving side (``swarm.verify.Verifier.check_batch``) turns a verified batch's groups back into
task references and completions (``task_from_wire``, ``completion_from_wire``, ``batch_provenance``),
regenerates each question and recomputes every reward itself.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef
from swarmnode.swarm.wire.protocol import RolloutBatch, WireCompletion, WireGroup, WireTask, pack_array


def task_to_wire(ref: TaskRef) -> WireTask:
    return WireTask(dataset=ref.dataset, config=ref.config_dict(), seed=ref.seed, index=ref.index)


def task_from_wire(task: WireTask) -> TaskRef:
    return TaskRef.make(task.dataset, task.seed, task.index, task.config)


def completion_to_wire(
    c: Completion, *, include_logprobs: bool = True, n_tokens: int | None = None
) -> WireCompletion:
    """``n_tokens`` defaults to the length of ``token_ids`` or ``logprobs`` (0 when neither is known).
    Log-probs travel as float32 and token ids as uint32; both only when their length is ``n_tokens``."""
    if n_tokens is None:
        n_tokens = len(c.token_ids) if c.token_ids is not None else len(c.logprobs or ())
    ids = tuple(c.token_ids) if c.token_ids is not None and len(c.token_ids) == n_tokens else None
    lps = c.logprobs if include_logprobs and c.logprobs is not None and len(c.logprobs) == n_tokens else None
    if lps is not None:  # round to float32 now, so the wire object equals what the receiver decodes
        lps = struct.unpack(f"<{len(lps)}f", pack_array("f", [float(x) for x in lps], "logprobs"))
    return WireCompletion(
        text=c.text,
        n_tokens=n_tokens,
        finished=c.finished,
        logprobs=lps,
        token_ids=None if ids is None else tuple(int(x) for x in ids),
    )


def completion_from_wire(c: WireCompletion) -> Completion:
    return Completion(text=c.text, token_ids=c.token_ids, logprobs=c.logprobs, finished=c.finished)


def group_to_wire(group: RolloutGroup, *, include_logprobs: bool = True) -> WireGroup:
    """Claimed rewards are the task scores (no format bonus), which every honest verifier reproduces
    whatever its own format_reward setting."""
    return WireGroup(
        task=task_to_wire(group.ref),
        completions=tuple(
            completion_to_wire(c, include_logprobs=include_logprobs) for c in group.completions
        ),
        claimed_rewards=tuple(float(r) for r in group.task_scores),
    )


def make_rollout_batch(
    groups: Sequence[RolloutGroup],
    *,
    peer_id: str,
    swarm_id: str,
    round: int,
    policy_version: int,
    model_name: str,
    tokenizer_fingerprint: str,
    timestamp: float,
    seq: int,
    include_logprobs: bool = True,
) -> RolloutBatch:
    return RolloutBatch(
        peer_id=peer_id,
        swarm_id=swarm_id,
        round=round,
        policy_version=policy_version,
        model_name=model_name,
        tokenizer_fingerprint=tokenizer_fingerprint,
        timestamp=float(timestamp),
        seq=seq,
        groups=tuple(group_to_wire(g, include_logprobs=include_logprobs) for g in groups),
    )


def batch_provenance(batch: RolloutBatch) -> Provenance:
    return Provenance(
        source="peer",
        producer=batch.peer_id,
        policy_version=batch.policy_version,
        round=batch.round,
        model_name=batch.model_name,
        tokenizer_fingerprint=batch.tokenizer_fingerprint,
    )
