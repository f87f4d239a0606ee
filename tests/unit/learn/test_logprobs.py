"""Completion log-probs under the learner and the chunked LM head, on the real tiny models."""

from __future__ import annotations

import pytest
import torch

from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs, head_logprobs
from swarmnode.learn.precision import autocast_dtype
from swarmnode.prompts import encode_prompt

CPU = torch.device("cpu")


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
    # auto stays fp32 on every CPU, AVX512-BF16 ones included: oneDNN's per-shape bf16 kernels grow a
    # node's memory every round there (learn/precision.py)
    assert autocast_dtype("auto", CPU, torch.float32) is None
    assert autocast_dtype("auto", torch.device("meta"), torch.float32) is None


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


def test_the_fused_head_adds_its_weight_gradient_into_grad_and_no_tensor_beside_it() -> None:
    """With ``fuse_weight_grad`` and a ``.grad`` present (the trainer's accumulated gradients) the head's
    weight gradient goes straight into it, autograd receives none (so no [V, H] tensor exists beside
    ``.grad``);
    without a ``.grad`` the result is the plain one."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=gen)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=gen)
    upstream = torch.randn(7, dtype=torch.float64, generator=gen)

    def backward(fuse: bool) -> None:
        (head_logprobs(hidden, weight, targets, chunk=3, fuse_weight_grad=fuse) * upstream).sum().backward()

    backward(fuse=False)
    plain = weight.grad.clone()
    weight.grad = None
    backward(fuse=True)  # no .grad yet: autograd's tensor, as without fusion
    torch.testing.assert_close(weight.grad, plain, rtol=0, atol=0)

    before = torch.full_like(plain, 0.5)
    weight.grad = before
    handed_to_autograd = []
    weight.register_hook(lambda grad: handed_to_autograd.append(grad))
    backward(fuse=True)
    assert weight.grad is before  # added in place ...
    assert all(grad is None for grad in handed_to_autograd)  # ... and autograd got no tensor
    torch.testing.assert_close(weight.grad, 0.5 + plain, rtol=1e-12, atol=1e-12)
