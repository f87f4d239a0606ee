"""The learner: GRPO/DAPO updates over the kept question groups, with off-policy correction by source.

``Trainer.step`` reads top to bottom: split sequences by source (own / same-tokenizer peer / foreign
peer) -> micro-batches -> (old log-probs if several updates) -> (the span gate's no-grad pass over own
text that does not train, peer_defence.py) -> per micro-batch: log-probs, the source's correction
(offpolicy.py), loss summed over tokens, backward -> divide the gradients by the number of tokens that
counted (known only after icepop's masking, hence after the backward passes) -> clip -> (ESS
learning-rate damping) -> AdamW step -> bump the policy version.

Where it departs from textbook GRPO (beyond grpo.py's loss and offpolicy.py's corrections):
- one update per round by default, so pi_old is the current policy and the PPO ratio is exactly 1 at
  the update (clipping acts only with ``updates_per_round`` > 1);
- micro-batches (``train.batch_layout``, default ``packed``): each group's prompt is computed once and
  its completions attend to it through a block mask (``shared.py``), several groups per row; the
  gradient is the plain layout's up to float rounding (tests/unit/learn/test_shared.py), and models that
  cannot take the mask fall back to the plain layout;
- the forward pass runs under bf16 autocast wherever the hardware computes bf16 natively
  (``train.autocast=auto``, ``precision.py``), fp32 master weights and optimizer state: the sampler's
  log-probs then differ from the learner's by bf16 rounding as well, which ``offpolicy.local`` weighs.

ReMix's schedule pieces live here too: with ``train.kl_convex`` the KL penalty is split between the
reference policy (weight lambda(t), ``offpolicy.remix_kl_coef``) and the policy at the start of the round;
``reincarnate`` makes the current policy the new reference (the round loop calls it at step T).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from swarmnode.config import OffPolicyConfig, TrainConfig
from swarmnode.learn.batch import PaddedBatch, TrainSequence, microbatches, pad_batch
from swarmnode.learn.grpo import LossTerms, kl_penalty
from swarmnode.learn.heap import return_freed_heap, training_heap
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.learn.offpolicy import (
    CorrectionStats,
    corrected_loss,
    correction_for,
    ess_lr_scale,
    remix_kl_coef,
)
from swarmnode.learn.peer_defence import (
    DRIFT_MARGIN,
    DRIFT_QUANTILE,
    DRIFT_WITHOUT_OWN,
    FLOOR_MARGIN,
    FLOOR_WITHOUT_OWN,
    OWN_QUANTILE,
    RECURRING,
    SPAN_WINDOW,
    WINDOW_GATES,
    needs_base_model,
    own_floor,
    span_keep,
    window_means,
)
from swarmnode.learn.precision import autocast_dtype
from swarmnode.learn.recurring import RecurringSpans
from swarmnode.learn.shared import shared_batch, shared_microbatches, supports_shared_prompt

FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # where torch's AdamW has a fused kernel (fp32 and bf16 weights)


@dataclass(frozen=True)
class StepStats:
    """One round's update, as ``Trainer.step`` returns it; a round's metrics.jsonl line has each field as
    ``train_<field>``."""

    sequences: int = 0
    tokens: int = 0  # completion tokens that counted in the loss (after masking)
    loss: float = 0.0
    kl: float = 0.0
    clip_low_frac: float = 0.0
    clip_high_frac: float = 0.0
    grad_norm: float = 0.0
    masked_frac: float = 0.0  # tokens dropped by icepop
    peer_gated_frac: float = 0.0  # peer completion tokens the peer defence kept out (peer_defence.py)
    is_weight_mean: float = 1.0  # importance weights at the start of the update
    is_weight_max: float = 1.0
    ess: float = 1.0  # effective sample size of those weights, (sum w)^2 / (n sum w^2)
    behaviour_kl: float = 0.0  # KL(mu || pi_old), k1 estimate over tokens with behaviour log-probs
    lr_scale: float = 1.0  # ESS damping applied to the learning rate
    seconds: float = 0.0
    tokens_per_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class UpdateTotals:
    """Token sums over the micro-batches of one update; ``StepStats`` divides them by the kept count."""

    loss: float = 0.0  # the loss summed over tokens (total_tokens=1)
    kl: float = 0.0  # k3 KL to the reference, summed over tokens
    clipped_low: int = 0
    clipped_high: int = 0
    kept_tokens: float = 0.0  # tokens that count after icepop's masking
    tokens: float = 0.0  # completion tokens before masking
    weight_sum: float = 0.0  # sum of the importance weights over kept tokens
    weight_sq_sum: float = 0.0  # sum of their squares (ESS over the whole update)
    weight_max: float = 0.0
    behaviour_kl: float = 0.0  # log mu - log pi_old summed over tokens with behaviour log-probs
    behaviour_tokens: float = 0.0  # how many tokens have behaviour log-probs
    peer_tokens: float = 0.0  # peer completion tokens, before the span defence
    peer_gated: float = 0.0  # those it kept out of the loss

    def add(self, terms: LossTerms, stats: CorrectionStats) -> None:
        """One micro-batch's loss terms and ``Correction.stats``."""
        self.loss += terms.loss.item()
        self.kl += terms.kl_sum
        self.clipped_low += terms.clipped_low
        self.clipped_high += terms.clipped_high
        self.kept_tokens += stats.kept_tokens
        self.tokens += stats.tokens
        self.weight_sum += stats.weight_sum
        self.weight_sq_sum += stats.weight_sq_sum
        self.weight_max = max(self.weight_max, stats.weight_max)
        usable = stats.behaviour_frac * stats.tokens
        self.behaviour_kl += stats.kl_k1 * usable
        self.behaviour_tokens += usable


class SpanGate:
    """One window gate of ``offpolicy.peer_defence`` over one step (peer_defence.py), on a per-token score
    where low is suspect: the log-prob (``likelihood``) or base minus current log-prob (``drift``). Own
    micro-batches come first (the floor-only pass, then ``Trainer._batches``' local ones), so the floors are
    taken from all of them before the first peer micro-batch, once per step; one floor per window size. A
    size with no own window this step takes ``carried`` (the last floor measured at that size), else
    ``without_own`` (None at a size: no gate there)."""

    def __init__(
        self,
        windows: tuple[int, ...],
        carried: Mapping[int, float] | None = None,
        *,
        margin: float = FLOOR_MARGIN,
        quantile: float = OWN_QUANTILE,
        without_own: Mapping[int, float] | None = None,
    ) -> None:
        self._own: dict[int, list[torch.Tensor]] = {w: [] for w in windows}  # own window means, per size
        self._carried = dict(carried or {})
        self._margin, self._quantile = margin, quantile
        self._without_own = {SPAN_WINDOW: FLOOR_WITHOUT_OWN} if without_own is None else dict(without_own)
        self.floors: dict[int, float | None] | None = None

    @classmethod
    def of_kind(cls, kind: str, windows: tuple[int, ...], carried: Mapping[int, float] | None = None):
        """The gate for ``kind`` (peer_defence.WINDOW_GATES): its margin, quantile and first floors."""
        if kind == "drift":
            return cls(
                windows, carried, margin=DRIFT_MARGIN, quantile=DRIFT_QUANTILE, without_own=DRIFT_WITHOUT_OWN
            )
        return cls(windows, carried)

    def add_own(self, score: torch.Tensor, mask: torch.Tensor) -> None:
        """An own micro-batch's scores (trained or not): its windows set the floors."""
        if self.floors is None:
            for w, means in self._own.items():
                means.append(window_means(score, mask, w))

    def keep(self, score: torch.Tensor, mask: torch.Tensor, trusted: bool) -> torch.Tensor:
        """The micro-batch's mask: unchanged for own data, without the low spans for a peer's."""
        if trusted:
            self.add_own(score, mask)
            return mask
        if self.floors is None:
            self.floors = {
                w: self._floor(means, self._carried.get(w, self._without_own.get(w)))
                for w, means in self._own.items()
            }
        keep = mask.bool()
        for w, floor in self.floors.items():
            if floor is not None:
                keep = keep & span_keep(score, mask, floor, w)
        return keep

    def _floor(self, means: list[torch.Tensor], without_own: float | None) -> float | None:
        return own_floor(means, without_own, self._margin, self._quantile)

    def measured(self) -> dict[int, float]:
        """The floors of this step's own windows, by size (a size without any left out): what the next step
        carries."""
        floors = {w: self._floor(means, None) for w, means in self._own.items()}
        return {w: f for w, f in floors.items() if f is not None}


def gate_score(kind: str, logp: torch.Tensor, base_logp: torch.Tensor | None) -> torch.Tensor:
    """The per-token score a gate of ``kind`` judges (low is suspect): the log-prob, or for ``drift`` the
    base model's log-prob minus the current one (minus the rise since the base)."""
    if kind == "drift":
        assert base_logp is not None, "the drift gate needs the base model's log-probs"
        return base_logp - logp
    return logp


def source_of(seq: TrainSequence) -> str:
    """Which correction applies: own rollouts, peers with usable behaviour log-probs, or the rest."""
    if seq.group is None or seq.group.provenance.source == "local":
        return "local"
    return "peer" if seq.behaviour_logprobs is not None else "foreign"


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        cfg: TrainConfig,
        *,
        offpolicy: OffPolicyConfig | None = None,
        temperature: float = 1.0,
        ref_model=None,
    ):
        self.model = model
        self.pad_id = pad_id
        self.cfg = cfg
        self.offpolicy = offpolicy or OffPolicyConfig()
        self.temperature = temperature
        self.ref_model = ref_model if cfg.kl_beta > 0 else None
        # the weights this node starts from (before any resume), frozen: the drift gate's yardstick
        self.base_model = None
        if needs_base_model(self.offpolicy.peer_defence):
            self.base_model = copy.deepcopy(model).requires_grad_(False).eval()
        self.device = next(model.parameters()).device
        self.autocast = autocast_dtype(cfg.autocast, self.device, next(model.parameters()).dtype)
        self.layout = cfg.batch_layout if supports_shared_prompt(model) else "plain"
        self.params = [p for p in model.parameters() if p.requires_grad]
        # fused: one kernel per parameter, no temporaries (on SmolLM2's CPU step: 215 MiB less at its
        # peak and 10x faster, docs/performance.md); where torch has no fused kernel, the for-loop one
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
            fused=self.device.type in FUSED_ADAMW_DEVICES or None,
        )  # fmt: skip
        self.policy_version = 0
        self.reincarnated = False
        # each window gate's floors from the last step with own windows, by size: a step without any (no
        # own completion, or none as long as a window) gates peer text with these (SpanGate)
        self.span_floors: dict[str, dict[int, float]] = {}
        self.recurring = RecurringSpans() if self.offpolicy.peer_defence in RECURRING else None

    def _batches(self, sequences: Sequence[TrainSequence]) -> list[tuple[str, bool, PaddedBatch]]:
        """(correction mode, trusted, padded micro-batch); each micro-batch holds one source. Peers' data
        is not trusted: its importance weights are capped at 1 (``offpolicy.UNTRUSTED_WEIGHT_CAP``)."""
        modes = {
            "local": self.offpolicy.local,
            "peer": self.offpolicy.peer,
            "foreign": self.offpolicy.foreign,
        }
        budget = self.cfg.token_budget
        batches = []
        for source, mode in modes.items():
            part = [s for s in sequences if source_of(s) == source]
            if self.layout == "plain":
                for mb in microbatches(part, budget):
                    batches.append((mode, source == "local", pad_batch(mb, self.pad_id, self.device)))
            else:
                for rows in shared_microbatches(part, budget, pack=self.layout == "packed"):
                    batches.append((mode, source == "local", shared_batch(rows, self.pad_id, self.device)))
        return batches

    def step(self, sequences: Sequence[TrainSequence], floor_only: Sequence[TrainSequence] = ()) -> StepStats:
        """``updates_per_round`` optimizer steps over ``sequences``; no-op (version unchanged) if empty.

        ``floor_only``: own completions that do not train (zero-advantage groups,
        ``batch.own_untrained_sequences``); with a span defence and peer data in the step, one no-grad pass
        gives their log-probs, and their windows join the trained own ones in the span gate's floors, so
        the floors do not depend on which own groups happened to score alike."""
        if self.recurring is not None:  # every round, so its memory holds the node's own text of each
            sequences = self.recurring.gate(sequences, floor_only)
        if not sequences:
            return StepStats()
        # CPU activations live in glibc's heap (heap.py): mmap the step's mid-sized blocks
        with training_heap() if self.device.type == "cpu" else contextlib.nullcontext():
            return self._step(sequences, floor_only)

    def _peer_gates(
        self, batches: list[tuple[str, bool, PaddedBatch]], floor_only: Sequence[TrainSequence]
    ) -> dict[str, SpanGate]:
        """The step's window gates by kind (none without a span or drift defence), fed the floor-only
        sequences' windows when there is peer data to judge (without, the pass would be spent for
        nothing). The drift gate only runs with peer data: its base-model pass over the step costs a
        forward pass, which a solo round would spend for nothing (its ceilings are not carried from such
        a step; the likelihood floors, read off log-probs the step has anyway, are)."""
        peers = not all(trusted for _, trusted, _ in batches)
        kinds = {
            k: w
            for k, w in WINDOW_GATES.get(self.offpolicy.peer_defence, {}).items()
            if peers or k != "drift"
        }
        gates = {k: SpanGate.of_kind(k, w, self.span_floors.get(k)) for k, w in kinds.items()}
        if gates and floor_only and peers:
            own = self._batches(floor_only)
            base = self._base_logprobs(own, gates)
            current = self._frozen_logprobs(self.model, own)
            for i, ((_, _, batch), logp) in enumerate(zip(own, current, strict=True)):
                for kind, gate in gates.items():
                    score = gate_score(kind, logp, base[i] if base is not None else None)
                    gate.add_own(score, batch.completion_mask)
        return gates

    def _base_logprobs(self, batches, gates: Mapping[str, SpanGate]) -> list[torch.Tensor] | None:
        """The base model's log-probs of ``batches`` if a drift gate needs them."""
        return self._frozen_logprobs(self.base_model, batches) if "drift" in gates else None

    def _step(self, sequences: Sequence[TrainSequence], floor_only: Sequence[TrainSequence]) -> StepStats:
        start = time.perf_counter()
        batches = self._batches(sequences)
        old_logps = self._frozen_logprobs(self.model, batches) if self.cfg.updates_per_round > 1 else None
        ref_logps = self._frozen_logprobs(self.ref_model, batches) if self.ref_model is not None else None
        off = self.offpolicy
        gates = self._peer_gates(batches, floor_only)
        base_logps = self._base_logprobs(batches, gates)
        self.model.train()
        for _ in range(self.cfg.updates_per_round):
            # KL-convex: weight lam on the reference, 1 - lam on the round-start policy (pi_old; its KL
            # term has zero gradient on the first update, so it only matters with several updates)
            lam = remix_kl_coef(self.policy_version) if self.cfg.kl_convex else 1.0
            self.optimizer.zero_grad(set_to_none=True)
            totals = UpdateTotals()
            for i, (mode, trusted, batch) in enumerate(batches):
                logp = completion_logprobs(
                    self.model, batch, self.temperature, self.autocast, fuse_head_grad=True
                )
                old = old_logps[i] if old_logps is not None else logp.detach()
                mask = batch.completion_mask
                if batch.keep_mask is not None:  # recurring foreign spans (learn/recurring.py)
                    mask = mask & batch.keep_mask
                for kind, gate in gates.items():
                    score = gate_score(kind, old, base_logps[i] if base_logps is not None else None)
                    mask = mask & gate.keep(score, batch.completion_mask, trusted)
                if not trusted:
                    totals.peer_tokens += float(batch.completion_mask.sum())
                    totals.peer_gated += float(batch.completion_mask.sum() - mask.sum())
                correction = correction_for(
                    mode,
                    old_logp=old,
                    behaviour_logp=batch.behaviour_logp,
                    has_behaviour=batch.has_behaviour,
                    mask=mask,
                    tis_cap=off.tis_cap,
                    icepop_low=off.icepop_low,
                    icepop_high=off.icepop_high,
                    luffy_gamma=off.luffy_gamma,
                    trusted=trusted,
                )
                terms = corrected_loss(
                    correction,
                    logp,
                    old,
                    batch.advantages,
                    clip_low=self.cfg.clip_low,
                    clip_high=self.cfg.clip_high,
                    total_tokens=1,  # token sums; the gradients are divided by the kept count below
                    ref_logp=ref_logps[i] if ref_logps is not None else None,
                    kl_beta=self.cfg.kl_beta * lam,
                )
                loss = terms.loss
                if lam < 1 and old_logps is not None:
                    prev_kl, _ = kl_penalty(
                        logp, old, correction.mask, kl_beta=self.cfg.kl_beta * (1 - lam), total_tokens=1
                    )
                    loss = loss + prev_kl
                loss.backward()
                totals.add(terms, correction.stats)
            return_freed_heap()  # the backward passes' activations, before AdamW's temporaries
            kept = max(totals.kept_tokens, 1.0)
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(kept)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
            ess = totals.weight_sum**2 / (kept * totals.weight_sq_sum) if totals.weight_sq_sum > 0 else 1.0
            lr_scale = ess_lr_scale(ess, off.ess_base) if off.ess_base is not None else 1.0
            self._step_with_lr_scale(lr_scale)
            self.policy_version += 1
        self.model.eval()
        for kind, gate in gates.items():
            self.span_floors.setdefault(kind, {}).update(gate.measured())
        seconds = time.perf_counter() - start
        return StepStats(
            sequences=len(sequences),
            tokens=int(totals.kept_tokens),
            loss=totals.loss / kept,
            kl=totals.kl / kept,
            clip_low_frac=totals.clipped_low / kept,
            clip_high_frac=totals.clipped_high / kept,
            grad_norm=float(grad_norm),
            masked_frac=1.0 - totals.kept_tokens / max(totals.tokens, 1.0),
            peer_gated_frac=totals.peer_gated / max(totals.peer_tokens, 1.0),
            is_weight_mean=totals.weight_sum / kept,
            is_weight_max=totals.weight_max,
            ess=ess,
            behaviour_kl=totals.behaviour_kl / max(totals.behaviour_tokens, 1.0),
            lr_scale=lr_scale,
            seconds=seconds,
            tokens_per_s=totals.kept_tokens * self.cfg.updates_per_round / max(seconds, 1e-9),
        )

    def release_gradients(self) -> None:
        """Drop the gradients: they matter only inside ``step``, and between steps they would hold the
        trainable weights' size again (0.54 GB for SmolLM2) through sampling and the checkpoint save."""
        self.optimizer.zero_grad(set_to_none=True)

    def reincarnate(self) -> None:
        """ReMix's policy reincarnation: the current policy becomes the KL reference (if any); the caller
        stops feeding off-policy replay from here on."""
        if self.ref_model is not None:
            self.ref_model.load_state_dict(self.model.state_dict())
        self.reincarnated = True

    def _step_with_lr_scale(self, scale: float) -> None:
        groups = self.optimizer.param_groups
        base = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] *= scale
        self.optimizer.step()
        for g, lr in zip(groups, base, strict=True):
            g["lr"] = lr

    @torch.no_grad()
    def _frozen_logprobs(self, model, batches) -> list[torch.Tensor]:
        was_training = model.training
        model.eval()
        out = [completion_logprobs(model, b, self.temperature, self.autocast) for _, _, b in batches]
        model.train(was_training)
        return out
