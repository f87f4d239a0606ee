"""From rollout groups to padded micro-batches, on the real tiny models and tokenizers."""

from __future__ import annotations

import random

import pytest
import torch

from swarmnode.config import ModelConfig, TinyModelConfig
from swarmnode.learn.batch import (
    TrainSequence,
    completion_logprobs,
    head_logprobs,
    microbatches,
    pad_batch,
    to_sequences,
)
from swarmnode.learn.precision import autocast_dtype
from swarmnode.policy import Policy, load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def policies() -> dict[str, Policy]:
    return {
        family: load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(family=family)))
        for family in ("llama", "qwen2")
    }


@pytest.fixture(scope="module")
def llama(policies) -> Policy:
    return policies["llama"]


def group(
    rewards: tuple[float, ...],
    completions: tuple[Completion, ...],
    fingerprint: str,
    question: str = "What is 2 + 3?",
) -> RolloutGroup:
    return RolloutGroup(
        ref=TaskRef.make("basic_arithmetic", 0, 0),
        question=question,
        completions=completions,
        rewards=rewards,
        format_ok=tuple(False for _ in rewards),
        task_scores=rewards,
        provenance=Provenance("local", "peer-a", 0, 1, "tiny", fingerprint),
    )


def sampled(policy: Policy, texts: list[str]) -> tuple[Completion, ...]:
    """Completions as the local sampler returns them: exact ids (EOS at the end) and behaviour log-probs."""
    tok = policy.tokenizer
    out = []
    for i, text in enumerate(texts):
        ids = tuple(tok(text, add_special_tokens=False)["input_ids"]) + (tok.eos_token_id,)
        out.append(Completion(text, ids, tuple(-0.5 - i - 0.01 * j for j in range(len(ids))), True))
    return tuple(out)


def test_zero_advantage_groups_are_dropped(llama: Policy) -> None:
    fp = llama.tokenizer_fingerprint
    texts = ["5", "<answer>5</answer>", "six", "<answer>4</answer>"]
    flat = group((0.5, 0.5, 0.5, 0.5), sampled(llama, texts), fp)
    signal = group((1.0, 0.0, 0.0, 1.0), sampled(llama, texts), fp, question="What is 9 - 4?")
    tiny_diff = group((0.1, 0.1 + 1e-12), sampled(llama, texts[:2]), fp)

    seqs = to_sequences([flat, signal, tiny_diff], llama.tokenizer, fp, scale_advantages=True)

    assert [s.group for s in seqs] == [signal] * 4
    assert [s.advantage for s in seqs] == pytest.approx([0.866, -0.866, -0.866, 0.866], abs=1e-3)
    assert seqs[0].prompt_ids == tuple(encode_prompt(llama.tokenizer, "What is 9 - 4?"))
    # local completions on the learner's tokenizer keep the sampled ids and behaviour log-probs as they are
    for seq, completion in zip(seqs, signal.completions, strict=True):
        assert seq.completion_ids == completion.token_ids and seq.behaviour_logprobs == completion.logprobs
    unscaled = to_sequences([signal], llama.tokenizer, fp, scale_advantages=False)
    assert [s.advantage for s in unscaled] == [0.5, -0.5, -0.5, 0.5]


def test_a_peer_group_on_another_tokenizer_is_retokenized_without_behaviour_logprobs(policies) -> None:
    llama, qwen = policies["llama"], policies["qwen2"]
    assert llama.tokenizer_fingerprint != qwen.tokenizer_fingerprint
    texts = ["12 + 7 = 19\n<answer>19</answer>", "nineteen", "<answer>20"]
    peer = list(sampled(qwen, texts))  # qwen ids: meaningless to the llama learner
    peer[2] = Completion(peer[2].text, peer[2].token_ids[:-1], peer[2].logprobs[:-1], finished=False)
    foreign = group((1.0, 0.0, 0.2), tuple(peer), qwen.tokenizer_fingerprint)

    seqs = to_sequences([foreign], llama.tokenizer, llama.tokenizer_fingerprint, scale_advantages=True)

    tok = llama.tokenizer
    assert len(seqs) == 3
    for seq, completion in zip(seqs, foreign.completions, strict=True):
        ids = tuple(tok(completion.text, add_special_tokens=False)["input_ids"])
        assert seq.completion_ids == (ids + (tok.eos_token_id,) if completion.finished else ids)
        assert seq.completion_ids != completion.token_ids
        assert seq.behaviour_logprobs is None
        assert tok.decode(seq.completion_ids, skip_special_tokens=True).replace(
            " ", ""
        ) == completion.text.replace(" ", "")
    assert seqs[0].prompt_ids == tuple(encode_prompt(tok, foreign.question))  # learner's own chat template


def _seq(prompt_len: int, completion_len: int, start: int = 10, logprobs: bool = True) -> TrainSequence:
    prompt = tuple(range(start, start + prompt_len))
    completion = tuple(range(start + 100, start + 100 + completion_len))
    behaviour = tuple(-0.1 * (j + 1) for j in range(completion_len)) if logprobs else None
    return TrainSequence(prompt, completion, 0.25 * completion_len, behaviour, group=None)  # type: ignore[arg-type]


def test_microbatches_respect_the_token_budget_and_sort_by_length() -> None:
    rng = random.Random(0)
    seqs = [_seq(rng.randint(1, 40), rng.randint(1, 40)) for _ in range(60)] + [_seq(300, 200)]  # > budget
    budget = 400

    batches = microbatches(seqs, budget)

    flat = [s for b in batches for s in b]
    assert sorted(map(id, flat)) == sorted(map(id, seqs))  # each sequence exactly once
    assert [s.length for s in flat] == sorted(s.length for s in seqs)  # ascending across and within batches
    for b in batches:
        assert len(b) * max(s.length for s in b) <= budget or len(b) == 1
    assert batches[-1] == [seqs[-1]]  # too long for the budget: alone
    for b, nxt in zip(batches, batches[1:], strict=False):  # greedy: the next one did not fit
        assert (len(b) + 1) * nxt[0].length > budget
    assert len(batches) < len(seqs) // 2  # and it does pack


def test_pad_batch_left_pads_with_completions_at_the_tail() -> None:
    seqs = [_seq(3, 2, start=10), _seq(5, 4, start=20), _seq(2, 1, start=30, logprobs=False)]
    pad = 0

    batch = pad_batch(seqs, pad, CPU)

    assert batch.input_ids.shape == (3, 9) and batch.completion_mask.shape == (3, 4)
    for row, seq in enumerate(seqs):
        ids = list(seq.prompt_ids + seq.completion_ids)
        n, c = len(ids), len(seq.completion_ids)
        assert batch.input_ids[row].tolist() == [pad] * (9 - n) + ids
        assert batch.attention_mask[row].tolist() == [0] * (9 - n) + [1] * n
        assert batch.position_ids[row, 9 - n :].tolist() == list(range(n))
        assert batch.completion_mask[row].tolist() == [False] * (4 - c) + [True] * c
        # the completion mask selects exactly the completion tokens among the last `width` targets
        assert batch.input_ids[row, -4:][batch.completion_mask[row]].tolist() == list(seq.completion_ids)
        if seq.behaviour_logprobs is None:
            assert not batch.has_behaviour[row].any() and not batch.behaviour_logp[row].any()
        else:
            assert batch.has_behaviour[row].tolist() == batch.completion_mask[row].tolist()
            assert batch.behaviour_logp[row, 4 - c :].tolist() == pytest.approx(seq.behaviour_logprobs)
    assert batch.advantages.tolist() == [0.5, 1.0, 0.25]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.no_grad()
def test_completion_logprobs_match_unpadded_per_sequence_values(policies, family: str) -> None:
    """Padding must not leak: each row equals the same sequence run alone, without any padding."""
    policy = policies[family]
    model, tok = policy.model, policy.tokenizer
    gen = torch.Generator().manual_seed(0)
    questions = [
        "What is 2 + 3?",
        "Is (P or Q) and not P true when P is false and Q is true? Answer yes or no.",
    ]
    seqs = []
    for i, (question, completion_len) in enumerate(
        [(questions[0], 12), (questions[1], 3), (questions[0], 1)]
    ):
        prompt = tuple(encode_prompt(tok, question + " " * i))
        completion = tuple(torch.randint(3, len(tok), (completion_len,), generator=gen).tolist())
        seqs.append(TrainSequence(prompt, completion, 1.0, None, group=None))  # type: ignore[arg-type]
    assert len({s.length for s in seqs}) == 3  # real padding in every row but one

    batch = pad_batch(seqs, tok.pad_token_id, policy.device)
    padded = completion_logprobs(model, batch)

    width = batch.completion_width
    for row, seq in enumerate(seqs):
        ids = torch.tensor([seq.prompt_ids + seq.completion_ids])
        logp = model(input_ids=ids).logits[0].float().log_softmax(-1)
        p, c = len(seq.prompt_ids), len(seq.completion_ids)
        direct = (
            logp[p - 1 : p - 1 + c].gather(-1, torch.tensor(seq.completion_ids).unsqueeze(-1)).squeeze(-1)
        )
        torch.testing.assert_close(padded[row, width - c :], direct, rtol=0, atol=1e-5)


@torch.no_grad()
def test_bf16_autocast_runs_the_forward_in_bf16_and_stays_close_to_fp32(policies) -> None:
    """The learner's mixed precision: bf16 matmuls over fp32 weights, log-softmax in fp32."""
    policy = policies["llama"]
    tok = policy.tokenizer
    prompt = tuple(encode_prompt(tok, "What is 2 + 3?"))
    seqs = [TrainSequence(prompt, tuple(range(40, 40 + n)), 1.0, None, group=None) for n in (3, 9)]  # type: ignore[arg-type]
    batch = pad_batch(seqs, tok.pad_token_id, policy.device)

    full = completion_logprobs(policy.model, batch)
    mixed = completion_logprobs(policy.model, batch, autocast=torch.bfloat16)

    mask = batch.completion_mask
    assert mixed.dtype == torch.float32 and next(policy.model.parameters()).dtype == torch.float32
    gap = (full - mixed)[mask].abs()
    assert 0 < gap.max().item() < 0.05  # bf16 rounding: present, and small

    assert autocast_dtype("off", CPU, torch.float32) is None
    assert autocast_dtype("bfloat16", CPU, torch.float32) == torch.bfloat16
    assert autocast_dtype("bfloat16", CPU, torch.bfloat16) is None  # bf16 weights: nothing to autocast
    assert autocast_dtype("auto", CPU, torch.float32) is None  # CPU: only when asked for


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_chunked_head_has_exact_log_probs_and_gradients(temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=gen)

    def chunked(h, w):
        return head_logprobs(h, w, targets, temperature, chunk=3)  # 7 rows: chunks of 3, 3 and 1

    reference = (hidden @ weight.T / temperature).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(chunked(hidden, weight), reference, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(chunked, (hidden, weight))
    frozen = weight.detach()  # a frozen head (LoRA): no weight gradient is computed
    chunked(hidden, frozen).sum().backward()
    assert hidden.grad is not None and frozen.grad is None
