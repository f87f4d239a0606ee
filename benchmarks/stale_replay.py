"""How far one round of updates on *stale* own data moves the learner, per off-policy correction.

A tiny model (in-process, random weights) samples completions and records its log-probs: that is the
behaviour policy mu. A copy of it is then trained for K plain GRPO steps on those completions, so the
learner pi_old has drifted K versions away from mu (the data is K versions stale, as replayed rollouts
are). Finally the learner runs one round of ``--updates`` optimizer steps on the stale data under each
correction mode, and the table reports:

- ``KL(mu||pi_old)``: how stale the data is (k1 estimate on mu's own tokens, the trainer's diagnostic);
- ``max w``: the largest per-token factor the mode applies (pi_old/mu for remix, min(., C) for tis);
- ``clip``: share of tokens whose PPO ratio left the clip window in the last update;
- ``KL(pi_old||pi_new)``: the size of the round's update, exact over the vocabulary at every completion
  position (not an estimate from the sampled tokens).

    .venv/bin/python -m benchmarks.stale_replay --staleness 0 8 20 --updates 8 --lr 3e-4

See docs/offpolicy.md for what the numbers say.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from swarmnode.config import ModelConfig, OffPolicyConfig, TrainConfig
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.trainer import Trainer
from swarmnode.policy import load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Provenance, RolloutGroup, TaskRef
from swarmnode.sampler.hf import HFSampler

REPO = Path(__file__).resolve().parents[1]

MODES = ("none", "tis", "icepop", "remix")


def stale_sequences(seed: int) -> list[TrainSequence]:
    """Completions of the initial tiny model (mu) with its log-probs and fixed random advantages."""
    policy = load_policy(ModelConfig(name="tiny"))
    questions = [f"What is {a} + {b}?" for a in range(3) for b in range(2)]
    prompts = [encode_prompt(policy.tokenizer, q) for q in questions]
    sampled = HFSampler(policy.model, policy.tokenizer).sample(
        prompts, 4, max_new_tokens=12, temperature=1.0, seed=seed
    )
    provenance = Provenance(
        source="local", producer="mu", policy_version=0, round=1,
        tokenizer_fingerprint=policy.tokenizer_fingerprint,
    )  # fmt: skip
    group = RolloutGroup(TaskRef.make("basic_arithmetic", 0, 0), "q", (), (), (), (), provenance)
    gen = torch.Generator().manual_seed(seed)
    return [
        TrainSequence(tuple(p), c.token_ids, float(torch.randn(1, generator=gen)), c.logprobs, group)
        for p, completions in zip(prompts, sampled, strict=True)
        for c in completions
        if c.token_ids
    ]


@torch.no_grad()
def exact_kl(model_a, model_b, sequences, pad_id: int) -> float:
    """Mean over completion positions of KL(a || b), summed over the whole vocabulary."""
    batch = pad_batch(sequences, pad_id, "cpu")
    width = batch.completion_width
    la, lb = (
        torch.log_softmax(
            m(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, logits_to_keep=width + 1,
            ).logits[:, :-1].float(),
            dim=-1,
        )
        for m in (model_a, model_b)
    )  # fmt: skip
    kl = (la.exp() * (la - lb)).sum(-1)  # [B, C]: the positions that predict the completion tokens
    mask = batch.completion_mask.bool()
    return float(kl[mask].mean())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 8, 20], help="drift steps K")
    parser.add_argument("--updates", type=int, default=8, help="optimizer steps in the measured round")
    parser.add_argument("--lr", type=float, default=3e-4, help="learning rate of the measured round")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = stale_sequences(args.seed)
    print(f"{len(data)} stale sequences; round = {args.updates} AdamW updates at lr {args.lr}\n")
    print("| K | mode | KL(mu‖pi_old) | max w | clip | KL(pi_old‖pi_new) |")
    print("|---|---|---|---|---|---|")
    for k in args.staleness:
        for mode in MODES:
            policy = load_policy(ModelConfig(name="tiny"))  # same seed as mu: identical starting weights
            pad = policy.tokenizer.pad_token_id
            drift = Trainer(policy.model, pad, TrainConfig(lr=1e-2), offpolicy=OffPolicyConfig(local="none"))
            for _ in range(k):
                drift.step(data)
            old = load_policy(ModelConfig(name="tiny")).model
            old.load_state_dict(policy.model.state_dict())
            cfg = TrainConfig(lr=args.lr, updates_per_round=args.updates, token_budget=4096)
            stats = Trainer(policy.model, pad, cfg, offpolicy=OffPolicyConfig(local=mode)).step(data)
            step_kl = exact_kl(old, policy.model, data, pad)
            print(
                f"| {k} | {mode} | {stats.behaviour_kl:.3f} | {stats.is_weight_max:.2f} | "
                f"{stats.clip_low_frac + stats.clip_high_frac:.2f} | {step_kl:.4f} |"
            )


if __name__ == "__main__":
    main()
