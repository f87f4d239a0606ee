"""Verification of what peers send: trust nothing but the completion text.

Two entry points, one per channel, each cheapest check first (the order is the code's):

- ``check_announcement(record, subkey_peer)``, a ``BatchAnnouncement`` read from the DHT or carried by a
  notice: ban, size, signature by the subkey's peer, freshness, sequence number (a record read twice is a
  silent duplicate, an older one a ``replay``). A record rejected for a reason that cannot change is not
  counted again when the next poll reads it again.
- ``check_batch(announcement, data, stream_peer)``, the ``RolloutBatch`` pulled from any holder (its
  author or a peer that verified it): ban, already accepted, rate limit, length and sha256 against the
  announcement, signature, freshness, sequence number, log-probs in range, token ids in this node's
  vocabulary (when the batch claims its tokenizer), task refs in its mix; each group cut to what this node
  samples itself (its first G completions; a text over ``max_new_tokens`` x TEXT_BYTES_PER_TOKEN bytes
  drops the group, unscored and uncharged: ``over_cap``); every question regenerated and every completion
  scored here within the scoring budget (``ReceiveLimits``, ``over_budget``); the claimed rewards must
  agree. Out come ``RolloutGroup``s with rewards computed here; the peer's token ids and log-probs are
  kept, and the learner uses them only where its ids equal its own (``learn.batch.to_sequences``).

Claimed rewards are *task scores*, without any format bonus, so nodes with different
``tasks.format_reward`` agree on them, and an honest peer never disagrees: a disagreement is a strike.
What a batch can cost is bounded: decoding is linear in its <= 4 MiB, and scoring stops within one answer
of the budget, since only audited datasets (``tasks.AUDITED_DATASETS``) may be in a swarm node's mix,
each under ~10 ms an answer at its answer cap (``tests/unit/test_scorer_audit.py``).

Who is charged (PROTOCOL.md section 6): only a peer that provably sent the offending bytes. Rejected DHT
records charge nobody (anyone can write any subkey, and old records can be written back); bytes that do
not match the announcement charge the stream peer that sent them (``hash_mismatch``); every other
rejection charges the author, whose signature the bytes carry, except ``stale`` (clocks, our own delays)
and ``internal_error`` (our fault). Rate limits count the author's batches.

Nothing here raises on bad input: every path returns None or [] and counts one reason (Prometheus label
values: ``REJECT_REASONS`` from the protocol plus ``VERIFY_REASONS``). Not thread-safe: one thread calls a
``Verifier`` (the ``PeerBook`` may be shared); other threads read the counts through ``rejected``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from swarmnode.common import BoundedSet
from swarmnode.config import SamplingConfig
from swarmnode.errors import ConfigError, TaskError
from swarmnode.rollouts import RolloutGroup, TaskRef
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.standing import ScoringBudget
from swarmnode.swarm.wire.codec import check_payload, decode_message
from swarmnode.swarm.wire.convert import batch_provenance, completion_from_wire, task_from_wire
from swarmnode.swarm.wire.dht_rules import announce_ttl_s
from swarmnode.swarm.wire.limits import (
    BATCH_ANNOUNCEMENT,
    MAX_COMPLETION_TEXT_BYTES,
    MAX_COMPLETION_TOKENS,
    MAX_COMPLETIONS_PER_GROUP,
    MAX_GROUPS_PER_BATCH,
    REJECT_REASONS,
    ROLLOUT_BATCH,
    ProtocolError,
    check_fresh,
    payload_digest,
)
from swarmnode.swarm.wire.protocol import BatchAnnouncement, RolloutBatch, WireGroup, WireTask
from swarmnode.tasks import AUDITED_DATASETS, CODE_EVAL_SCORERS, TaskBank

log = logging.getLogger(__name__)

VERIFY_REASONS = (
    "banned",  # the sender is banned (nothing else was looked at)
    "rate_limited",  # the sender is over its batch or byte rate (a flood: bans)
    "duplicate_payload",  # a payload already accepted (not the sender's fault: no strike)
    "bad_task",  # a task ref outside this node's mix (dataset, config, seed/index range, eval seed)
    "reward_mismatch",  # claimed rewards differ from the task scores recomputed here
    "bad_logprobs",  # per-token log-probs positive or implausibly small
    "bad_token_ids",  # a token id outside this node's vocabulary in a batch that claims its tokenizer
    "over_cap",  # a group beyond this node's own G or max_new_tokens: dropped alone, unscored, uncharged
    "over_budget",  # scoring the batch ran past the budget (charged when its CPU budget ran out)
    "internal_error",  # an unexpected exception while checking (logged; never the peer's charge)
)
ALL_REASONS = REJECT_REASONS + VERIFY_REASONS

DEFAULT_MAX_AGE_S = announce_ttl_s(60.0)  # announcement TTL for one-minute rounds
LOGPROB_MIN = -100.0  # a sampled token with probability below e**-100 did not come from sampling
LOGPROB_MAX = 1e-4  # log-probs are <= 0; a hair above is float32 rounding of log(1)
_ACCEPTED_DIGESTS = 65536  # payload sha256s remembered for dedup (2 MiB)
# Not the sender's fault or not evidence of it: counted, never charged.
_NOT_CHARGED = frozenset({"banned", "duplicate_payload", "stale", "internal_error"})
# A DHT record is re-read at every poll. One rejected for a reason that cannot change is remembered by its
# (subkey, sha256) and ignored when read again, so each bad record is counted once; these reasons can
# change with time (a ban ends, a clock catches up), so records rejected for them are checked again.
_RECHECKED = frozenset({"banned", "stale", "internal_error"})
_REJECTED_RECORDS = 4096  # remembered rejected records (about 200 KiB)
SCORE_BUDGET_CPU_S = 2.0  # CPU seconds the verifying thread spends scoring one peer batch
SCORE_BUDGET_WALL_S = 6.0  # wall seconds for the same: bounds the round's wait on a busy host
# A wall overrun charges the sender only if the batch had used this share of the CPU budget by then:
# honest batches cost milliseconds (0.5 s is ~10x the costliest honest batch this node keeps), and a
# host too busy to give scoring even that much CPU is not the sender's fault. Measured on a loaded
# 2-core host: the costly hostile batch got 1.1 s of CPU in the 6 s wall budget.
WALL_OVERRUN_CHARGE_FRACTION = 0.25
TEXT_BYTES_PER_TOKEN = 16  # a completion of n tokens holds at most n x this many bytes of text here


@dataclass(frozen=True)
class ReceiveLimits:
    """What this node takes from a peer's batch and spends on it; ``for_node`` derives it from its own
    config (the defaults are the wire maxima and the default budget)."""

    completions_per_group: int = MAX_COMPLETIONS_PER_GROUP
    text_bytes: int = MAX_COMPLETION_TEXT_BYTES
    tokenizer_fingerprint: str = ""  # this node's: a batch claiming it must use ids < vocab_size
    vocab_size: int | None = None
    score_cpu_s: float = SCORE_BUDGET_CPU_S
    score_wall_s: float = SCORE_BUDGET_WALL_S

    @classmethod
    def for_node(
        cls, sampling: SamplingConfig, *, tokenizer_fingerprint: str, vocab_size: int
    ) -> ReceiveLimits:
        """Limits from this node's sampling config; raises ConfigError if that config could not be sent
        on the wire itself (it would fail at every publish)."""
        for field, value, limit in (
            ("completions_per_question", sampling.completions_per_question, MAX_COMPLETIONS_PER_GROUP),
            ("questions_per_round", sampling.questions_per_round, MAX_GROUPS_PER_BATCH),
            ("max_new_tokens", sampling.max_new_tokens, MAX_COMPLETION_TOKENS),
        ):
            if value > limit:
                raise ConfigError(
                    f"sampling.{field} = {value}: the wire protocol carries at most {limit}; lower it to "
                    "join a swarm"
                )
        return cls(
            completions_per_group=sampling.completions_per_question,
            text_bytes=min(sampling.max_new_tokens * TEXT_BYTES_PER_TOKEN, MAX_COMPLETION_TEXT_BYTES),
            tokenizer_fingerprint=tokenizer_fingerprint,
            vocab_size=vocab_size,
        )


class _Rejected(Exception):
    def __init__(self, reason: str, detail: str = "", *, charged: bool = True):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail, self.charged = reason, detail, charged


class Verifier:
    """Checks peers' announcements and batches against this node's task bank and peer book."""

    def __init__(
        self,
        bank: TaskBank,
        swarm_id: str,
        book: PeerBook,
        *,
        clock: Callable[[], float] = time.time,
        reward_tolerance: float = 1e-3,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        limits: ReceiveLimits | None = None,
        scoring: ScoringBudget | None = None,
    ) -> None:
        """``clock`` is wall-clock unix time (message timestamps); ``max_age_s`` is how old an
        announcement or batch may be on arrival: ``dht_rules.announce_ttl_s(round period)``; ``limits``
        what this node takes and spends per batch (default: wire maxima, default budget); ``scoring``
        the CPU all batches of a share may take together (exchange/standing.py; None: only per batch).

        Raises ConfigError if the bank's mix has a dataset whose scorer evaluates answer text as code
        (``tasks.CODE_EVAL_SCORERS``): scoring peers' completions with it would let them run code here;
        or any dataset not audited for scoring untrusted answers (``tasks.AUDITED_DATASETS``).
        """
        unsafe = sorted(CODE_EVAL_SCORERS & set(bank.tasks.mix))
        if unsafe:
            raise ConfigError(
                f"tasks.mix.{unsafe[0]}: reasoning-gym scores its answers by evaluating the answer text as "
                "Python (sympy parse_expr), so a peer's completion could run code on this node; a swarm node "
                f"cannot use it. Remove {', '.join(unsafe)} from the mix or train on it with `swarmnode solo`"
            )
        unaudited = sorted(set(bank.tasks.mix) - AUDITED_DATASETS)
        if unaudited:
            raise ConfigError(
                f"tasks.mix.{unaudited[0]}: its scorer has not been audited for scoring untrusted answers "
                f"(cost and gaming), so a swarm node cannot take peers' groups for it. Audited: "
                f"{', '.join(sorted(AUDITED_DATASETS))}. Remove {', '.join(unaudited)} from the mix or "
                "train on it with `swarmnode solo`"
            )
        self.bank = bank
        self.swarm_id = swarm_id
        self.limits = limits or ReceiveLimits()
        self.scoring = scoring
        self.monotonic = time.monotonic  # the wall-budget clock (tests replace it)
        self.book = book
        self.clock = clock
        self.reward_tolerance = reward_tolerance
        self.max_age_s = max_age_s
        self.rejections: Counter[str] = Counter()  # read by other threads through ``rejected``
        self._rejections_lock = threading.Lock()
        self.accepted_groups = 0
        self.accepted_batches = 0
        self._accepted: BoundedSet[bytes] = BoundedSet(_ACCEPTED_DIGESTS)
        self._rejected_records: BoundedSet[tuple[str, bytes]] = BoundedSet(_REJECTED_RECORDS)
        self._internal_errors_logged = False

    # --- DHT records -----------------------------------------------------------------------------
    def check_announcement(self, record: bytes, subkey_peer: str) -> BatchAnnouncement | None:
        """The announcement in a DHT ``record`` stored under ``subkey_peer`` (or passed on by a holder),
        or None: rejected and counted; or not counted, a record already seen or one older than an
        announcement already seen from its author (superseded). Never charges a peer: anyone can write
        any subkey."""
        seen = None
        try:
            if not isinstance(record, bytes | bytearray | memoryview):
                raise _Rejected("malformed", f"record is {type(record).__name__}, not bytes")
            if not isinstance(subkey_peer, str):
                raise _Rejected("wrong_sender", f"subkey is {type(subkey_peer).__name__}, not a peer id")
            seen = (subkey_peer, payload_digest(bytes(record)))
            if seen in self._rejected_records:  # counted when it was first read
                return None
            if self.book.is_banned(subkey_peer):
                raise _Rejected("banned")
            msg, sender = decode_message(
                bytes(record),
                swarm_id=self.swarm_id,
                expected_type=BATCH_ANNOUNCEMENT,
                expected_peer_id=subkey_peer,
            )
            assert isinstance(msg, BatchAnnouncement)
            check_fresh(msg.timestamp, self.clock(), max_age=self.max_age_s)
            seen_as = self.book.check_sequence(
                sender, BATCH_ANNOUNCEMENT, msg.seq, payload_digest(record), msg.timestamp
            )
            return msg if seen_as == "new" else None
        except (ProtocolError, _Rejected) as e:
            self._count(e.reason, subkey_peer, e.detail)
            if seen is not None and e.reason not in _RECHECKED:
                self._rejected_records.add(seen)
        except Exception:  # noqa: BLE001 - the network edge answers, it does not crash
            self._internal_error(subkey_peer)
        return None

    def already_accepted(self, payload_sha256: bytes) -> bool:
        """True if a payload with this sha256 was accepted already: no need to pull it."""
        return bytes(payload_sha256) in self._accepted

    def count_repeat(self, announcement: BatchAnnouncement, peer: str) -> None:
        """``peer`` announced anew a payload this node has already pulled: the caller does not pull it
        again; counted as ``duplicate_payload``, charged to nobody (re-announcing old data gains nothing)."""
        self._count(
            "duplicate_payload", peer, f"payload {announcement.payload_sha256.hex()[:16]} re-announced"
        )

    # --- payloads --------------------------------------------------------------------------------
    def can_score(self, author: str) -> bool:
        """Whether the share of the scoring CPU ``author`` belongs to holds enough for a batch now."""
        return self.scoring is None or self.scoring.can_score(author)

    def check_bytes(self, announcement: BatchAnnouncement, data: bytes, holder: str) -> bool:
        """Whether ``data`` are the announced bytes (length, sha256); if not, ``hash_mismatch`` is counted
        and charged to ``holder``, whose stream sent them (the batch's other holders may still serve it)."""
        if len(data) == announcement.payload_len and payload_digest(data) == announcement.payload_sha256:
            return True
        self._count("hash_mismatch", holder, f"{len(data)} bytes do not match the announced payload")
        self.book.strike(holder, "hash_mismatch")
        return False

    def check_batch(
        self, announcement: BatchAnnouncement, data: bytes, stream_peer: str
    ) -> list[RolloutGroup]:
        """The verified, locally scored groups of the batch ``data`` that ``stream_peer`` sent for
        ``announcement`` (from ``check_announcement``), or [] (rejected and counted)."""
        try:
            groups = self._verify_batch(announcement, data, stream_peer)
        except (ProtocolError, _Rejected) as e:
            culprit = stream_peer if e.reason == "hash_mismatch" else announcement.peer_id
            self._count(e.reason, culprit, e.detail)
            charged = e.reason not in _NOT_CHARGED and getattr(e, "charged", True)
            if charged:
                self.book.strike(culprit, e.reason)
            if e.reason == "over_budget":  # rare (the sender is struck) and worth an operator's eye
                log.warning(
                    "scoring a batch from %s ran over budget: %s; rejected%s",
                    culprit, e.detail, ", sender charged" if charged else "",
                )  # fmt: skip
            return []
        except Exception:  # noqa: BLE001 - peer data must never crash the node
            self._internal_error(stream_peer)
            return []
        self._accepted.add(bytes(announcement.payload_sha256))
        self.accepted_batches += 1
        self.accepted_groups += len(groups)
        self.book.reward(announcement.peer_id, len(groups))
        return groups

    def _verify_batch(
        self, announcement: BatchAnnouncement, data: bytes, stream_peer: str
    ) -> list[RolloutGroup]:
        author = announcement.peer_id
        if self.book.is_banned(stream_peer) or self.book.is_banned(author):
            raise _Rejected("banned")
        if self.already_accepted(announcement.payload_sha256):
            raise _Rejected("duplicate_payload")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise _Rejected("malformed", f"payload is {type(data).__name__}, not bytes")
        data = bytes(data)
        if not self.book.allow(author, len(data)):
            raise _Rejected("rate_limited", f"{len(data)} bytes")
        batch = check_payload(announcement, data, swarm_id=self.swarm_id)
        check_fresh(batch.timestamp, self.clock(), max_age=self.max_age_s)
        # PROTOCOL.md section 7 applies to batches too: without it a peer could re-sign an accepted batch
        # under its old seq (new bytes, so a new sha256) and have the same groups trained on twice. A
        # superseded batch (pulled after a newer one of its author) is verified like a new one.
        seen_as = self.book.check_sequence(
            author, ROLLOUT_BATCH, batch.seq, announcement.payload_sha256, batch.timestamp
        )
        if seen_as == "duplicate":
            raise _Rejected("duplicate_payload", "these exact bytes were checked before")
        self._check_logprobs(batch)
        self._check_token_ids(batch)
        refs = [self._check_ref(g.task) for g in batch.groups]
        return self._score(batch, refs)

    def _check_token_ids(self, batch: RolloutBatch) -> None:
        """A batch that claims this node's tokenizer must use ids of its vocabulary (ids of another
        tokenizer are never used, so not checked)."""
        vocab = self.limits.vocab_size
        if vocab is None or batch.tokenizer_fingerprint != self.limits.tokenizer_fingerprint:
            return
        for i, group in enumerate(batch.groups):
            for j, completion in enumerate(group.completions):
                if completion.token_ids and max(completion.token_ids) >= vocab:
                    raise _Rejected("bad_token_ids", f"groups[{i}].completions[{j}]: id >= {vocab}")

    def _within_caps(self, i: int, wire: WireGroup, peer: str) -> WireGroup | None:
        """The group cut to what this node samples itself (its first G completions), or None if a kept
        completion's text is longer than this node would sample (counted as ``over_cap``)."""
        n = self.limits.completions_per_group
        if len(wire.completions) > n:
            wire = replace(wire, completions=wire.completions[:n], claimed_rewards=wire.claimed_rewards[:n])
        limit = self.limits.text_bytes
        if any(len(c.text.encode("utf-8", "surrogatepass")) > limit for c in wire.completions):
            self._count("over_cap", peer, f"groups[{i}]: a completion over {limit} bytes")
            return None
        return wire

    def _check_logprobs(self, batch: RolloutBatch) -> None:
        for i, group in enumerate(batch.groups):
            for j, completion in enumerate(group.completions):
                if completion.logprobs and not all(
                    LOGPROB_MIN <= x <= LOGPROB_MAX for x in completion.logprobs
                ):  # also refuses NaN (the decoder already does)
                    raise _Rejected("bad_logprobs", f"groups[{i}].completions[{j}]")

    def _check_ref(self, task: WireTask) -> TaskRef:
        try:
            ref = task_from_wire(task)
            self.bank.check_ref(ref)
        except (TaskError, ValueError, TypeError) as e:
            raise _Rejected("bad_task", str(e)[:200]) from None
        if ref.seed == self.bank.tasks.eval_seed:  # training on held-out questions would spoil eval
            raise _Rejected("bad_task", "ref.seed is this node's eval seed")
        return ref

    def _score(self, batch: RolloutBatch, refs: list[TaskRef]) -> list[RolloutGroup]:
        """Score every group within the budget: the per-batch one, or what the author's share of the
        scoring CPU holds if less (an overrun of the share's part alone is not the sender's fault)."""
        provenance = batch_provenance(batch)
        groups = []
        cpu_start, wall_start = time.thread_time(), self.monotonic()
        per_batch_cpu, wall_budget = self.limits.score_cpu_s, self.limits.score_wall_s
        cpu_budget = (
            per_batch_cpu
            if self.scoring is None
            else min(per_batch_cpu, self.scoring.available(batch.peer_id))
        )

        def check_budget() -> None:  # before every answer: the overshoot is at most one answer's cost
            cpu, wall = time.thread_time() - cpu_start, self.monotonic() - wall_start
            if cpu > cpu_budget or wall > wall_budget:
                charged = cpu > per_batch_cpu or cpu >= WALL_OVERRUN_CHARGE_FRACTION * per_batch_cpu
                spent = (
                    f"{cpu:.3f} s CPU, {wall:.3f} s wall (budget {cpu_budget} s CPU, {wall_budget} s wall)"
                )
                raise _Rejected("over_budget", spent, charged=charged)

        try:
            for i, (sent, ref) in enumerate(zip(batch.groups, refs, strict=True)):
                wire = self._within_caps(i, sent, batch.peer_id)
                if wire is None:
                    continue
                check_budget()
                question = self.bank.question(ref)
                completions = [completion_from_wire(c) for c in wire.completions]
                group = self.bank.score_group(question, completions, provenance, before_each=check_budget)
                claims = zip(wire.claimed_rewards, group.task_scores, strict=True)
                for j, (claimed, score) in enumerate(claims):
                    if not abs(claimed - score) <= self.reward_tolerance:
                        raise _Rejected(
                            "reward_mismatch",
                            f"groups[{i}].claimed_rewards[{j}] = {claimed}, recomputed {score}",
                        )
                groups.append(group)
        finally:
            if self.scoring is not None:
                self.scoring.spend(batch.peer_id, time.thread_time() - cpu_start)
        return groups

    # --- bookkeeping -----------------------------------------------------------------------------
    def rejected(self) -> dict[str, int]:
        """Rejections so far, by reason (a copy: safe to take from any thread)."""
        with self._rejections_lock:
            return dict(self.rejections)

    def _count(self, reason: str, peer: object, detail: str = "") -> None:
        with self._rejections_lock:
            self.rejections[reason] += 1
        log.debug("rejected data from %r: %s%s", peer, reason, f" ({detail})" if detail else "")

    def _internal_error(self, peer: object) -> None:
        with self._rejections_lock:
            self.rejections["internal_error"] += 1
        if not self._internal_errors_logged:
            self._internal_errors_logged = True
            log.warning(
                "internal error while verifying data from %r; dropped it (further ones are logged at "
                "debug level)",
                peer,
                exc_info=True,
            )
        else:
            log.debug("internal error while verifying data from %r", peer, exc_info=True)

    def snapshot(self) -> dict:
        """Counters for status and metrics."""
        return {
            "accepted_batches": self.accepted_batches,
            "accepted_groups": self.accepted_groups,
            "rejections": self.rejected(),
            "rejected_total": sum(self.rejected().values()),
        }
