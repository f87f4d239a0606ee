"""Giving the heap a phase freed back to the system, so the next phase's peak stands on live memory.

glibc keeps freed memory mapped in its heaps, so after sampling (a KV cache grown step by step) or the
backward passes of a step (activations, temporaries) the resident set stays near that phase's peak,
and the next phase's allocations land on top of what the allocator cannot reuse. The round calls
``return_freed_heap`` after sampling and after the step, the trainer before the optimizer step and runs
its step under ``training_heap`` (docs/performance.md, "Memory and time of a Quick-start round").
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

# Blocks at least this large are mmapped, so freeing one gives its pages back at once. glibc otherwise
# raises its threshold (up to 32 MiB) each time such a block is freed, and later tensors of that size
# land in heaps that fragment between phases.
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
# During a CPU training step: a checkpointed backward pass allocates row blocks of 1-4 MiB (SmolLM2: a
# [tokens, 576] activation is 3.2 MiB at 1400 tokens) among blocks that outlive them; in the heap their
# holes stay resident, 0.5 GB of SmolLM2's worst-case step. Mmapped, each costs page faults instead
# (12% of that step's time, docs/performance.md).
TRAINING_MMAP_THRESHOLD_BYTES = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_fixed_threshold: int | None = None  # what this process last fixed (glibc has no getter)


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def return_large_blocks_on_free(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold (once, at start); False (and nothing done) without glibc."""
    global _fixed_threshold
    libc = _libc()
    fixed = (
        libc is not None
        and hasattr(libc, "mallopt")
        and bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes))
    )
    if fixed:
        _fixed_threshold = threshold_bytes
    return fixed


@contextmanager
def training_heap() -> Iterator[None]:
    """Blocks of TRAINING_MMAP_THRESHOLD_BYTES and more mmapped inside (a lower threshold already fixed,
    as the memory benchmark's, stays); afterwards the threshold fixed before, MMAP_THRESHOLD_BYTES if none."""
    before = _fixed_threshold
    if before is None or before > TRAINING_MMAP_THRESHOLD_BYTES:
        return_large_blocks_on_free(TRAINING_MMAP_THRESHOLD_BYTES)
    try:
        yield
    finally:
        return_large_blocks_on_free(before if before is not None else MMAP_THRESHOLD_BYTES)


def return_freed_heap() -> None:
    """glibc ``malloc_trim(0)``: every free page of every heap goes back; a no-op without glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
