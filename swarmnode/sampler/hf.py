"""transformers backend: shares the trainer's model object, so weight sync is free.

A decode loop of its own instead of ``generate``, for three costs ``generate`` pays on a CPU:
- each prompt's prefill runs once and its KV cache is repeated for the G samples (``generate`` with
  ``num_return_sequences`` prefills every prompt G times: ~200 prompt tokens x G rows, most of a round's
  sampling compute), and only the last prompt position goes through the LM head;
- a finished completion leaves the batch (as in vLLM) instead of stepping as padding until the longest
  one ends;
- each step's log-probs are gathered as it goes, where ``generate(output_logits=True)`` keeps every
  step's [rows, vocabulary] logits until the end (~800 MB for 32 rows x 128 steps x 49k);
and prompts go in waves whose KV cache has a named bound (``KV_CACHE_BYTES``).
The distribution is ``generate``'s plain temperature sampling (no top-k / top-p, so the recorded
log-probs are exactly the behaviour distribution's); positions are the learner's (padding skipped), so
the log-probs are the learner's up to float rounding (tests/unit/test_sampler.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from swarmnode.learn.batch import left_pad
from swarmnode.rollouts import Completion
from swarmnode.sampler.base import Sampler

# The KV cache of one wave of prompts (and their samples), 46 KB a token for SmolLM2 in fp32. It sits
# beside the weights and AdamW's moments; 512 MiB keeps sampling below the training step's peak (which
# adds the gradients, 0.54 GB, and the activations), so the round's peak stays the step's
# (docs/performance.md "Memory and time of a Quick-start round"). A decode step costs about the same
# for 16 rows as for 32 on a CPU, so a second wave nearly doubles the decode steps: one wave holds
# 4 x 8 rows of prompts up to ~230 tokens (+128 new), 3 x 8 up to ~340.
KV_CACHE_BYTES = 512 * 2**20


class HFSampler(Sampler):
    name = "hf"

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_id = tokenizer.eos_token_id

    def sample(
        self, prompts: Sequence[Sequence[int]], n: int, *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]:
        generator = torch.Generator(device=next(self.model.parameters()).device).manual_seed(seed)
        rows = self.decode(
            prompts, n, max_new_tokens, lambda logits: sample_pick(logits, temperature, generator)
        )
        results: list[list[Completion]] = [[] for _ in prompts]
        for row, (ids, logprobs) in enumerate(rows):
            results[row // n].append(
                Completion(
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    token_ids=tuple(ids),
                    logprobs=tuple(logprobs),
                    finished=bool(ids) and ids[-1] == self.eos_id,
                )
            )
        return results

    def greedy(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """The argmax completion of each prompt (evaluation, and tests of the decode loop)."""
        rows = self.decode(prompts, 1, max_new_tokens, argmax_pick)
        return [ids for ids, _ in rows]

    @torch.no_grad()
    def decode(self, prompts: Sequence[Sequence[int]], n: int, max_new_tokens: int, pick) -> list:
        """(token ids, log-probs) for ``n`` rows per prompt, prompt-major; ``pick(logits [rows, V])`` returns
        (next ids [rows], their log-probs [rows]). A row ends after EOS or ``max_new_tokens`` tokens.
        Prompts go in waves whose KV cache stays within ``KV_CACHE_BYTES``."""
        was_training = self.model.training
        self.model.eval()
        try:
            per_token = kv_bytes_per_token(_base(self.model).config, next(self.model.parameters()).dtype)
            rows: list = [None] * (len(prompts) * n)
            for wave in waves([len(p) for p in prompts], n, max_new_tokens, per_token):
                done = self._decode([prompts[i] for i in wave], n, max_new_tokens, pick)
                for k, i in enumerate(wave):
                    rows[i * n : (i + 1) * n] = done[k * n : (k + 1) * n]
            return rows
        finally:
            self.model.train(was_training)

    def _decode(self, prompts, n, max_new_tokens, pick) -> list:
        device = next(self.model.parameters()).device
        input_ids, attention = (t.to(device) for t in left_pad(prompts, self.pad_id))
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=_base(self.model).config)
        cache_kw = _cache_keyword(self.model)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_kw: cache},
        )
        # the G samples of a prompt share its prefill: repeat the cache, not the computation
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1].repeat_interleave(n, dim=0)
        attention = attention.repeat_interleave(n, dim=0)
        next_pos = positions[:, -1:].repeat_interleave(n, dim=0) + 1
        live = torch.arange(len(prompts) * n, device=device)  # which output row each batch row is
        tokens: list[list[int]] = [[] for _ in range(len(live))]
        logprobs: list[list[float]] = [[] for _ in range(len(live))]
        for step in range(max_new_tokens):
            ids, logp = pick(logits)
            for row, token, value in zip(live.tolist(), ids.tolist(), logp.tolist(), strict=True):
                tokens[row].append(token)
                logprobs[row].append(value)
            going = ids != self.eos_id
            if step + 1 == max_new_tokens or not bool(going.any()):
                break
            if not bool(going.all()):  # finished rows leave the batch
                keep = going.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                live, ids, attention, next_pos = live[keep], ids[keep], attention[keep], next_pos[keep]
            attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=1)
            logits = self.model(
                input_ids=ids[:, None],
                attention_mask=attention,
                position_ids=next_pos,
                use_cache=True,
                **{cache_kw: cache},
            ).logits[:, -1]
            next_pos = next_pos + 1
        return list(zip(tokens, logprobs, strict=True))


def _cache_keyword(model) -> str:
    """The name the model's forward takes its KV cache by: ``cache`` in transformers from 5.2x on, which
    warns on every start when given ``past_key_values`` (deprecated), and ``past_key_values`` before."""
    forward = inspect.signature(_base(model).forward).parameters
    return "cache" if "cache" in forward else "past_key_values"


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token holds in the cache, over all layers."""
    heads = getattr(config, "num_attention_heads", 1)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype.itemsize


def waves(lengths: Sequence[int], n: int, max_new_tokens: int, per_token: int) -> list[list[int]]:
    """Prompt indices in waves, shortest prompts first, each wave's cache -- ``n`` rows per prompt, each
    as wide as the wave's longest prompt plus ``max_new_tokens`` -- within ``KV_CACHE_BYTES``; one
    prompt at least. Sorting keeps similar lengths together, so few waves and little padding."""
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        # sorted: the newcomer is the wave's widest prompt
        if out and (len(out[-1]) + 1) * n * (lengths[i] + max_new_tokens) * per_token <= KV_CACHE_BYTES:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def sample_pick(logits: torch.Tensor, temperature: float, generator: torch.Generator):
    """A token per row from softmax(logits / temperature), and its log-prob at that temperature."""
    logp = (logits.float() / temperature).log_softmax(-1)
    ids = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1)


def argmax_pick(logits: torch.Tensor):
    logp = logits.float().log_softmax(-1)
    ids = logp.argmax(-1)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1)
