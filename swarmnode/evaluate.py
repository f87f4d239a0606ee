"""``swarmnode eval``: pass@1 per task of a checkpoint on held-out questions (greedy decoding).

``score_policy`` is the scoring itself; the in-run probe (probe.py) calls it too, so a probe line and
``swarmnode eval`` of the same weights on the same questions give the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from swarmnode.checkpoint import choose, load_model_weights
from swarmnode.common import log
from swarmnode.config import NodeConfig
from swarmnode.learn.batch import left_pad
from swarmnode.policy import Policy, load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import TaskRef
from swarmnode.tasks import TaskBank

# prompts decoded together, in order of length: 1.6-2.2x the speed of 16 in arrival order on 2 CPU cores,
# the same texts (128 of E1's questions, SmolLM2)
EVAL_BATCH = 64


@torch.no_grad()
def greedy_texts(
    policy, prompts: list[list[int]], max_new_tokens: int, batch_size: int = EVAL_BATCH
) -> list[str]:
    """Greedy completions of ``prompts``, in their order. Batches are taken in order of prompt length, so a
    batch pads its prompts by little."""
    tok = policy.tokenizer
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    texts: list[str] = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        ids, mask = left_pad([prompts[i] for i in batch], tok.pad_token_id)
        width = ids.shape[1]
        out = policy.model.generate(
            input_ids=ids.to(policy.device),
            attention_mask=mask.to(policy.device),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tok.pad_token_id,
        )
        for i, row in zip(batch, out, strict=True):
            texts[i] = tok.decode(row[width:], skip_special_tokens=True)
    return texts


def score_policy(
    policy: Policy,
    bank: TaskBank,
    refs: dict[str, list[TaskRef]],
    *,
    max_new_tokens: int,
    system_prompt: str | None,
) -> dict[str, dict[str, float]]:
    """Per task: mean score, pass@1 (score == 1) and answer-format rate of ``policy``'s greedy answers to
    ``refs``. The one scoring of ``swarmnode eval`` and of the in-run probe (probe.py), so they agree."""
    report = {}
    for task, task_refs in refs.items():
        questions = [bank.question(ref) for ref in task_refs]
        prompts = [encode_prompt(policy.tokenizer, q.text, system_prompt) for q in questions]
        texts = greedy_texts(policy, prompts, max_new_tokens)
        scores = [bank.score(q, t) for q, t in zip(questions, texts, strict=True)]
        report[task] = {
            "score": sum(s[1] for s in scores) / len(scores),
            "pass@1": sum(s[1] >= 1.0 for s in scores) / len(scores),
            "format": sum(s[2] for s in scores) / len(scores),
        }
    return report


def evaluate_checkpoint(
    cfg: NodeConfig, checkpoint: Path | None, per_task: int
) -> dict[str, dict[str, float]]:
    """``score_policy`` of a checkpoint (the newest without one) on the held-out questions."""
    bank = TaskBank(cfg.tasks)
    policy = load_policy(cfg.model, seed=cfg.train.seed)
    info = choose(cfg.run.run_dir, path=checkpoint)
    if info is None:
        log("no checkpoint found: evaluating the initial model")
    else:
        load_model_weights(info, policy.model)
        log(f"evaluating {info.path} (round {info.round})")
    sampling = cfg.sampling
    return score_policy(
        policy,
        bank,
        bank.eval_refs(per_task),
        max_new_tokens=sampling.max_new_tokens,
        system_prompt=sampling.system_prompt,
    )


def format_report(report: dict[str, dict[str, float]]) -> str:
    lines = [f"{'task':<26}{'pass@1':>8}{'score':>8}{'format':>8}"]
    for task, row in report.items():
        lines.append(f"{task:<26}{row['pass@1']:>8.2f}{row['score']:>8.2f}{row['format']:>8.2f}")
    means = {key: sum(r[key] for r in report.values()) / len(report) for key in ("pass@1", "score", "format")}
    lines.append(f"{'mean':<26}{means['pass@1']:>8.2f}{means['score']:>8.2f}{means['format']:>8.2f}")
    return "\n".join(lines)
