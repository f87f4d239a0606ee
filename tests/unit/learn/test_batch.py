"""From rollout groups to padded micro-batches, on the real tiny models and tokenizers."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from swarmnode.learn.batch import PEER_TOKEN_FACTOR, TrainSequence, microbatches, pad_batch, to_sequences
from swarmnode.policy import Policy
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef

CPU = torch.device("cpu")


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


# --- peer groups: the learner trains only on ids it derived from the scored text ------------------------


def peer_group(
    rewards: tuple[float, ...], completions: tuple[Completion, ...], fingerprint: str
) -> RolloutGroup:
    return replace(
        group(rewards, completions, fingerprint),
        provenance=Provenance("peer", "peer-b", 0, 1, "tiny", fingerprint),
    )


def ours(policy: Policy, text: str, finished: bool = True) -> tuple[int, ...]:
    tok = policy.tokenizer
    ids = tuple(tok(text, add_special_tokens=False)["input_ids"])
    return ids + (tok.eos_token_id,) if finished else ids


def test_a_peer_with_our_fingerprint_and_forged_ids_trains_none_of_its_ids(llama: Policy) -> None:
    """The text is what was scored; ids that do not spell it must never be what the learner pushes up."""
    fp = llama.tokenizer_fingerprint
    texts = ["<answer>5</answer>", "no idea"]
    forged = tuple(
        Completion(t, (7, 7, 7, 7), (-0.1, -0.1, -0.1, -0.1), True) for t in texts
    )  # the peer copied our fingerprint from our roster card
    seqs = to_sequences([peer_group((1.0, 0.0), forged, fp)], llama.tokenizer, fp, scale_advantages=True)
    assert [s.completion_ids for s in seqs] == [ours(llama, t) for t in texts]
    assert all(s.behaviour_logprobs is None for s in seqs)  # no id in common: no claimed log-prob used


def test_out_of_vocabulary_peer_ids_never_reach_the_model(llama: Policy) -> None:
    fp = llama.tokenizer_fingerprint
    bad = tuple(Completion(t, (0xFFFFFFFF, 3), (-0.5, -0.5), True) for t in ("<answer>5</answer>", "x"))
    seqs = to_sequences([peer_group((1.0, 0.0), bad, fp)], llama.tokenizer, fp, scale_advantages=True)
    assert len(seqs) == 2
    assert all(0 <= i < len(llama.tokenizer) for s in seqs for i in s.prompt_ids + s.completion_ids)


def test_peer_logprobs_are_used_only_where_its_ids_equal_ours(llama: Policy) -> None:
    fp = llama.tokenizer_fingerprint
    honest, diverging = sampled(llama, ["<answer>19</answer>", "nineteen or so"])
    cut = len(diverging.token_ids) // 2
    diverging = replace(
        diverging, token_ids=diverging.token_ids[:cut] + (5,) * (len(diverging.token_ids) - cut)
    )
    seqs = to_sequences(
        [peer_group((1.0, 0.0), (honest, diverging), fp)], llama.tokenizer, fp, scale_advantages=True
    )
    assert seqs[0].completion_ids == honest.token_ids and seqs[0].behaviour_logprobs == honest.logprobs
    assert seqs[1].completion_ids == ours(llama, diverging.text)
    kept = seqs[1].behaviour_logprobs
    assert kept[:cut] == diverging.logprobs[:cut]  # the common prefix keeps the peer's log-probs ...
    assert all(math.isnan(x) for x in kept[cut:])  # ... the rest is unknown (neutral in offpolicy.py)


def test_a_peer_group_longer_than_the_receivers_own_completions_is_dropped(llama: Policy) -> None:
    fp = llama.tokenizer_fingerprint
    long_text = "1 + 1 = 2. " * 40
    local = group((1.0, 0.0), sampled(llama, ["<answer>5</answer>", long_text]), fp)
    peer = peer_group((1.0, 0.0), sampled(llama, ["<answer>5</answer>", long_text]), fp)
    short = peer_group((1.0, 0.0), sampled(llama, ["<answer>5</answer>", "six"]), fp)
    seqs = to_sequences([local, peer, short], llama.tokenizer, fp, scale_advantages=True, max_new_tokens=16)
    assert {id(s.group) for s in seqs} == {id(local), id(short)}  # own groups are never cut
    bound = PEER_TOKEN_FACTOR * 16 + 1
    assert all(len(s.completion_ids) <= bound for s in seqs if s.group is short)


def test_a_peer_group_that_fails_to_convert_is_dropped_and_the_round_goes_on(llama: Policy) -> None:
    fp = llama.tokenizer_fingerprint

    class Fragile:
        """The learner's tokenizer, failing on one text (any per-group error caused by peer data)."""

        def __init__(self, tok):
            self.tok = tok

        def __call__(self, text, **kw):
            if "BOOM" in text:
                raise IndexError("tokenizer crashed")
            return self.tok(text, **kw)

        def __getattr__(self, name):
            return getattr(self.tok, name)

    bad = peer_group((1.0, 0.0), sampled(llama, ["<answer>BOOM</answer>", "x"]), fp)
    good = peer_group((1.0, 0.0), sampled(llama, ["<answer>5</answer>", "x"]), fp)
    seqs = to_sequences([bad, good], Fragile(llama.tokenizer), fp, scale_advantages=True)
    assert {id(s.group) for s in seqs} == {id(good)}
