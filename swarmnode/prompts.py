"""What the model is asked: the system prompt, a worked example, and the chat-templated prompt ids.

Kept apart from ``tasks`` (which regenerates questions with reasoning-gym) so the learner and the
samplers can build prompts without importing reasoning-gym.
"""

from __future__ import annotations

DEFAULT_SYSTEM_PROMPT = "Answer the question. Put the final answer inside <answer></answer> tags."

# A worked example turn before the question: SmolLM2-135M used the tags in 0 of 64 completions with the
# instruction alone and in 17 of 64 with it (easy arithmetic), which is what lets format and task
# reward vary within a group from the first round.
_EXAMPLE = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "3 + 4 = 7\n<answer>7</answer>"},
]


def prompt_messages(question_text: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """Chat messages for one question: the system prompt states the rewarded answer format and one
    example exchange shows it."""
    system = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
    return [{"role": "system", "content": system}, *_EXAMPLE, {"role": "user", "content": question_text}]


def encode_prompt(tokenizer, question: str, system_prompt: str | None = None) -> list[int]:
    """Chat-templated prompt ids ending with the assistant turn's opening."""
    messages = prompt_messages(question, system_prompt)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
