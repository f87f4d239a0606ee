"""The recurring-span gate: peer text that recurs across questions and that this node never writes.

Why: a payload is taught by repetition, the same words riding on correct answers to many different
questions round after round (docs/poisoning.md). Text that recurs across different questions carries no
signal about any one of them, and if this node's own completions never contain it, it is another writer's
habit. The likelihood gates (peer_defence.py) pass a payload worded to read fluently; the drift gate bounds
how far any text can rise; this gate bounds how often the same foreign text can be trained on at all.

The rule (``offpolicy.peer_defence`` = ``recurring`` or ``span_drift_recurring``): a peer completion token
leaves the loss if a word or a pair of words (a span of SPANS tokens: 1 or 2) that covers it

- was in peer completions of at least RECUR_QUESTIONS distinct questions over the last MEMORY_ROUNDS rounds,
  this one included, counted over all producers together (identities are free), and
- is in none of this node's own completions of those rounds (all of them, trained or not), nor in the
  question itself (its prompt tokens: a task's own words are the task's, whoever repeats them).

Why words and pairs, not longer spans: the same answer is right for many questions, and a longer span
around it (`` = -4\n<answer>-4``) is one a node may not have written in 16 rounds even though it writes
every piece of it; gating it would take the answer itself from an honest peer. A node's own text holds
the words and pairs of its answers (digits, signs, tags); a payload needs words the node never writes
(" password", " login details", a link's pieces) or pairs of them.

Honest cost, measured on SmolLM2 (6 rounds, a node sampling basic_arithmetic, peers of the same base
model): 0.8% of a same-task peer's tokens gated; 4.9% of a decimal_arithmetic peer's, E1's specialist
case (" decimal to the nearest", which the integer node never writes); 11% before the question's words
were exempted (the decimals of the answer, "2.", are in the question).

Bound: a word or pair this node does not write is trained on for at most RECUR_QUESTIONS - 1 questions per
MEMORY_ROUNDS rounds, however many identities send it. What it does not stop: text built only of words and
pairs this node writes itself, or an attacker that spends each foreign word on fewer than RECUR_QUESTIONS
questions per MEMORY_ROUNDS rounds (benchmarks/poisoning/planner.py is that attacker); the drift gate
bounds what such text teaches.
Memory: the spans of this node's own completions and of the peer completions it was to train on, for
MEMORY_ROUNDS rounds; both bounded by what a round trains on (J peer groups, each completion at most
batch.PEER_TOKEN_FACTOR x max_new_tokens), never by what peers send.
Spans are token ids in this node's tokenizer (a peer's text is always re-tokenized, batch.py), kept as
tuples: no hash a sender could collide with one of this node's own spans.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from swarmnode.learn.batch import TrainSequence

SPANS = (1, 2)  # span lengths in tokens
RECUR_QUESTIONS = 3  # distinct questions a foreign span may recur on before it is gated ...
MEMORY_ROUNDS = 16  # ... over this many rounds (also how long this node's own spans count as its own)


def spans(ids: Sequence[int], sizes: Sequence[int] = SPANS) -> Iterator[tuple[int, tuple[int, ...]]]:
    """(start, span) for every span of each of ``sizes`` tokens in ``ids``."""
    for n in sizes:
        for i in range(len(ids) - n + 1):
            yield i, tuple(ids[i : i + n])


class RecurringSpans:
    """The gate's memory over rounds (module docstring); one per node (``Trainer.recurring``), fed once a
    round, by ``gate``. Not kept across a restart: it fills again within MEMORY_ROUNDS rounds."""

    def __init__(self, *, rounds: int = MEMORY_ROUNDS, questions: int = RECUR_QUESTIONS) -> None:
        self.rounds, self.questions = rounds, questions
        self.round = -1  # rounds gated so far, minus one
        self._own: dict[tuple[int, ...], int] = {}  # span -> last round it was in an own completion
        self._peer: dict[tuple[int, ...], dict[str, int]] = {}  # span -> {question: last round}

    def gate(
        self, sequences: Sequence[TrainSequence], own_untrained: Sequence[TrainSequence] = ()
    ) -> list[TrainSequence]:
        """A round's ``sequences`` with their recurring foreign tokens marked ``gated``. Its own completions
        (the trained ones in ``sequences`` and ``own_untrained``) count as own before any peer's is judged,
        and every peer completion counts toward recurrence before any is judged."""
        self.round += 1
        round_ = self.round
        self._forget(round_)
        own = [s for s in (*sequences, *own_untrained) if s.group.provenance.source == "local"]
        for s in own:
            for _, span in spans(s.completion_ids):
                self._own[span] = round_
        for s in sequences:
            if s.group.provenance.source != "local":
                for _, span in spans(s.completion_ids):
                    self._peer.setdefault(span, {})[s.group.question] = round_
        return [s if s.group.provenance.source == "local" else self._judged(s) for s in sequences]

    def _judged(self, s: TrainSequence) -> TrainSequence:
        asked = {span for _, span in spans(s.prompt_ids)}  # the question's own words are the task's
        gated = {
            i + k
            for i, span in spans(s.completion_ids)
            if span not in self._own and span not in asked and len(self._peer.get(span, ())) >= self.questions
            for k in range(len(span))
        }
        return replace(s, gated=frozenset(gated)) if gated else s

    def _forget(self, round_: int) -> None:
        """Drop what is older than ``rounds`` rounds (this one included)."""
        oldest = round_ - self.rounds + 1
        self._own = {span: r for span, r in self._own.items() if r >= oldest}
        peer = {}
        for span, seen in self._peer.items():
            kept = {q: r for q, r in seen.items() if r >= oldest}
            if kept:
                peer[span] = kept
        self._peer = peer

    @property
    def size(self) -> int:
        """Spans held (own and peer): what the memory bound is about."""
        return len(self._own) + len(self._peer)
