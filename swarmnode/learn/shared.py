"""Shared-prompt layout: each group's prompt computed once, its completions after it, a block mask.

A group's G completions share one prompt of P tokens (150-250 with the system prompt and the worked
example) and are 20-64 tokens each, so the plain layout (one row per completion) computes the prompt G
times. Here a row holds a *segment* [prompt, c_1, ..., c_k] (with packing, several segments), and
- positions run 0..P-1 on the prompt and restart at P..P+n_j-1 on every completion j: exactly the
  positions each token has in the plain layout;
- the [L, L] attention mask lets the prompt attend causally to itself, completion j to the whole prompt
  and to its own earlier tokens, and nothing to another completion or another segment; padding attends
  only to itself (a fully masked query row would be NaN).
So every token's hidden state is the one it has in the plain layout, and log-probs, loss and gradients
are the plain ones up to float summation order (the prompt's gradient arrives summed over its
completions inside one backward instead of across rows): ``tests/unit/learn/test_shared.py`` holds the
gradients to 1e-5 relative per parameter in fp32.

Packing: segments are placed first-fit by decreasing length into rows no wider than the longest
segment, so short groups fill the room long ones leave instead of padding, while a row's attention (whose
cost grows with the square of its width) is no wider than in the unpacked layout. Rows then form
micro-batches of (rows x widest row) <= ``token_budget`` like sequences do (``batch.microbatches``); a
group longer than the budget is split into several segments, each with the prompt.

The block mask reaches the model as a ready 4D mask, which transformers passes through unchanged; that
needs a model that takes positions from ``position_ids`` (RoPE) and adds no attention pattern of its own
(sliding windows, chunked or hybrid attention) and a plain LM head. ``supports_shared_prompt`` admits
the families known to qualify; every other model trains in the plain layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swarmnode.learn.batch import PaddedBatch, TrainSequence, keep_mask, microbatches
from swarmnode.learn.logprobs import plain_head

SHARED_PROMPT_FAMILIES = frozenset({"llama", "qwen2", "qwen3"})  # RoPE decoders, full attention
MASKED_ATTENTION = frozenset({"sdpa", "eager"})  # implementations that take a 4D mask as given


def supports_shared_prompt(model) -> bool:
    """Whether ``model`` computes the shared-prompt layout exactly (module docstring)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    if getattr(config, "model_type", None) not in SHARED_PROMPT_FAMILIES:
        return False
    if getattr(config, "_attn_implementation", None) not in MASKED_ATTENTION:
        return False
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    return plain_head(config, base.get_output_embeddings())


@dataclass(frozen=True)
class Segment:
    """One prompt and some of the completions that follow it."""

    prompt_ids: tuple[int, ...]
    sequences: tuple[TrainSequence, ...]

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + sum(len(s.completion_ids) for s in self.sequences)


@dataclass(frozen=True)
class Row:
    segments: tuple[Segment, ...]

    @property
    def length(self) -> int:
        return sum(g.length for g in self.segments)


def segments(sequences: Sequence[TrainSequence], token_budget: int) -> list[Segment]:
    """Sequences grouped by prompt (first-seen order); a group whose tokens exceed ``token_budget`` is
    split into consecutive segments, each with the prompt."""
    by_prompt: dict[tuple[int, ...], list[TrainSequence]] = {}
    for seq in sequences:
        by_prompt.setdefault(seq.prompt_ids, []).append(seq)
    out = []
    for prompt, group in by_prompt.items():
        current: list[TrainSequence] = []
        size = len(prompt)
        for seq in group:
            if current and size + len(seq.completion_ids) > token_budget:
                out.append(Segment(prompt, tuple(current)))
                current, size = [], len(prompt)
            current.append(seq)
            size += len(seq.completion_ids)
        out.append(Segment(prompt, tuple(current)))
    return out


def shared_microbatches(
    sequences: Sequence[TrainSequence], token_budget: int, *, pack: bool
) -> list[list[Row]]:
    """Micro-batches of rows: one segment per row, or with ``pack`` several (module docstring)."""
    parts = segments(sequences, token_budget)
    if not parts:
        return []
    if not pack:
        return microbatches([Row((g,)) for g in parts], token_budget)
    width = max(g.length for g in parts)
    rows: list[list[Segment]] = []
    room: list[int] = []
    for seg in sorted(parts, key=lambda g: g.length, reverse=True):
        for i, free in enumerate(room):
            if seg.length <= free:
                rows[i].append(seg)
                room[i] -= seg.length
                break
        else:
            rows.append([seg])
            room.append(width - seg.length)
    return microbatches([Row(tuple(r)) for r in rows], token_budget)


def shared_batch(rows: Sequence[Row], pad_id: int, device: torch.device) -> PaddedBatch:
    """The rows as model input with the block mask, and their completions right-aligned in [B, C]."""
    width = max(r.length for r in rows)
    sequences = tuple(s for r in rows for g in r.segments for s in g.sequences)
    n, c_width = len(sequences), max(len(s.completion_ids) for s in sequences)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    # which segment and which part of it (0 = prompt, j = completion j) each token is; padding gets a
    # segment of its own per position, so it sees only itself
    segment = -1 - torch.arange(width).repeat(len(rows), 1)
    part = torch.zeros((len(rows), width), dtype=torch.long)
    hidden_index = torch.zeros((n, c_width), dtype=torch.long)
    targets = torch.full((n, c_width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, c_width), dtype=torch.bool)
    behaviour = torch.zeros((n, c_width), dtype=torch.float32)
    has_behaviour = torch.zeros((n, c_width), dtype=torch.bool)
    b = 0
    for r, row in enumerate(rows):
        at = 0
        for k, seg in enumerate(row.segments):
            p = len(seg.prompt_ids)
            input_ids[r, at : at + p] = torch.tensor(seg.prompt_ids)
            positions[r, at : at + p] = torch.arange(p)
            segment[r, at : at + p] = k
            last_prompt = r * width + at + p - 1
            at += p
            for j, seq in enumerate(seg.sequences, start=1):
                m = len(seq.completion_ids)
                input_ids[r, at : at + m] = torch.tensor(seq.completion_ids)
                positions[r, at : at + m] = torch.arange(p, p + m)
                segment[r, at : at + m] = k
                part[r, at : at + m] = j
                tail = slice(c_width - m, c_width)
                # token i is predicted by the position before it; the first one by the prompt's last
                start = r * width + at
                hidden_index[b, tail] = torch.tensor([last_prompt, *range(start, start + m - 1)])
                targets[b, tail] = torch.tensor(seq.completion_ids)
                completion_mask[b, tail] = True
                if seq.behaviour_logprobs is not None:
                    behaviour[b, tail] = torch.tensor(seq.behaviour_logprobs, dtype=torch.float32)
                    has_behaviour[b, tail] = True
                at += m
                b += 1
    query, key = torch.arange(width)[:, None], torch.arange(width)[None, :]
    same_segment = segment[:, :, None] == segment[:, None, :]
    visible_part = (part[:, None, :] == 0) | (part[:, :, None] == part[:, None, :])
    block = same_segment & visible_part & (key <= query)
    return PaddedBatch(
        input_ids=input_ids.to(device),
        attention_mask=block[:, None].to(device),
        position_ids=positions.to(device),
        completion_mask=completion_mask.to(device),
        advantages=torch.tensor([s.advantage for s in sequences], dtype=torch.float32, device=device),
        behaviour_logp=behaviour.to(device),
        has_behaviour=has_behaviour.to(device),
        hidden_index=hidden_index.to(device),
        targets=targets.to(device),
        sequences=sequences,
        keep_mask=keep_mask(sequences, c_width, device),
    )
