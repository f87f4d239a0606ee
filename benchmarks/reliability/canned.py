"""Canned text that scores: valid rollout batches without a model, the cheapest way to be pulled and trained
on (the Sybil mix's ``canned``, ``future`` and ``churn`` identities publish them).

A canned group is four fixed completions of a fresh question of the swarm's own mix (``DATASET``, the mix's
config, seed ``SEED``, indexes counting up from ``INDEX_BASE``: never an honest node's draw, and never
the same question twice, so a receiver's content dedup keeps none out): the right answer in tags, the
right answer untagged, a wrong answer in tags, no answer. Its claimed rewards are reasoning-gym's task
scores, exactly what a receiver recomputes, and they differ, so the group carries signal after the
receiver's own scoring: a learner would train on it. Nothing in it needs a model, and nothing in it is
worth learning.
"""

from __future__ import annotations

import itertools
import threading

from benchmarks.reliability.sybils import Sybil

DATASET = "basic_arithmetic"  # in tiny.yaml's mix; its answers are plain numbers
SEED = 4242  # not the eval seed, not an honest node's (they derive theirs from their peer ids)
INDEX_BASE = 2_000_000_000  # tasks.INDEX_LIMIT is 2**31; honest nodes draw from round * I + j
WRONG = "<answer>12345</answer>"


class Canned:
    """Canned groups and batches for one swarm's mix (``cfg``: the swarm's node config). Thread-safe."""

    def __init__(self, cfg, index_base: int = INDEX_BASE):
        from swarmnode.tasks import TaskBank

        self.bank = TaskBank(cfg.tasks, default_seed=SEED)
        self.fingerprint = TaskBank(cfg.tasks, default_seed=0).fingerprint  # what the roster cards carry
        self.model_name = cfg.model.name  # what an honest node of this swarm calls its model
        self.groups_per_batch = cfg.sampling.questions_per_round  # as many as an honest node's batch
        self._config = cfg.tasks.mix[DATASET].config
        self._indexes = itertools.count(index_base)
        self._lock = threading.Lock()  # the task bank's dataset cache is not shared across threads

    def group(self):
        """One canned group (``protocol.WireGroup``) of a fresh question (module docstring)."""
        from swarmnode.rollouts import TaskRef
        from swarmnode.swarm.wire import convert, protocol

        with self._lock:
            ref = TaskRef.make(DATASET, SEED, next(self._indexes), self._config)
            question = self.bank.question(ref)
            right = question.answer
            texts = [f"<answer>{right}</answer>", f"The answer is {right}.", WRONG, "I do not know."]
            scores = [float(self.bank.score(question, text)[1]) for text in texts]
        return protocol.WireGroup(
            task=convert.task_to_wire(ref),
            completions=tuple(protocol.WireCompletion(text=text, n_tokens=0) for text in texts),
            claimed_rewards=tuple(scores),
        )

    def batch(self, sybil: Sybil, swarm_id: str, round_: int) -> tuple[bytes, bytes]:
        """A signed batch of fresh canned groups (as many as an honest batch) by ``sybil``, and its
        announcement (both dated as ``sybil`` dates them): (payload, announcement record)."""
        from swarmnode.swarm.wire import codec, limits, protocol

        seq, timestamp = sybil.stamp()
        batch = protocol.RolloutBatch(
            peer_id=sybil.peer_id, swarm_id=swarm_id, round=round_, policy_version=0,
            model_name=self.model_name, tokenizer_fingerprint="", timestamp=timestamp, seq=seq,
            groups=tuple(self.group() for _ in range(self.groups_per_batch)),
        )  # fmt: skip
        data = codec.encode_message(sybil.identity, swarm_id, batch)
        digest = limits.payload_digest(data)
        return data, sybil.announcement(swarm_id, round_, digest, len(data), len(batch.groups))
