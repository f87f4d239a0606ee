"""What a node does with a peer's verified text beyond its answer: defences against payloads that ride on
correct answers.

Verification guarantees that a peer group's rewards are the node's own scores of the peer's answers. It
says nothing about the rest of the text: a peer that writes a payload (a sentence, a link, a habit) into
exactly its correct completions gives every payload token a positive advantage, and the node learns it
("Hail to the Thief", arXiv 2511.09780). Each defence here uses only what the receiver computes itself,
never a number the sender chose (``offpolicy.peer_defence``):

- ``span``: the receiver's own log-probs (pi_old, which the learner computes anyway) tell text it would
  write from text it would not. A peer token inside any window of SPAN_WINDOW completion tokens whose
  mean log-prob under this node is below the *floor* leaves the loss (like icepop's masking). The floor
  is the OWN_QUANTILE quantile of the same windows over this round's own samples (what this node does
  write, at its own temperature) minus FLOOR_MARGIN nats per token: a payload the node has not learned
  sits far below it (measured: -6.7 nats per token against -0.6 to -1.2 for its own samples), and since
  gated tokens never train, the payload's log-prob does not climb toward it. A payload of a token or two
  inside fluent text ("The answer is seven.") is averaged away in a window of 8: measured, it was learned
  as fast as undefended (docs/poisoning.md).
- ``span_multiscale``: the same gate over windows of 1, 2, 4 and 8 tokens (MULTISCALE), each with its
  own floor from this round's own windows of that size, so a short payload is judged at its own length;
  a token leaves the loss if any of its windows is below its floor.
- ``drift``: the node's log-probs *relative to the base model* it started from (the public weights
  every node of a swarm loads; ``Trainer.base_model``, frozen). A payload an attacker words to read as
  ordinary text (a polite request for a password: -3.3 nats per token under SmolLM2, above every span
  floor) passes the likelihood gates, and training on it raised it to -0.16 in 25 rounds
  (docs/poisoning.md). What the node never measured is the *rise*: log pi_now - log pi_base per token. A
  peer token inside any window (1, 2, 4, 8 tokens) whose mean rise is above the *ceiling* leaves the
  loss; the ceiling is the 1 - OWN_QUANTILE quantile of the same windows over this round's own
  completions plus DRIFT_MARGIN. So peer text can raise any text's log-prob about as far as the node's own
  training raised its own text, and no further, however fluent it is, over all rounds (the base never
  moves) and across all producers together. A text the base model already writes is not stopped (it was
  never a payload the swarm taught).
- ``span_drift``: ``span_multiscale`` and ``drift`` together (the default): unlikely text is gated at
  once, likely text cannot be taught beyond the node's own drift.
- ``recurring``: peer text that recurs across questions and that this node never writes leaves the loss
  (learn/recurring.py): a payload is taught by repetition, and this bounds how often the same foreign
  text trains, whatever its likelihood and however many identities send it.
- ``span_drift_recurring``: ``span_drift`` and ``recurring`` together.
- ``token_budget``: per producer, the peer sequences' total |advantage| x tokens is capped at what one
  of this round's own groups has on average, so no identity outweighs one local group however long or
  many its completions (slows a payload; does not stop it).
- ``rescue``: peer groups only for tasks this node fails at (Mutual RL's rescue set, arXiv 2605.07244):
  a task whose own groups this round score at least RESCUE_SOLVED on average takes no peer group; a
  task the node did not sample this round (a specialist's other task) takes them all.
- ``questions`` ("questions, not text"): no peer token trains at all. The node samples and trains on its
  own completions of the questions its peers' groups were informative on (``rounds.resample_peer_questions``),
  so a payload has nothing to ride on, however it is worded; a peer still chooses which questions the node
  practises, and the node pays J more questions of sampling a round.

Both span gates read the windows of *every* own completion of the round, whatever its reward: a
zero-advantage group never trains, but it is this node's text all the same, so the learner reads its
log-probs in one no-grad pass (``Trainer.step``'s ``floor_only``; only when there is peer text to judge).
Otherwise the floors would depend on which own groups happened to score alike, and a round where all of
them did would have no own window at all. A window size with no own window in the step (no own
completion that long) takes the last floor measured at that size (``Trainer.span_floors``, not kept
across a restart); only a node that has never had an own window falls back to FLOOR_WITHOUT_OWN, at
SPAN_WINDOW alone: a fixed floor fits one model's text and not another's, and at 1 token it would gate
honest text of a model whose own tokens reach lower.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F

from swarmnode.learn.batch import TrainSequence
from swarmnode.rollouts import RolloutGroup

SPAN_WINDOW = 8  # tokens in a window
MULTISCALE = (1, 2, 4, SPAN_WINDOW)
# the window gates of each defence: what they judge ("likelihood": log pi_now; "drift": log pi_now -
# log pi_base) and at which window sizes
WINDOW_GATES: dict[str, dict[str, tuple[int, ...]]] = {
    "span": {"likelihood": (SPAN_WINDOW,)},
    "span_multiscale": {"likelihood": MULTISCALE},
    "drift": {"drift": MULTISCALE},
    "span_drift": {"likelihood": MULTISCALE, "drift": MULTISCALE},
    "span_drift_recurring": {"likelihood": MULTISCALE, "drift": MULTISCALE},
}
RECURRING = frozenset({"recurring", "span_drift_recurring"})  # the defences with learn/recurring.py's gate
OWN_QUANTILE = 0.01  # the floor: this quantile of the round's own windows' mean log-prob ...
FLOOR_MARGIN = 1.0  # ... minus this many nats per token
FLOOR_WITHOUT_OWN = -5.0  # the SPAN_WINDOW floor before this node has had any own window to judge from
DRIFT_QUANTILE = 0.1  # drift: the ceiling is this upper quantile of the own windows' rise ...
DRIFT_MARGIN = 0.5  # ... plus this many nats per token
# drift before any own window: a rise of DRIFT_MARGIN at every size (the node starts as the base model)
DRIFT_WITHOUT_OWN = dict.fromkeys(MULTISCALE, -DRIFT_MARGIN)
RESCUE_SOLVED = 0.5  # rescue: a task whose own groups score this much on average takes no peer group


def needs_base_model(defence: str) -> bool:
    """Whether ``defence`` reads the base model's log-probs (``Trainer.base_model``)."""
    return "drift" in WINDOW_GATES.get(defence, {})


# ---------------------------------------------------------------------------------------------------
# span: the receiver's own log-probs
# ---------------------------------------------------------------------------------------------------
def window_means(logp: torch.Tensor, mask: torch.Tensor, window: int = SPAN_WINDOW) -> torch.Tensor:
    """[B, T - window + 1]: the mean log-prob of each window of ``window`` consecutive completion tokens
    (``mask``) starting at each position; NaN where the window is not all completion tokens."""
    m = mask.to(torch.float64)
    x = torch.where(mask.bool(), logp.detach().to(torch.float64), torch.zeros_like(m))
    if logp.shape[1] < window:
        return torch.full((logp.shape[0], 0), float("nan"), dtype=torch.float64)
    sums = F.pad(x.cumsum(1), (1, 0))
    counts = F.pad(m.cumsum(1), (1, 0))
    total = sums[:, window:] - sums[:, :-window]
    full = (counts[:, window:] - counts[:, :-window]) == window
    return torch.where(full, total / window, torch.full_like(total, float("nan")))


def own_floor(
    own_means: Sequence[torch.Tensor],
    without_own: float | None = FLOOR_WITHOUT_OWN,
    margin: float = FLOOR_MARGIN,
    quantile: float = OWN_QUANTILE,
) -> float | None:
    """The span floor from this round's own windows (``window_means`` of each own micro-batch, trained or
    not): their ``quantile`` minus ``margin``; ``without_own`` if there are none (None: no gate at
    this size). The drift gate passes its per-token score as base - now, so its ceiling is a floor too."""
    values = torch.cat([m[~torch.isnan(m)].flatten() for m in own_means]) if own_means else torch.empty(0)
    if values.numel() == 0:
        return without_own
    return float(torch.quantile(values, quantile)) - margin


def span_keep(
    logp: torch.Tensor, mask: torch.Tensor, floor: float, window: int = SPAN_WINDOW
) -> torch.Tensor:
    """bool [B, T]: the completion tokens of ``mask`` not inside any window whose mean log-prob is below
    ``floor``. A completion shorter than ``window`` has no window and keeps every token."""
    low = window_means(logp, mask, window) < floor  # NaN (not a full window) compares False
    if low.shape[1] == 0:
        return mask.bool()
    # token t lies in the windows starting at t - window + 1 .. t
    spread = F.max_pool1d(F.pad(low.to(torch.float32).unsqueeze(1), (window - 1, window - 1)), window, 1)
    return mask.bool() & (spread.squeeze(1) == 0)


# ---------------------------------------------------------------------------------------------------
# token_budget and rescue: before the learner
# ---------------------------------------------------------------------------------------------------
def budget_by_producer(sequences: Sequence[TrainSequence]) -> list[TrainSequence]:
    """``token_budget``: each producer's peer sequences scaled down (advantages) so their |advantage| x
    tokens sum to at most one own group's average; own sequences unchanged."""
    own: defaultdict[int, float] = defaultdict(float)
    peers: defaultdict[str, float] = defaultdict(float)
    for s in sequences:
        weight = abs(s.advantage) * len(s.completion_ids)
        if s.group.provenance.source == "local":
            own[id(s.group)] += weight
        else:
            peers[s.group.provenance.producer] += weight
    budget = sum(own.values()) / max(len(own), 1)
    scale = {producer: min(1.0, budget / w) if w > 0 else 1.0 for producer, w in peers.items()}
    return [
        s
        if s.group.provenance.source == "local"
        else replace(s, advantage=s.advantage * scale[s.group.provenance.producer])
        for s in sequences
    ]


def rescue_only(peer_groups: Sequence[RolloutGroup], local: Sequence[RolloutGroup]) -> list[RolloutGroup]:
    """``rescue``: the peer groups of tasks this node did not solve this round (module docstring)."""
    scores: defaultdict[str, list[float]] = defaultdict(list)
    for group in local:
        scores[group.ref.dataset].extend(group.task_scores)
    solved = {task for task, s in scores.items() if sum(s) / len(s) >= RESCUE_SOLVED}
    return [g for g in peer_groups if g.ref.dataset not in solved]
