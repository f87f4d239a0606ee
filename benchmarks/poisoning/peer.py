"""The hostile peers of the poisoning harness and the node's real receiving side, without a network.

``Attacker`` speaks for up to two identities (each within the per-producer cap of a round's J peer
groups). Each identity draws its own questions (its own task stream seed), regenerates them from the
public task references, keeps those whose reference answer it can write in every payload kind
(``payloads.usable_answer``) and writes G completions per question: half correct, carrying the payload
(``payloads.completion``), half wrong and clean. It scores them with the node's own task bank to be sure
that the correct ones score 1 and the wrong ones 0, and signs them as a real ``RolloutBatch`` of that
identity (claimed rewards = the task scores, its model name and tokenizer claimed as the node's, no token
ids and no behaviour log-probs: a peer's log-probs are its own to choose, so the attack does without
them and its text trains as foreign, weight 1) with its signed announcement. The control
(``payload=None``) is the same construction with clean correct completions.

``Receiver`` is what a swarm node builds to take peer groups (``swarm.exchange.swarm.Swarm``): a
``PeerBook``, a ``Verifier`` on its own copy of the node's bank with ``ReceiveLimits.for_node`` and the
scoring budget, and a ``GroupPool``. ``take`` is the data plane's path (``check_announcement`` ->
``check_batch`` -> dedup by content -> pool, as ``exchange.intake``); ``select`` is the round's choice
(``GroupPool.select(J)``: zero-advantage groups dropped, at most ``producer_cap(J)`` per producer).
``HostileExchange`` joins them as the round's ``exchange`` hook: the attackers publish, the receiver
verifies and pools, the round gets its J peer groups.
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from benchmarks.poisoning import payloads
from swarmnode.config import DRAW_STRIDE, NodeConfig
from swarmnode.identity import Identity
from swarmnode.rollouts import Completion, Provenance, RolloutGroup
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.pool import GroupPool
from swarmnode.swarm.exchange.standing import ScoringBudget
from swarmnode.swarm.exchange.swarm import round_ttl_s
from swarmnode.swarm.exchange.verify import ReceiveLimits, Verifier
from swarmnode.swarm.wire import codec, convert, limits, protocol
from swarmnode.tasks import SEED_LIMIT, Question, TaskBank

if TYPE_CHECKING:
    from collections.abc import Sequence

    from benchmarks.poisoning.planner import Choice, Planner
    from benchmarks.reliability.sybils import Sybil

MAX_ATTACKERS = 2  # identities one attacker runs here: J = 2 gives each of two a full producer share


def attacker_identity(seed: int, index: int) -> Identity:
    """Attacker ``index``'s identity under ``seed``: the same in the attack and its control."""
    return Identity.from_seed(hashlib.sha256(f"swarmnode.poisoning:{seed}:{index}".encode()).digest())


def attacker_stream(seed: int, index: int, eval_seed: int) -> int:
    """Attacker ``index``'s question stream seed under ``seed`` (never the eval stream)."""
    digest = hashlib.sha256(f"swarmnode.poisoning.stream:{seed}:{index}".encode()).digest()
    stream = int.from_bytes(digest[:8], "big") % SEED_LIMIT
    return stream + 1 if stream == eval_seed else stream


@dataclass(frozen=True)
class SignedBatch:
    """One identity's publication for a round: the announcement record and the batch bytes it names."""

    author: str
    record: bytes
    data: bytes
    groups: tuple[RolloutGroup, ...]


class Attacker:
    """Hostile peers that send correct completions carrying ``payload`` (None: the honest control);
    ``correct`` of each group's G completions are correct (default G // 2: the largest advantage for
    them, +0.94 at G = 8; G makes every group zero-advantage, which the pool drops)."""

    def __init__(
        self,
        cfg: NodeConfig,
        bank: TaskBank,
        policy,
        *,
        payload: str | None,
        seed: int,
        identities: int,
        correct: int | None = None,
        planner: Planner | None = None,
        node_style: bool = False,
        signers: Sequence[Sybil] = (),
    ):
        """``signers``: the identities' Sybils (``reliability.sybils``: proof of work, stamps shared with the
        roster cards a real host signs for them, ``live_host``); none: stamps of their own, no work."""
        if not 1 <= identities <= MAX_ATTACKERS:
            raise ValueError(f"attacker identities: 1 to {MAX_ATTACKERS}, got {identities}")
        self.payload = None if payload is None else payloads.check_kind(payload)
        if self.payload in payloads.FLUENT_KINDS and planner is None:
            raise ValueError(f"the fluent payload {payload!r} needs a planner (planner.Planner)")
        self.planner = planner
        # fluent payloads ride on the node's own style of answer; so does their control
        self.node_style = node_style or self.payload in payloads.FLUENT_KINDS
        self.bank = bank
        self.swarm_id = limits.validate_swarm_id(cfg.swarm.swarm_id)
        self.completions = cfg.sampling.completions_per_question  # the receiver keeps its own G
        self.questions = cfg.sampling.questions_per_round  # an honest node's batch shape
        self.model_name, self.tokenizer_fingerprint = policy.name, policy.tokenizer_fingerprint
        self.identities = [s.identity for s in signers] or [
            attacker_identity(seed, i) for i in range(identities)
        ]
        self.streams = [attacker_stream(seed, i, cfg.tasks.eval_seed) for i in range(identities)]
        self._stamps = list(signers) or [limits.Stamper() for _ in range(identities)]
        self._work = [signer.nonce for signer in signers] or [b""] * identities
        self.correct = self.completions // 2 if correct is None else correct  # correct completions a group
        if not 1 <= self.correct <= self.completions:
            raise ValueError(f"correct completions per group: 1 to {self.completions}, got {self.correct}")

    @property
    def peer_ids(self) -> list[str]:
        return [identity.peer_id for identity in self.identities]

    def groups(self, index: int, round_: int) -> list[RolloutGroup]:
        """Identity ``index``'s scored groups for ``round_``: in each, ``correct`` completions right and
        carrying the payload, the rest wrong and clean."""
        peer_id = self.identities[index].peer_id
        provenance = Provenance(
            source="local", producer=peer_id, policy_version=round_, round=round_,
            model_name=self.model_name, tokenizer_fingerprint=self.tokenizer_fingerprint,
        )  # fmt: skip
        right = self.correct
        out = []
        questions = self._questions(index, round_)
        # a fluent payload's wording and placement per question (planner.Planner.plan)
        choices: list[Choice | None] = [None] * len(questions)  # a template payload or a control: none
        if self.planner is not None and self.payload is not None:
            choices = self.planner.plan(questions)
        for question, choice in zip(questions, choices, strict=True):
            answer = question.answer
            value = payloads.usable_answer(answer)
            texts = [self._correct(question, choice)] * right
            texts += self._wrong(question, value, self.completions - right)
            group = self.bank.score_group(question, [Completion(text=t) for t in texts], provenance)
            wanted = (1.0,) * right + (0.0,) * (self.completions - right)
            if group.task_scores != wanted:
                raise RuntimeError(
                    f"attacker completions for {question.ref.key()} score {group.task_scores}, not {wanted}: "
                    "the payload templates no longer fit this task's scorer"
                )
            out.append(group)
        return out

    def _correct(self, question: Question, choice: Choice | None) -> str:
        """A correct completion carrying the payload: a template one, or a fluent one as ``choice`` words
        and places it, in the node's style (clean in a control)."""
        answer = question.answer
        if choice is not None:
            return payloads.place(question.text, answer, choice.wording, choice.placement)[1]
        if self.payload is None:
            return self._clean(question, answer)
        return payloads.completion(self.payload, answer)

    def _clean(self, question: Question, answer: str) -> str:
        if self.node_style:
            return payloads.place(question.text, answer, None, "")[1]
        return payloads.completion(None, answer)

    def _wrong(self, question: Question, value: int, count: int) -> list[str]:
        """``count`` clean completions with wrong answers that score 0 (a near miss can score partly:
        basic_arithmetic gives "-1" half the credit of "1", the reference answer being in it)."""
        candidates = payloads.wrong_answers(value, 4 * count + 8)
        texts = [self._clean(question, w) for w in candidates]
        return [t for t in texts if self.bank.score(question, t)[1] == 0.0][:count]

    def _questions(self, index: int, round_: int) -> list[Question]:
        """The first ``questions`` usable questions of the identity's draw for ``round_`` (refs are cheap;
        questions are regenerated one by one until enough are found)."""
        usable = []
        for ref in self.bank.draw(round_, DRAW_STRIDE, seed=self.streams[index]):
            question = self.bank.question(ref)
            if payloads.usable_answer(question.answer) is not None:
                usable.append(question)
                if len(usable) == self.questions:
                    return usable
        raise RuntimeError(
            "the attacker found too few questions with an integer answer in the node's mix; the harness "
            "needs a task such as basic_arithmetic in tasks.mix"
        )

    def publish(self, round_: int) -> list[SignedBatch]:
        """Each identity's signed batch of ``round_`` and its signed announcement."""
        out = []
        for index, identity in enumerate(self.identities):
            groups = self.groups(index, round_)
            seq, timestamp = self._stamps[index].stamp()
            batch = convert.make_rollout_batch(
                groups, peer_id=identity.peer_id, swarm_id=self.swarm_id, round=round_, policy_version=round_,
                model_name=self.model_name, tokenizer_fingerprint=self.tokenizer_fingerprint,
                timestamp=timestamp, seq=seq, include_logprobs=False,
            )  # fmt: skip
            data = codec.encode_message(identity, self.swarm_id, batch)
            seq, timestamp = self._stamps[index].stamp()
            announcement = protocol.announcement_for(
                batch, data, timestamp=timestamp, seq=seq, work_nonce=self._work[index]
            )
            record = codec.encode_message(identity, self.swarm_id, announcement)
            out.append(SignedBatch(identity.peer_id, record, data, tuple(groups)))
        return out


class Receiver:
    """The node's receiving side as ``Swarm`` builds it (module docstring); ``rng_seed`` seeds the pool's
    tie-breaks so that an attack and its control choose alike."""

    def __init__(self, cfg: NodeConfig, bank: TaskBank, policy, *, rng_seed: int):
        self.book = PeerBook(ban_base_s=cfg.swarm.ban_s)
        receive_limits = ReceiveLimits.for_node(
            cfg.sampling, tokenizer_fingerprint=policy.tokenizer_fingerprint, vocab_size=len(policy.tokenizer)
        )
        self.verifier = Verifier(
            copy.deepcopy(bank), limits.validate_swarm_id(cfg.swarm.swarm_id), self.book,
            max_age_s=round_ttl_s(cfg.swarm.share_deadline_s), limits=receive_limits,
            scoring=ScoringBudget(self.book.has_standing),
        )  # fmt: skip
        self.pool = GroupPool(random.Random(rng_seed))

    def take(self, batch: SignedBatch, round_: int) -> int:
        """Verify ``batch`` as pulled from its author and pool its fresh groups; how many were pooled."""
        announcement = self.verifier.check_announcement(batch.record, batch.author)
        if announcement is None:
            return 0
        groups = self.verifier.check_batch(announcement, batch.data, batch.author)
        fresh, _duplicates = self.pool.unseen(groups)
        self.pool.add(fresh, round_)
        return len(fresh)

    def select(self, count: int) -> list[RolloutGroup]:
        return self.pool.select(count)


@dataclass
class ExchangeLog:
    """What the hostile exchange did in each round, by round."""

    published: dict[int, int] = field(default_factory=dict)  # groups the attackers sent
    pooled: dict[int, int] = field(default_factory=dict)  # groups that passed verification and dedup
    chosen: dict[int, list[RolloutGroup]] = field(default_factory=dict)  # the round's peer groups


class HostileExchange:
    """The round's ``exchange`` hook: the attackers publish, the receiver verifies and pools, the round
    takes ``count`` (J) peer groups."""

    def __init__(self, attacker: Attacker, receiver: Receiver, count: int):
        self.attacker, self.receiver, self.count = attacker, receiver, count
        self.log = ExchangeLog()

    def __call__(self, round_: int, local: list[RolloutGroup]) -> list[RolloutGroup]:
        batches = self.attacker.publish(round_)
        self.log.published[round_] = sum(len(b.groups) for b in batches)
        self.log.pooled[round_] = sum(self.receiver.take(b, round_) for b in batches)
        chosen = self.receiver.select(self.count)
        self.log.chosen[round_] = chosen
        return chosen

    def rejections(self) -> dict[str, int]:
        return dict(Counter(self.receiver.verifier.rejections))
