"""Peak memory of one call, for comparing training steps in one process.

CUDA: ``torch.cuda.max_memory_allocated`` after a reset, minus what was allocated before the call (exact).
CPU: the process's resident set sampled every millisecond by a thread, peak minus the value before the
call. glibc keeps freed heap memory mapped, so the RSS would not fall between calls; ``return_freed_memory``
makes every allocation of 64 KiB or more its own mapping, returned to the system when freed (tensors of
a training step are far larger), so the RSS follows live memory and each call's peak stands alone.
"""

from __future__ import annotations

import os
import threading

import torch

from swarmnode.learn.heap import return_large_blocks_on_free

MMAP_THRESHOLD_BYTES = 64 * 1024  # far below the node's 4 MiB: every tensor of a step is its own mapping
SAMPLE_S = 0.001


def return_freed_memory() -> bool:
    """glibc's mmap threshold at MMAP_THRESHOLD_BYTES (module docstring); False where there is no glibc."""
    return return_large_blocks_on_free(MMAP_THRESHOLD_BYTES)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes(fn, device: torch.device) -> tuple[object, int]:
    """(fn(), the most memory it held at once beyond what was held before it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - before
    before = _rss_bytes()
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            peak[0] = max(peak[0], _rss_bytes())

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        result = fn()
    finally:
        done.set()
        watcher.join()
    return result, max(peak[0], _rss_bytes()) - before
