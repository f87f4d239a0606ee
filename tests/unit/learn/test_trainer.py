"""The trainer's off-policy correction by source, on a real tiny model and real sampled completions."""

from dataclasses import replace

import pytest
import torch

from swarmnode.config import ModelConfig, OffPolicyConfig, TinyModelConfig, TrainConfig
from swarmnode.learn.batch import TrainSequence
from swarmnode.learn.trainer import Trainer, source_of
from swarmnode.policy import load_policy, resolve_dtype, state_digest
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Provenance, RolloutGroup, TaskRef
from swarmnode.sampler.hf import HFSampler

TRAIN = TrainConfig(lr=1e-2, token_budget=256, autocast="off")  # fp32: on-policy ratios exactly 1


def _group(source: str, fingerprint: str) -> RolloutGroup:
    provenance = Provenance(
        source=source, producer="p", policy_version=0, round=1, tokenizer_fingerprint=fingerprint
    )
    return RolloutGroup(TaskRef.make("basic_arithmetic", 0, 0), "q", (), (0.0,), (0.0,), (False,), provenance)


@pytest.fixture(scope="module")
def sampled():
    """On-policy sequences: completions with the sampler's behaviour log-probs, alternating advantages."""
    policy = load_policy(ModelConfig(name="tiny"))
    prompts = [encode_prompt(policy.tokenizer, q) for q in ("What is 2 + 3?", "Is p or not p true?")]
    groups = HFSampler(policy.model, policy.tokenizer).sample(
        prompts, 4, max_new_tokens=10, temperature=1.0, seed=1
    )
    local = _group("local", policy.tokenizer_fingerprint)
    sequences = [
        TrainSequence(tuple(p), c.token_ids, 1.0 if i % 2 else -1.0, c.logprobs, local)
        for p, group in zip(prompts, groups, strict=True)
        for i, c in enumerate(group)
    ]
    return policy, sequences


def _train(sequences, offpolicy: OffPolicyConfig, updates: int = 1):
    """One step. These tests isolate the importance weights, so the span gate (on by default) is off: with
    no own sequences in the step it would gate every token of the random tiny model (test_peer_defence.py
    tests the gate)."""
    policy = load_policy(ModelConfig(name="tiny"))  # same seed: identical starting weights every time
    offpolicy = offpolicy.model_copy(update={"peer_defence": "none"})
    trainer = Trainer(
        policy.model, policy.tokenizer.pad_token_id, replace_train(updates), offpolicy=offpolicy
    )
    stats = trainer.step(sequences)
    return state_digest(policy.model), policy.model, stats


def replace_train(updates: int) -> TrainConfig:
    return TRAIN.model_copy(update={"updates_per_round": updates})


@pytest.mark.parametrize("mode", ["tis", "icepop", "remix"])
def test_every_mode_is_plain_grpo_on_on_policy_data(sampled, mode):
    _, sequences = sampled
    _, reference, ref_stats = _train(sequences, OffPolicyConfig(local="none"))
    _, model, stats = _train(sequences, OffPolicyConfig(local=mode))
    # Gradients, not weights: behaviour and learner log-probs agree to ~1e-5 (two float32 code paths), and
    # Adam's first step (~lr * sign(g)) would amplify that on parameters whose gradient is ~0.
    for (name, a), b in zip(reference.named_parameters(), model.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-3, atol=1e-7), name
    assert stats.loss == pytest.approx(ref_stats.loss, abs=1e-6)
    assert stats.masked_frac == 0.0 and stats.ess == pytest.approx(1.0, abs=1e-4)
    assert stats.is_weight_max == pytest.approx(1.0, abs=1e-3)  # behaviour == learner log-probs


def test_sources_are_told_apart(sampled):
    policy, sequences = sampled
    seq = sequences[0]
    peer = replace(seq, group=_group("peer", policy.tokenizer_fingerprint))
    foreign = replace(seq, group=_group("peer", "other"), behaviour_logprobs=None)
    assert [source_of(s) for s in (seq, peer, foreign)] == ["local", "peer", "foreign"]
    assert source_of(replace(seq, group=None)) == "local"


def test_poisoned_peer_logprobs_are_truncated_or_masked(sampled):
    """A peer claims every token was nearly impossible for it (mu = 1e-9): pi_old/mu is huge."""
    policy, sequences = sampled
    peer_group = _group("peer", policy.tokenizer_fingerprint)
    poisoned = [
        replace(s, group=peer_group, behaviour_logprobs=tuple(-20.7 for _ in s.completion_ids))
        for s in sequences
    ]
    _, _, tis = _train(poisoned, OffPolicyConfig(peer="tis", tis_cap=2.0))
    assert tis.is_weight_max == pytest.approx(1.0)  # a peer's weights are capped at 1, below C = 2
    _, _, icepop = _train(poisoned, OffPolicyConfig(peer="icepop"))
    assert icepop.masked_frac == 1.0 and icepop.tokens == 0  # every token out of [0.5, 5]: no update
    assert icepop.grad_norm == 0.0
    digest_icepop, _, _ = _train(poisoned, OffPolicyConfig(peer="icepop"))
    assert digest_icepop == state_digest(load_policy(ModelConfig(name="tiny")).model)  # weights untouched
    digest_none, _, _ = _train(poisoned, OffPolicyConfig(peer="none"))
    assert digest_none != digest_icepop  # the same data moves the weights when nothing masks it


def test_ess_damps_the_learning_rate(sampled):
    policy, sequences = sampled
    peer_group = _group("peer", policy.tokenizer_fingerprint)
    # half the sequences from a peer whose mu differs a lot: weights spread, ESS < 1 (it claims its tokens
    # were likelier for it: weights below 1; a peer's weights are never raised above 1)
    shift = [1.0 if i % 2 else 0.0 for i in range(len(sequences))]
    skewed = [
        replace(s, group=peer_group, behaviour_logprobs=tuple(lp + d for lp in s.behaviour_logprobs))
        for s, d in zip(sequences, shift, strict=True)
    ]
    _, _, plain = _train(skewed, OffPolicyConfig(peer="tis"))
    _, _, damped = _train(skewed, OffPolicyConfig(peer="tis", ess_base=1.0))
    assert plain.ess < 0.99 and plain.lr_scale == 1.0
    assert damped.lr_scale == pytest.approx(plain.ess**0.5, rel=1e-6)


def _train_kl(sequences, *, convex: bool, beta: float, updates: int, version: int) -> str:
    """Weights after one round with a KL penalty to a reference that differs from the learner."""
    policy = load_policy(ModelConfig(name="tiny"))
    reference = load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(seed=1))).model
    reference.requires_grad_(False)
    cfg = TRAIN.model_copy(update={"updates_per_round": updates, "kl_beta": beta, "kl_convex": convex})
    trainer = Trainer(
        policy.model, policy.tokenizer.pad_token_id, cfg, offpolicy=OffPolicyConfig(local="none"),
        ref_model=reference,
    )  # fmt: skip
    trainer.policy_version = version  # where ReMix's lambda(t) schedule stands
    trainer.step(sequences)
    return state_digest(policy.model)


def test_kl_convex_splits_the_penalty_by_the_remix_schedule(sampled):
    _, seqs = sampled
    # up to step 50 lambda = 1: the whole penalty goes to the reference, exactly as without kl_convex
    assert _train_kl(seqs, convex=True, beta=0.5, updates=2, version=10) == _train_kl(
        seqs, convex=False, beta=0.5, updates=2, version=10
    )
    # at step 100 lambda = 0.5: with one update only the reference half acts (the round-start policy's
    # KL has no gradient while the learner still equals it) ...
    assert _train_kl(seqs, convex=True, beta=0.5, updates=1, version=100) == _train_kl(
        seqs, convex=False, beta=0.25, updates=1, version=100
    )
    # ... and from the second update on the round-start policy pulls too
    assert _train_kl(seqs, convex=True, beta=0.5, updates=2, version=100) != _train_kl(
        seqs, convex=False, beta=0.25, updates=2, version=100
    )


def test_a_round_that_trains_leaves_no_gradients_behind():
    """Gradients live only inside the step: between rounds they would hold the trainable weights' size
    again through the next sampling and the checkpoint save (the Quick-start's peak memory)."""
    from swarmnode.config import NodeConfig, SamplingConfig, TasksConfig
    from swarmnode.rounds import RoundContext, run_round
    from swarmnode.tasks import TaskBank

    cfg = NodeConfig(
        model=ModelConfig(name="tiny"),
        tasks=TasksConfig(mix={"basic_arithmetic": {}}),
        sampling=SamplingConfig(questions_per_round=1, completions_per_question=4, max_new_tokens=6),
        train=TRAIN,
    )
    policy = load_policy(cfg.model)
    trainer = Trainer(policy.model, policy.tokenizer.pad_token_id, cfg.train)

    def an_informative_group(_round, local):  # the random tiny model earns no reward of its own
        return [replace(local[0], rewards=tuple(float(i % 2) for i in range(4)))]

    ctx = RoundContext(
        cfg=cfg,
        policy=policy,
        bank=TaskBank(cfg.tasks, default_seed=0),
        sampler=HFSampler(policy.model, policy.tokenizer),
        trainer=trainer,
        peer_id="p",
        exchange=an_informative_group,
    )
    record = run_round(ctx, 1)
    assert record.train.tokens > 0 and trainer.policy_version == 1
    assert all(p.grad is None for p in policy.model.parameters())


def _share_changed_by_a_step(sequences, dtype: str) -> float:
    policy = load_policy(ModelConfig(name="tiny", dtype=dtype))
    before = [p.detach().clone() for p in policy.model.parameters()]
    Trainer(policy.model, policy.tokenizer.pad_token_id, TrainConfig()).step(sequences)  # lr 1e-6
    moved = sum(int((p.detach() != b).sum()) for p, b in zip(policy.model.parameters(), before, strict=True))
    return moved / sum(b.numel() for b in before)


def test_the_default_weights_keep_a_step_at_the_default_learning_rate(sampled):
    """model.dtype=auto resolves to fp32 on every device, CUDA included (it was bf16 there): bf16 weights
    drop AdamW updates below their resolution, which at RL learning rates is nearly all of them."""
    _, sequences = sampled
    assert resolve_dtype("auto") == torch.float32
    assert _share_changed_by_a_step(sequences, "auto") > 0.5
    assert _share_changed_by_a_step(sequences, "bfloat16") < 0.1
