"""The sampler's behaviour log-probs are the learner's log-probs of the same tokens (on-policy ratio 1)."""

import pytest
import torch

from swarmnode.config import ModelConfig, SamplingConfig, TinyModelConfig
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.policy import load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.sampler import hf, make_sampler
from swarmnode.sampler.hf import HFSampler, argmax_pick
from swarmnode.sampler.vllm import unavailable


@pytest.mark.parametrize(("family", "temperature"), [("llama", 1.0), ("qwen2", 0.7)])
def test_behaviour_logprobs_match_learner(family, temperature):
    policy = load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(family=family)))
    sampler = HFSampler(policy.model, policy.tokenizer)
    prompts = [encode_prompt(policy.tokenizer, q) for q in ("What is 2 + 3?", "Is p or not p true?")]
    groups = sampler.sample(prompts, 3, max_new_tokens=12, temperature=temperature, seed=7)
    assert [len(g) for g in groups] == [3, 3]
    sequences = []
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert c.finished == (c.token_ids[-1] == policy.tokenizer.eos_token_id)
            assert c.text == policy.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            sequences.append(TrainSequence(tuple(prompt), c.token_ids, 0.0, c.logprobs, None))
    batch = pad_batch(sequences, policy.tokenizer.pad_token_id, policy.device)
    with torch.no_grad():
        learner = completion_logprobs(policy.model, batch, temperature)
    mask = batch.completion_mask
    assert torch.allclose(learner[mask], batch.behaviour_logp[mask], atol=1e-4)
    # and a different temperature would not match: the check is sensitive
    with torch.no_grad():
        other = completion_logprobs(policy.model, batch, temperature * 2)
    assert not torch.allclose(other[mask], batch.behaviour_logp[mask], atol=1e-2)


def test_same_seed_same_samples():
    policy = load_policy(ModelConfig(name="tiny"))
    sampler = HFSampler(policy.model, policy.tokenizer)
    prompt = [encode_prompt(policy.tokenizer, "What is 1 + 1?")]
    first = sampler.sample(prompt, 4, max_new_tokens=8, temperature=1.0, seed=3)
    again = sampler.sample(prompt, 4, max_new_tokens=8, temperature=1.0, seed=3)
    other = sampler.sample(prompt, 4, max_new_tokens=8, temperature=1.0, seed=4)
    assert first == again
    assert first != other


def test_a_backend_that_cannot_run_falls_back_to_transformers_and_says_why_once():
    """Without vLLM (or with vLLM but a model it has no kernels for, as the tiny one on CPU) the node
    samples with transformers and logs one line that says why."""
    policy = load_policy(ModelConfig(name="tiny"))
    for backend in ("vllm", "auto"):
        messages: list[str] = []
        sampler = make_sampler(SamplingConfig(backend=backend), policy, log=messages.append)
        assert isinstance(sampler, HFSampler)
        assert len(messages) == 1 and messages[0].startswith(f"sampling.backend={backend}: ")
        assert messages[0].endswith("; sampling with transformers")
        assert unavailable(policy.model) in messages[0]
    messages = []
    assert isinstance(make_sampler(SamplingConfig(backend="hf"), policy, log=messages.append), HFSampler)
    assert messages == []
    assert sampler.sync_weights() == 0.0  # shares the trainer's model: nothing to copy


def test_vllm_engine_caches_the_shared_prompt_prefix_unless_told_not_to():
    from swarmnode.sampler.vllm import engine_args

    args = engine_args(SamplingConfig(), "/tmp/folder", torch.float32, seed=3)
    assert args["enable_prefix_caching"] is True and args["load_format"] == "dummy" and args["seed"] == 3
    off = engine_args(SamplingConfig(vllm_prefix_caching=False), "/tmp/folder", torch.float32, seed=3)
    assert off["enable_prefix_caching"] is False


def _tiny_sampler(family: str = "llama") -> HFSampler:
    policy = load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(family=family)))
    return HFSampler(policy.model, policy.tokenizer)


def _ragged_prompts(tokenizer) -> list[list[int]]:
    """Prompts of three different lengths, so the batch is left-padded."""
    questions = (
        "What is 2 + 3?",
        "Is p or not p true? Think first, then answer.",
        "Count to ten, one by one: 1 2 3 4 5 6 7 8 9 10, then back: 10 9 8 7 6 5 4 3 2 1.",
    )
    prompts = [encode_prompt(tokenizer, q) for q in questions]
    assert len({len(p) for p in prompts}) == 3
    return prompts


def test_each_prompt_is_prefilled_once_for_its_samples_and_finished_rows_stop_computing():
    """The model sees each prompt once (not once per sample) and each completion's tokens once, except
    the last (nothing follows it): no row keeps stepping as padding after it ended."""
    sampler = _tiny_sampler()
    prompts = _ragged_prompts(sampler.tokenizer)
    fed: list[tuple[int, int]] = []  # (rows, positions) of every forward pass
    embed = sampler.model.get_input_embeddings()
    hook = embed.register_forward_hook(lambda _m, args, _out: fed.append(tuple(args[0].shape)))
    try:
        groups = sampler.sample(prompts, 4, max_new_tokens=10, temperature=3.0, seed=1)
    finally:
        hook.remove()
    assert fed[0] == (len(prompts), max(len(p) for p in prompts))
    lengths = [len(c.token_ids) for g in groups for c in g]
    assert sum(rows * positions for rows, positions in fed[1:]) == sum(n - 1 for n in lengths)


def test_greedy_decoding_equals_generate_per_prompt_on_ragged_prompts_in_both_families():
    """Sharing the prefill across samples, left padding and dropping finished rows change no token: the
    shared, batched loop decodes what transformers' generate decodes for each prompt alone."""
    for family in ("llama", "qwen2"):
        sampler = _tiny_sampler(family)
        prompts = _ragged_prompts(sampler.tokenizer)
        eos = sampler.tokenizer.eos_token_id
        expected = []
        for prompt in prompts:
            out = sampler.model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos
            )[0, len(prompt) :].tolist()
            expected.append(out[: out.index(eos) + 1] if eos in out else out)
        assert sampler.greedy(prompts, 12) == expected
        # G rows per prompt from one shared prefill: every row is the prompt's own greedy completion
        shared = [ids for ids, _ in sampler.decode(prompts, 3, 12, argmax_pick)]
        assert shared == [ids for ids in expected for _ in range(3)]


def test_rows_that_finish_leave_the_batch_without_changing_the_others():
    """Forcing some rows to end early (EOS) leaves every other row's tokens and log-probs as they were."""
    sampler = _tiny_sampler("qwen2")
    prompts = _ragged_prompts(sampler.tokenizer)
    eos = sampler.tokenizer.eos_token_id
    free = sampler.decode(prompts, 2, 8, argmax_pick)
    calls = [0]

    def end_the_first_live_row_at_steps_2_and_4(logits):
        ids, logp = argmax_pick(logits)
        calls[0] += 1
        if calls[0] in (2, 4):
            ids = ids.clone()
            ids[0] = eos
        return ids, logp

    forced = sampler.decode(prompts, 2, 8, end_the_first_live_row_at_steps_2_and_4)
    ended = [row for row, (ids, _) in enumerate(forced) if len(ids) < 8]
    assert len(ended) == 2 and all(forced[row][0][-1] == eos for row in ended)
    for row, ((ids, logp), (free_ids, free_logp)) in enumerate(zip(forced, free, strict=True)):
        if row not in ended:
            assert ids == free_ids
            assert logp == pytest.approx(free_logp, abs=1e-5)


def test_waves_keep_the_kv_cache_within_its_bound_and_change_no_token(monkeypatch):
    """Prompts are decoded in waves whose cache fits ``KV_CACHE_BYTES``; splitting changes no token."""
    per_token = 1000
    assert hf.waves([100, 100, 100, 100], 8, 28, per_token) == [[0, 1, 2, 3]]  # 4 x 8 x 128 x 1000 = 4.1 MB
    monkeypatch.setattr(hf, "KV_CACHE_BYTES", 2 * 8 * 128 * per_token)
    assert hf.waves([100, 100, 100, 100], 8, 28, per_token) == [[0, 1], [2, 3]]
    assert hf.waves([300, 100, 100], 8, 28, per_token) == [[1, 2], [0]]  # shortest first; 300 alone
    sampler = _tiny_sampler("qwen2")
    prompts = _ragged_prompts(sampler.tokenizer)
    config = sampler.model.config
    assert (
        hf.kv_bytes_per_token(config, torch.float32) == 2 * config.num_hidden_layers * config.hidden_size * 4
    )
    together = sampler.decode(prompts, 2, 8, argmax_pick)
    monkeypatch.setattr(hf, "KV_CACHE_BYTES", 1)  # every prompt its own wave
    assert hf.waves([len(p) for p in prompts], 2, 8, per_token) == [[0], [1], [2]]
    apart = sampler.decode(prompts, 2, 8, argmax_pick)
    assert [ids for ids, _ in apart] == [ids for ids, _ in together]
    for (_, a), (_, b) in zip(apart, together, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    # waves go shortest first; the rows still come back in the caller's prompt order
    longest_first = sampler.decode(prompts[::-1], 2, 8, argmax_pick)
    assert [ids for ids, _ in longest_first] == [
        ids for ids, _ in together[4:] + together[2:4] + together[:2]
    ]


def test_sampling_raises_no_deprecation_warning_in_either_family():
    """Every start printed transformers' `FutureWarning: past_key_values is deprecated` (issue #30): the
    decode loop hands the cache by the name the installed transformers takes."""
    import warnings

    for family in ("llama", "qwen2"):
        sampler = _tiny_sampler(family)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            assert sampler.greedy(_ragged_prompts(sampler.tokenizer), 4)
