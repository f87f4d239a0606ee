"""transformers ``generate`` backend: shares the trainer's model object, so weight sync is free."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig

from swarmnode.learn.batch import left_pad
from swarmnode.rollouts import Completion
from swarmnode.sampler.base import Sampler


class HFSampler(Sampler):
    name = "hf"

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_id = tokenizer.eos_token_id

    @torch.no_grad()
    def sample(
        self, prompts: Sequence[Sequence[int]], n: int, *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]:
        device = next(self.model.parameters()).device
        input_ids, attention = left_pad(prompts, self.pad_id)
        width = input_ids.shape[1]
        # Plain temperature sampling (no top-k/top-p) so the recorded log-probs are exactly the
        # behaviour distribution's.
        gen_cfg = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=gen_cfg
        )
        self.model.train(was_training)
        new_tokens = out.sequences[:, width:]
        # One step at a time: stacking [B*n, T, V] logits would multiply peak memory for a 49k vocab.
        logprobs = torch.stack(
            [
                (step.float() / temperature).log_softmax(-1).gather(-1, new_tokens[:, t : t + 1]).squeeze(-1)
                for t, step in enumerate(out.logits)
            ],
            dim=1,
        )
        results: list[list[Completion]] = [[] for _ in prompts]
        for row in range(new_tokens.shape[0]):
            ids = new_tokens[row].tolist()
            finished = self.eos_id in ids
            length = ids.index(self.eos_id) + 1 if finished else len(ids)
            ids = ids[:length]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            results[row // n].append(
                Completion(
                    text=text,
                    token_ids=tuple(ids),
                    logprobs=tuple(logprobs[row, :length].tolist()),
                    finished=finished,
                )
            )
        return results
