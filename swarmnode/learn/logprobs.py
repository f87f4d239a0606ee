"""Log-probabilities of completion tokens under the learner, and the chunked LM head they go through.

``completion_logprobs`` is what the loss differentiates; ``head_logprobs`` computes log softmax of the
LM head for only the rows that are completion tokens, in chunks, with a custom backward, so the
[tokens, vocabulary] logits never exist whole. ``sampler_vs_learner_logprobs`` compares a sampling
backend's recorded log-probs with the learner's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from swarmnode.learn.batch import PaddedBatch, TrainSequence, pad_batch


def completion_logprobs(
    model,
    batch: PaddedBatch,
    temperature: float = 1.0,
    autocast: torch.dtype | None = None,
    *,
    fuse_head_grad: bool = False,
) -> torch.Tensor:
    """Log-prob of each completion token under ``model`` at the sampling temperature: [B, C] (0 where the
    mask is 0). Same temperature as the sampler, so ratios to behaviour log-probs are exact.

    With ``autocast`` the model's forward runs in that dtype (mixed precision); the log-softmax is always
    taken in float32. The LM head runs only on completion positions, in chunks (``head_logprobs``), so
    the [tokens, vocabulary] logits -- with a 49k vocabulary the largest activation of a small model --
    never exist whole; models whose head is not a plain projection (bias, soft-capping, scaling) take
    the model's own head on the last C+1 positions instead (plain layout only). A shared-prompt batch
    (``batch.hidden_index`` set) gathers each token's predicting position from its rows.
    ``fuse_head_grad``: see ``head_logprobs``.
    """
    width = batch.completion_width
    mask = batch.completion_mask
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: LoRA stays inside
    head = base.get_output_embeddings()
    inputs = dict(
        input_ids=batch.input_ids,
        attention_mask=_model_mask(base.config, batch.attention_mask),
        position_ids=batch.position_ids,
        use_cache=False,
    )
    shared = batch.hidden_index is not None
    targets = batch.targets if shared else batch.input_ids[:, -width:]
    device_type = batch.input_ids.device.type
    with torch.autocast(device_type, dtype=autocast or torch.float32, enabled=autocast is not None):
        if not plain_head(base.config, head):
            if shared:
                raise ValueError("the shared-prompt layout needs a plain LM head (see shared.py)")
            logits = model(**inputs, logits_to_keep=width + 1).logits[:, :-1, :].float() / temperature
            return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
        hidden = base.get_decoder()(**inputs).last_hidden_state
        if shared:
            rows = hidden.flatten(0, 1)[batch.hidden_index[mask]]
        else:
            rows = hidden[:, -(width + 1) : -1][mask]  # the last C positions' predictors
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    out[mask] = head_logprobs(
        rows, head.weight, targets[mask], temperature, autocast, fuse_weight_grad=fuse_head_grad
    )
    return out


def _model_mask(config, mask: torch.Tensor) -> torch.Tensor:
    """A block mask as the attention implementation takes it: bool (True = attend) for sdpa, additive
    float for eager; a 2D padding mask unchanged."""
    if mask.dim() != 4 or getattr(config, "_attn_implementation", None) != "eager":
        return mask
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    return torch.where(mask, zero, torch.finfo(torch.float32).min)


def plain_head(config, head) -> bool:
    """Whether logits = hidden @ head.weight.T exactly (what ``head_logprobs`` computes)."""
    scaled = any(
        getattr(config, name, None) not in (None, 1.0)
        for name in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")
    )
    return isinstance(head, torch.nn.Linear) and head.bias is None and not scaled


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    compute_dtype: torch.dtype | None = None,
    chunk: int | None = None,
    *,
    fuse_weight_grad: bool = False,
) -> torch.Tensor:
    """log softmax(hidden @ weight.T / temperature)[targets] for N rows: [N] (float32 or wider),
    differentiable in ``hidden`` and ``weight``. Rows go in chunks of ~4M logits (default), so memory
    stays flat in N.

    ``fuse_weight_grad``: when the backward pass finds a float32 ``weight.grad`` already there (the
    trainer's, from a step's second micro-batch on), the weight's gradient is added into it chunk by
    chunk and autograd gets none, as Megatron-LM's gradient-accumulation fusion does; otherwise a [V, H]
    gradient (113 MB for SmolLM2) exists beside ``.grad`` at the backward pass's peak. Only for callers
    that read ``.grad`` after ``backward()`` (not ``torch.autograd.grad``).
    """
    chunk = chunk or max(1, 2**22 // weight.shape[0])
    dtype = compute_dtype or weight.dtype
    return _HeadLogprobs.apply(hidden, weight, targets, temperature, dtype, chunk, fuse_weight_grad)


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 at least (bf16 logits would round the log-softmax), float64 if computing in it."""
    return torch.promote_types(dtype, torch.float32)


class _HeadLogprobs(torch.autograd.Function):
    """Forward keeps only the per-row log-sum-exp; backward recomputes each chunk's logits, trading one
    more head matmul for never holding [N, V] activations or their gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, dtype, chunk, fuse_weight_grad):
        w = weight.to(dtype)
        out = torch.empty(len(targets), dtype=_softmax_dtype(dtype), device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, len(targets), chunk):
            logits = (hidden[s : s + chunk].to(dtype) @ w.T).to(out.dtype) / temperature
            lse[s : s + chunk] = logits.logsumexp(-1)
            out[s : s + chunk] = (
                logits.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - lse[s : s + chunk]
            )
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.dtype, ctx.chunk = temperature, dtype, chunk
        ctx.fuse_weight_grad = fuse_weight_grad
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse = ctx.saved_tensors
        temperature, dtype, chunk = ctx.temperature, ctx.dtype, ctx.chunk
        w = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_now = weight.grad  # summing into it only where it is as wide as the float32 softmax
        fused = (
            ctx.needs_input_grad[1]
            and ctx.fuse_weight_grad
            and grad_now is not None
            and grad_now.dtype == lse.dtype
        )
        grad_weight = None
        if fused:
            grad_weight = grad_now
        elif ctx.needs_input_grad[1]:
            grad_weight = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device)
        for s in range(0, len(targets), chunk):
            h = hidden[s : s + chunk].to(dtype)
            g_out = grad_out[s : s + chunk, None]
            logits = (h @ w.T).to(lse.dtype) / temperature
            # d log p[target] / d logits = (onehot(target) - softmax) / temperature
            grad = (logits - lse[s : s + chunk, None]).exp_().mul_(-g_out)
            grad.scatter_add_(-1, targets[s : s + chunk, None], g_out)
            grad = grad.div_(temperature).to(dtype)
            if grad_hidden is not None:
                grad_hidden[s : s + chunk] = grad @ w
            if grad_weight is not None and grad.dtype == grad_weight.dtype:
                grad_weight.addmm_(grad.T, h)  # in place: no second [V, H] temporary (113 MB for SmolLM2)
            elif grad_weight is not None:
                grad_weight += (grad.T @ h).to(grad_weight.dtype)  # bf16 products, summed in float32
        if fused:
            return grad_hidden, None, None, None, None, None, None
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def sampler_vs_learner_logprobs(
    model, pad_id: int, prompts: Sequence[Sequence[int]], groups, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs the sampler recorded, ``model``'s own log-probs of the same tokens at ``temperature``),
    flattened over the completion tokens of ``groups`` (one list of Completions per prompt): how far a
    sampling backend's numbers are from the learner's."""
    sequences = [
        TrainSequence(tuple(prompt), c.token_ids, 0.0, c.logprobs, None)  # type: ignore[arg-type]
        for prompt, group in zip(prompts, groups, strict=True)
        for c in group
    ]
    batch = pad_batch(sequences, pad_id, next(model.parameters()).device)
    with torch.no_grad():
        learner = completion_logprobs(model, batch, temperature)
    mask = batch.completion_mask
    return batch.behaviour_logp[mask], learner[mask]
