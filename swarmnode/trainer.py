"""The learner: one GRPO/DAPO update per round over the kept question groups.

``Trainer.step`` reads top to bottom: build sequences -> (old log-probs if several updates) ->
micro-batched loss and backward -> clip -> AdamW step -> bump the policy version.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from swarmnode.batching import TrainSequence, completion_logprobs, microbatches, pad_batch
from swarmnode.config import TrainConfig
from swarmnode.grpo import policy_loss


@dataclass
class StepStats:
    sequences: int = 0
    tokens: int = 0
    loss: float = 0.0
    kl: float = 0.0
    clip_low_frac: float = 0.0
    clip_high_frac: float = 0.0
    grad_norm: float = 0.0
    seconds: float = 0.0
    tokens_per_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        cfg: TrainConfig,
        *,
        temperature: float = 1.0,
        ref_model=None,
    ):
        self.model = model
        self.temperature = temperature
        self.pad_id = pad_id
        self.cfg = cfg
        self.ref_model = ref_model if cfg.kl_beta > 0 else None
        self.device = next(model.parameters()).device
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.policy_version = 0

    def step(self, sequences: Sequence[TrainSequence]) -> StepStats:
        """``updates_per_round`` optimizer steps over ``sequences``; no-op (version unchanged) if empty."""
        if not sequences:
            return StepStats()
        start = time.perf_counter()
        batches = [
            pad_batch(mb, self.pad_id, self.device) for mb in microbatches(sequences, self.cfg.token_budget)
        ]
        total_tokens = int(sum(b.completion_mask.sum().item() for b in batches))
        old_logps = self._frozen_logprobs(self.model, batches) if self.cfg.updates_per_round > 1 else None
        ref_logps = self._frozen_logprobs(self.ref_model, batches) if self.ref_model is not None else None
        stats = StepStats(sequences=len(sequences), tokens=total_tokens)
        self.model.train()
        for _ in range(self.cfg.updates_per_round):
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = kl_sum = 0.0
            low = high = 0
            for i, batch in enumerate(batches):
                logp = completion_logprobs(self.model, batch, self.temperature)
                old = old_logps[i] if old_logps is not None else logp.detach()
                terms = policy_loss(
                    logp,
                    old,
                    batch.advantages,
                    batch.completion_mask,
                    clip_low=self.cfg.clip_low,
                    clip_high=self.cfg.clip_high,
                    total_tokens=total_tokens,
                    ref_logp=ref_logps[i] if ref_logps is not None else None,
                    kl_beta=self.cfg.kl_beta,
                )
                terms.loss.backward()
                loss_sum += terms.loss.item()
                kl_sum += terms.kl_sum
                low += terms.clipped_low
                high += terms.clipped_high
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in self.model.parameters() if p.requires_grad], self.cfg.max_grad_norm
            )
            self.optimizer.step()
            self.policy_version += 1
        self.model.eval()
        stats.loss = loss_sum
        stats.kl = kl_sum / max(total_tokens, 1)
        stats.clip_low_frac = low / max(total_tokens, 1)
        stats.clip_high_frac = high / max(total_tokens, 1)
        stats.grad_norm = float(grad_norm)
        stats.seconds = time.perf_counter() - start
        stats.tokens_per_s = total_tokens * self.cfg.updates_per_round / max(stats.seconds, 1e-9)
        return stats

    @torch.no_grad()
    def _frozen_logprobs(self, model, batches) -> list[torch.Tensor]:
        was_training = model.training
        model.eval()
        out = [completion_logprobs(model, b, self.temperature) for b in batches]
        model.train(was_training)
        return out
