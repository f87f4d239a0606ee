"""Shared-prompt training: each group's prompt computed once, its completions attending to it and to
themselves only. It must be the plain computation, only cheaper: same gradients, loss and stats."""

from __future__ import annotations

import pytest
import torch

from swarmnode.config import ModelConfig, OffPolicyConfig, TinyModelConfig, TrainConfig
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.learn.shared import shared_batch, shared_microbatches, supports_shared_prompt
from swarmnode.learn.trainer import Trainer
from swarmnode.policy import load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Provenance, RolloutGroup, TaskRef

CPU = torch.device("cpu")
QUESTIONS = (
    "What is 2 + 3?",
    "Is (P or Q) and not P true when P is false and Q is true? Answer yes or no.",
    "What is 9 - 4?",
    "Sort 3, 1, 2.",
)
# completion lengths per group: ragged groups, groups of one length only, a group of one completion
LENGTHS = ((5, 1, 12, 7), (4, 4, 4, 4), (9,), (3, 3, 11, 2, 6, 6))


def _group(fingerprint: str) -> RolloutGroup:
    provenance = Provenance("local", "p", 0, 1, "tiny", fingerprint)
    return RolloutGroup(TaskRef.make("basic_arithmetic", 0, 0), "q", (), (0.0,), (0.0,), (False,), provenance)


def ragged_batch(family: str) -> tuple[list[TrainSequence], object]:
    """Real prompts of the family's chat template, random completion tokens, advantages of both signs,
    behaviour log-probs on some completions (close to the learner's, so every correction stays active)."""
    policy = load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(family=family)))
    tok = policy.tokenizer
    gen = torch.Generator().manual_seed(0)
    group = _group(policy.tokenizer_fingerprint)
    sequences = []
    for question, lengths in zip(QUESTIONS, LENGTHS, strict=True):
        prompt = tuple(encode_prompt(tok, question))
        for i, n in enumerate(lengths):
            ids = tuple(torch.randint(3, len(tok), (n,), generator=gen).tolist())
            behaviour = tuple(-4.0 - 0.1 * j for j in range(n)) if i % 2 else None
            advantage = (-1.0) ** i * (0.5 + 0.1 * n)
            sequences.append(TrainSequence(prompt, ids, advantage, behaviour, group))
    return sequences, policy


def _trained(family: str, layout: str, token_budget: int = 4096, checkpointing: bool = False):
    sequences, policy = ragged_batch(family)
    if checkpointing:
        policy.model.activation_checkpointing_enable()
    cfg = TrainConfig(lr=1e-3, token_budget=token_budget, autocast="off", batch_layout=layout)
    trainer = Trainer(policy.model, tok_pad(policy), cfg, offpolicy=OffPolicyConfig(local="tis"))
    stats = trainer.step(sequences)
    grads = {name: p.grad.clone() for name, p in policy.model.named_parameters()}
    return stats, grads


def tok_pad(policy) -> int:
    return policy.tokenizer.pad_token_id


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize(
    ("layout", "token_budget", "checkpointing"),
    [("shared", 4096, False), ("packed", 4096, False), ("packed", 300, False), ("packed", 300, True)],
)
def test_shared_prompt_gradients_equal_the_plain_ones(
    family: str, layout: str, token_budget: int, checkpointing: bool
) -> None:
    """fp32, a ragged batch; budget 300 splits groups across micro-batches and rows; activation
    checkpointing (the CPU default for large models) recomputes the same thing."""
    plain_stats, plain = _trained(family, "plain", token_budget)
    stats, shared = _trained(family, layout, token_budget, checkpointing)

    for name, grad in plain.items():
        assert grad.norm() > 0, name
        assert relative_difference(shared[name], grad) <= 1e-5, name
    assert stats.tokens == plain_stats.tokens == sum(map(sum, LENGTHS))
    for field in ("loss", "kl", "clip_low_frac", "clip_high_frac", "grad_norm", "masked_frac", "ess"):
        assert getattr(stats, field) == pytest.approx(getattr(plain_stats, field), rel=1e-5, abs=1e-7), field
    for field in ("is_weight_mean", "is_weight_max", "behaviour_kl"):
        assert getattr(stats, field) == pytest.approx(getattr(plain_stats, field), rel=1e-4), field


@pytest.mark.parametrize(("family", "attention"), [("llama", "sdpa"), ("qwen2", "sdpa"), ("qwen2", "eager")])
@torch.no_grad()
def test_shared_log_probs_equal_the_plain_ones(family: str, attention: str) -> None:
    """sdpa takes the block mask as bool, eager as an additive float mask."""
    sequences, policy = ragged_batch(family)
    policy.model.set_attn_implementation(attention)
    assert supports_shared_prompt(policy.model)
    plain = pad_batch(sequences, tok_pad(policy), CPU)
    expected = completion_logprobs(policy.model, plain)
    for pack in (False, True):
        for rows in shared_microbatches(sequences, 4096, pack=pack):
            batch = shared_batch(rows, tok_pad(policy), CPU)
            got = completion_logprobs(policy.model, batch)
            order = [sequences.index(s) for s in batch.sequences]
            torch.testing.assert_close(
                got[batch.completion_mask], expected[order][plain.completion_mask[order]]
            )


def test_the_block_mask_lets_a_completion_see_its_prompt_and_itself_only() -> None:
    def seq(prompt, completion):
        return TrainSequence(prompt, completion, 1.0, None, None)  # type: ignore[arg-type]

    a1, a2 = seq((1, 2, 3), (10, 11)), seq((1, 2, 3), (12,))
    b1, c1 = seq((4, 5), (13, 14)), seq((6,), (16,))

    (rows,) = shared_microbatches([a1, b1, a2, c1], 4096, pack=True)
    batch = shared_batch(rows, 0, CPU)

    # rows as wide as the longest group (6 tokens); the two short groups share the second row, no padding
    assert batch.input_ids.tolist() == [[1, 2, 3, 10, 11, 12], [4, 5, 13, 14, 6, 16]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 0, 1]]  # restart after prompts
    seen = {}
    for r, ids in enumerate(batch.input_ids.tolist()):
        allowed = batch.attention_mask[r, 0]
        seen.update({ids[q]: sorted(ids[k] for k in range(6) if allowed[q, k]) for q in range(6)})
    assert seen[12] == [1, 2, 3, 12]  # a2 sees its prompt and itself, not a1
    assert seen[11] == [1, 2, 3, 10, 11]
    assert seen[3] == [1, 2, 3]  # the prompt is causal
    assert seen[13] == [4, 5, 13] and seen[16] == [6, 16]  # another group's tokens are invisible
    # each completion token is predicted from the position before it; the first from the prompt's last
    flat = batch.input_ids.flatten()
    predicted_from = batch.hidden_index[batch.completion_mask].tolist()
    targets = batch.targets[batch.completion_mask].tolist()
    by_target = dict(zip(targets, (flat[i].item() for i in predicted_from), strict=True))
    assert by_target == {10: 3, 11: 10, 12: 3, 13: 5, 14: 13, 16: 6}


def test_packing_fills_rows_and_every_sequence_is_trained_once() -> None:
    seqs = [
        TrainSequence(tuple(range(p, p + 20)), tuple(range(100, 100 + n)), 1.0, None, None)  # type: ignore[arg-type]
        for p, lengths in ((0, (30, 30)), (50, (5,)), (70, (3, 4)), (90, (40, 2, 2)))
        for n in lengths
    ]
    for pack in (False, True):
        batches = shared_microbatches(seqs, 200, pack=pack)
        trained = [s for rows in batches for b in [shared_batch(rows, 0, CPU)] for s in b.sequences]
        assert sorted(map(id, trained)) == sorted(map(id, seqs))
        for rows in batches:
            batch = shared_batch(rows, 0, CPU)
            assert batch.input_ids.numel() <= 200 or batch.input_ids.shape[0] == 1

    def computed(pack: bool) -> tuple[int, int]:
        batches = [shared_batch(r, 0, CPU) for r in shared_microbatches(seqs, 200, pack=pack)]
        return sum(b.input_ids.shape[0] for b in batches), sum(b.input_ids.numel() for b in batches)

    rows, unpacked = computed(False)
    packed_rows, packed = computed(True)
    assert sum(20 + n for n in (60, 5, 7, 44)) == 196  # the real tokens
    assert (packed_rows, packed) == (3, 208) and (rows, unpacked) == (4, 272)  # rows of 80, 64, 25 + 27


def test_models_without_shared_prompt_support_train_on_the_plain_layout() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    assert not supports_shared_prompt(gpt2)
    seqs = [TrainSequence((1, 2, 3), (4 + i, 5), 1.0 - 2 * (i % 2), None, None) for i in range(4)]  # type: ignore[arg-type]
    trainer = Trainer(gpt2, 0, TrainConfig(lr=1e-3, autocast="off", batch_layout="packed"))
    assert trainer.step(seqs).tokens == 8
