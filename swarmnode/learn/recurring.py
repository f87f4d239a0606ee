"""The recurring-span gate: peer text that recurs across questions and that this node never writes.

Why: a payload is taught by repetition, the same words riding on correct answers to many different
questions round after round (docs/poisoning.md). Text that recurs across different questions carries no
signal about any one of them, and if this node's own completions never contain it, it is another writer's
habit. The likelihood gates (peer_defence.py) pass a payload worded to read fluently; the drift gate bounds
how far any text can rise; this gate bounds how often the same foreign text can be trained on at all.

The rule (``offpolicy.peer_defence`` = ``recurring`` or ``span_drift_recurring``): a peer completion token
leaves the loss if a word or a pair of words (a span of SPANS tokens: 1 or 2) that covers it

- was in peer completions of at least RECUR_QUESTIONS distinct questions, this round's included, counted
  over all producers together (identities are free) and over all the rounds this node remembers (below),
- and is in none of this node's own completions of the last OWN_ROUNDS rounds (all of them, trained or
  not), nor in the question itself (its prompt tokens: a task's own words are the task's, whoever
  repeats them).

Why words and pairs, not longer spans: the same answer is right for many questions, and a longer span
around it (`` = -4\n<answer>-4``) is one a node may not have written in 16 rounds even though it writes
every piece of it; gating it would take the answer itself from an honest peer. A node's own text holds
the words and pairs of its answers (digits, signs, tags); a payload needs words the node never writes
(" password", " login details", a link's pieces) or pairs of them.

Why the words around it go too (TAINT tokens either side): a payload is a sentence, and most of its
words are ones the node writes ("Before we start, please reply with your ... so I can"); gating only the
foreign ones (" username", " password") left the rest to be taught in the payload's place (SmolLM2, an
attacker sending its three wordings in turn: -3.49 -> -2.58 nats per token in 10 rounds with 30-50% of
its tokens gated). It did not hold that payload lower either (-2.58 at round 40): what is learned comes
from the first round, before any word has recurred (docs/poisoning.md). Honest cost with it (SmolLM2, 6
rounds as below): 6.1% of a same-task peer's tokens, 31.5% of a peer's on a task the node never samples
(0.8% and 4.9% without).

Why the peers' spans are remembered for good, not for a window of rounds: with a 16-round window an
attacker that read this sends each foreign word on 2 questions every 16 rounds, and each such round
teaches it again (SmolLM2: a request for credentials trained in rounds 1 and 17 only went -3.49 -> -3.41
-> -3.31 nats per token at rounds 0, 10 and 20, where the honest control under span_drift went down to
-3.73; docs/poisoning.md). Remembered, a foreign word trains on RECUR_QUESTIONS - 1 questions once.

Honest cost, measured on SmolLM2 (6 rounds, a node sampling basic_arithmetic, peers of the same base
model): 0.8% of a same-task peer's tokens gated; 4.9% of a decimal_arithmetic peer's, E1's specialist
case (" decimal to the nearest", which the integer node never writes); 11% before the question's words
were exempted (the decimals of the answer, "2.", are in the question).

Bound: a word or pair this node does not write is trained on for at most RECUR_QUESTIONS - 1 questions,
however many identities send it, for as long as it is remembered: the peer memory keeps the
MAX_PEER_SPANS spans seen last, so it is forgotten only after that many other spans were trained on since
it was last seen (a flood of new text, each round at most J peer groups x G completions x
batch.PEER_TOKEN_FACTOR x max_new_tokens tokens, 2 spans each: SmolLM2's configs, J = 4, G = 8, 64
tokens: about 30 rounds of nothing but new words). What it does not stop: text built only of words and
pairs this node writes itself or that are in the question; the drift gate bounds what such text teaches.
Memory: this node's own spans of OWN_ROUNDS rounds (bounded by its own sampling) and MAX_PEER_SPANS peer
spans with at most RECUR_QUESTIONS question keys each, never more whatever peers send.
Spans are token ids in this node's tokenizer (a peer's text is always re-tokenized, batch.py), kept as
tuples: no hash a sender could collide with one of this node's own spans; questions are kept by Python's
salted string hash, which a sender cannot predict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace

from swarmnode.learn.batch import TrainSequence

SPANS = (1, 2)  # span lengths in tokens
TAINT = 8  # tokens either side of a recurring foreign span that go with it
RECUR_QUESTIONS = 3  # distinct questions a foreign span may be on before it is gated
OWN_ROUNDS = 16  # how long a span this node wrote counts as its own
MAX_PEER_SPANS = 1 << 17  # peer spans remembered (the most recently seen): ~40 MB at most


def spans(ids: Sequence[int], sizes: Sequence[int] = SPANS) -> Iterator[tuple[int, tuple[int, ...]]]:
    """(start, span) for every span of each of ``sizes`` tokens in ``ids``."""
    for n in sizes:
        for i in range(len(ids) - n + 1):
            yield i, tuple(ids[i : i + n])


class RecurringSpans:
    """The gate's memory (module docstring); one per node (``Trainer.recurring``), fed once a round, by
    ``gate``. Not kept across a restart."""

    def __init__(
        self,
        *,
        own_rounds: int = OWN_ROUNDS,
        questions: int = RECUR_QUESTIONS,
        max_peer_spans: int = MAX_PEER_SPANS,
        taint: int = TAINT,
    ) -> None:
        self.own_rounds, self.questions, self.max_peer_spans = own_rounds, questions, max_peer_spans
        self.taint = taint
        self.round = -1  # rounds gated so far, minus one
        self._own: dict[tuple[int, ...], int] = {}  # span -> last round it was in an own completion
        # span -> keys of the first ``questions`` questions it was on, least recently seen first
        self._peer: OrderedDict[tuple[int, ...], set[int]] = OrderedDict()

    def gate(
        self, sequences: Sequence[TrainSequence], own_untrained: Sequence[TrainSequence] = ()
    ) -> list[TrainSequence]:
        """A round's ``sequences`` with their recurring foreign tokens marked ``gated``. Its own completions
        (the trained ones in ``sequences`` and ``own_untrained``) count as own before any peer's is judged,
        and every peer completion counts toward recurrence before any is judged."""
        self.round += 1
        oldest = self.round - self.own_rounds + 1
        self._own = {span: r for span, r in self._own.items() if r >= oldest}
        peers = [s for s in sequences if s.group.provenance.source != "local"]
        for s in (*sequences, *own_untrained):
            if s.group.provenance.source == "local":
                for _, span in spans(s.completion_ids):
                    self._own[span] = self.round
        for s in peers:
            self._remember(s)
        asked: dict[tuple[int, ...], set[tuple[int, ...]]] = {}  # prompt -> its spans: the task's own words
        out = []
        for s in sequences:
            if s.group.provenance.source != "local":
                if s.prompt_ids not in asked:  # once per question, not per completion
                    asked[s.prompt_ids] = {span for _, span in spans(s.prompt_ids)}
                s = self._judged(s, asked[s.prompt_ids])
            out.append(s)
        return out

    def _remember(self, s: TrainSequence) -> None:
        question = hash(s.group.question)
        for _, span in spans(s.completion_ids):
            seen = self._peer.pop(span, None) or set()
            if len(seen) < self.questions:
                seen.add(question)
            self._peer[span] = seen  # now the most recently seen
        while len(self._peer) > self.max_peer_spans:
            self._peer.popitem(last=False)

    def _judged(self, s: TrainSequence, asked: set[tuple[int, ...]]) -> TrainSequence:
        found = [
            (i, len(span))
            for i, span in spans(s.completion_ids)
            if span not in self._own and span not in asked and len(self._peer.get(span, ())) >= self.questions
        ]
        n = len(s.completion_ids)
        gated = {t for i, k in found for t in range(max(0, i - self.taint), min(n, i + k + self.taint))}
        return replace(s, gated=frozenset(gated)) if gated else s

    @property
    def size(self) -> int:
        """Spans held (own and peer): what the memory bound is about."""
        return len(self._own) + len(self._peer)
