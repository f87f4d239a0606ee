"""The start-up memory line, what to change when the machine cannot hold the run, and the auto rule for
activation checkpointing."""

from __future__ import annotations

import subprocess
import sys

import torch

from swarmnode import memory
from swarmnode.config import ModelConfig, TinyModelConfig, TrainConfig
from swarmnode.learn import heap
from swarmnode.learn.heap import return_freed_heap
from swarmnode.policy import load_policy

TINY = ModelConfig(name="tiny", tiny=TinyModelConfig(family="llama"))
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_training_state_is_three_times_the_trainable_weights_and_checkpointing_shrinks_activations():
    model = load_policy(TINY).model
    train = TrainConfig()
    est = memory.estimate(model, train)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert est.weights == weights and est.training_state == 3 * weights and not est.checkpointed
    half = memory.estimate(model, train.model_copy(update={"token_budget": train.token_budget // 2}))
    assert half.activations * 2 == est.activations
    model.activation_checkpointing_enable()
    checkpointed = memory.estimate(model, train)
    assert checkpointed.checkpointed and checkpointed.activations < est.activations / 5
    with_base = memory.estimate(model, train, frozen_copies=1)  # the drift gate's base model
    assert with_base.frozen == weights and with_base.total == checkpointed.total + weights
    line = memory.describe(with_base, TINY, train, None)
    assert ", frozen copies 0.00, runtime" in line and ", ," not in line
    assert "frozen" not in memory.describe(checkpointed, TINY, train, None)


def test_auto_checkpointing_is_for_large_activations_on_the_cpu():
    model = load_policy(TINY).model  # hidden 64 x 2 layers: a 4096-token micro-batch is ~44 MB
    train = TrainConfig(token_budget=4096)
    assert not memory.checkpointing_pays(model, CPU, train, available=64 * 2**30)
    assert memory.checkpointing_pays(model, CPU, train, available=100 * 2**20)  # a quarter: 25 MB
    huge = train.model_copy(update={"token_budget": 4096 * 64})  # ~2.8 GB of activations
    assert memory.checkpointing_pays(model, CPU, huge, available=64 * 2**30)
    assert not memory.checkpointing_pays(model, CUDA, huge, available=64 * 2**30)


def test_the_line_says_what_to_change_only_when_it_may_not_fit():
    est = memory.MemoryEstimate(weights=2**30, training_state=3 * 2**30, activations=2**30, runtime=2**29)
    train = TrainConfig(token_budget=4096)
    roomy = memory.describe(est, TINY, train, available=64 * 2**30)
    assert "GiB at peak" in roomy and "MAY NOT FIT" not in roomy
    tight = memory.describe(est, TINY, train, available=4 * 2**30)
    assert "MAY NOT FIT" in tight
    assert "model.gradient_checkpointing=true" in tight and "train.token_budget=2048" in tight
    assert memory.available_bytes() is None or memory.available_bytes() > 0


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_freed_heap_goes_back_to_the_system_between_phases():
    """Many small freed blocks below a live one stay resident until ``return_freed_heap``."""
    blocks = [torch.ones(25_000) for _ in range(2000)]  # 100 kB each, 200 MB: glibc's heap, not mmap
    pin = torch.ones(25_000)  # live above them: the heap top cannot shrink on its own
    del blocks
    held = _rss()
    return_freed_heap()
    assert _rss() < held - 150 * 2**20
    del pin


def test_large_blocks_go_back_to_the_system_when_freed_after_the_threshold_is_fixed():
    """glibc raises its mmap threshold when a large block is freed, so the next blocks of that size come
    from the heap and stay resident after free; fixed at MMAP_THRESHOLD_BYTES they are unmapped on free.
    In a fresh process: mallopt is process-wide."""
    script = """
import torch, sys
from swarmnode.learn import heap
if sys.argv[1] == "fixed":
    heap.return_large_blocks_on_free()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
big = torch.ones(4 * 2**20)  # 16 MiB, mmapped; its free raises glibc's threshold to 16 MiB by default
del big
blocks, pins = [], []
for _ in range(40):  # 40 x 4 MiB, each followed by a small live block: freed, none can merge into the top
    blocks.append(torch.ones(2**20))  # of the heap (which glibc trims on its own)
    pins.append(torch.ones(1000))
before = rss()
del blocks
print(before - rss())
"""
    freed = {}
    for mode in ("default", "fixed"):
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True)
        freed[mode] = int(out.stdout.split()[-1])
    assert freed["fixed"] > 120 * 2**20, freed  # the 160 MiB went back at once
    assert freed["default"] < freed["fixed"] - 100 * 2**20, freed  # without it, most stayed resident


def test_a_training_step_returns_its_mid_sized_blocks_and_restores_the_threshold():
    """Inside ``training_heap`` 2 MiB blocks (a [tokens, hidden] activation's size) pinned by small live
    blocks go back to the system when freed; after it the node's 4 MiB threshold is back (they stay), and
    a lower threshold fixed before (the memory benchmark's) is kept inside. In a fresh process."""
    script = """
import torch, sys
from swarmnode.learn import heap
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def freed_of_pinned_2mib_blocks():
    blocks, pins = [], []
    for _ in range(60):  # 60 x 2 MiB, each followed by a small live block, as activations among others
        blocks.append(torch.ones(2**19))
        pins.append(torch.ones(1000))
    before = rss()
    del blocks
    return before - rss()
heap.return_large_blocks_on_free(int(sys.argv[1]))
with heap.training_heap():
    inside = freed_of_pinned_2mib_blocks()
print(inside, freed_of_pinned_2mib_blocks(), heap._fixed_threshold)
"""
    runs = {}
    for threshold in (heap.MMAP_THRESHOLD_BYTES, 64 * 1024):
        out = subprocess.run(
            [sys.executable, "-c", script, str(threshold)], capture_output=True, text=True, check=True
        )
        runs[threshold] = [int(v) for v in out.stdout.split()[-3:]]
    inside, after, threshold_after = runs[heap.MMAP_THRESHOLD_BYTES]
    assert inside > 100 * 2**20, runs  # the 120 MiB went back at once
    assert after < 20 * 2**20 and threshold_after == heap.MMAP_THRESHOLD_BYTES, runs
    low_inside, low_after, low_threshold_after = runs[64 * 1024]
    assert low_inside > 100 * 2**20 and low_after > 100 * 2**20 and low_threshold_after == 64 * 1024, runs


def test_sampling_reuses_its_blocks_instead_of_faulting_them_in_every_step():
    """A decode step allocates and frees the same blocks (logits, activations) each step. Under the node's
    4 MiB threshold a 12 MiB block is a fresh mapping every time, paid in page faults (0.8x vLLM's and
    0.6x ``generate``'s tokens/s); inside ``sampling_heap`` it is reused from the heap, and afterwards the
    threshold the node fixed is back. In a fresh process: mallopt is process-wide."""
    script = """
import resource, torch
from swarmnode.learn import heap
heap.return_large_blocks_on_free()  # what the node fixes at start
def faults_of_steps():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        logits = torch.empty(3 * 2**20)  # 12 MiB, as SmolLM2's [64, 49152] fp32 logits
        logits.fill_(1.0)
        small = torch.ones(1000)  # a live block after it, as in a real step
        del logits, small
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
outside = faults_of_steps()
with heap.sampling_heap():
    faults_of_steps()  # the first step grows the heap once
    inside = faults_of_steps()
print(outside, inside, heap._fixed_threshold == heap.MMAP_THRESHOLD_BYTES)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    outside, inside, restored = out.stdout.split()
    assert int(outside) > 20 * 2000, out.stdout  # ~3,000 4 KiB pages a step, every step
    assert int(inside) < int(outside) / 10, out.stdout
    assert restored == "True"
