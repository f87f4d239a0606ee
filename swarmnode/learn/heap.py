"""glibc's heap per phase of a round: what a phase freed goes back, and each phase gets its own threshold.

glibc keeps freed memory mapped in its heaps, so after sampling (a KV cache grown step by step) or the
backward passes of a step (activations, temporaries) the resident set stays near that phase's peak,
and the next phase's allocations land on top of what the allocator cannot reuse. The round calls
``return_freed_heap`` after sampling and after the step, the trainer before the optimizer step.

Which blocks are mmapped (glibc's mmap threshold) is a trade between memory and time, made per phase:
``MMAP_THRESHOLD_BYTES`` from start (model load, checkpoints), ``training_heap`` inside a CPU training
step (1 MiB: its activations' holes would stay resident) and ``sampling_heap`` while sampling and syncing
the sampler's weights (32 MiB: a decode step allocates and frees the same logits and activation blocks
every step; mmapped, each costs page faults every step, 0.80x vLLM's and 0.62x ``generate``'s tokens/s at
4 MiB). Figures: docs/performance.md, "Memory and time of a Quick-start round" and "Sampling speed".
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

# Blocks at least this large are mmapped, so freeing one gives its pages back at once. glibc otherwise
# raises its threshold (up to 32 MiB) each time such a block is freed, and later tensors of that size
# land in heaps that fragment between phases.
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
# While sampling: glibc's own ceiling for its dynamic threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit),
# where a process that never fixed one ends up. Blocks below it are reused from the heap step after step.
SAMPLING_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# ... and the heap's top is kept up to twice that, as glibc's dynamic mode does. A fixed mmap threshold
# leaves the trim threshold at glibc's 128 KiB: every free at the top of the heap gave pages back and the
# next decode step faulted them in again (``generate`` 54 tok/s; with this, 67, as with glibc's defaults).
SAMPLING_TRIM_THRESHOLD_BYTES = 2 * SAMPLING_MMAP_THRESHOLD_BYTES
DEFAULT_TRIM_THRESHOLD_BYTES = 128 * 1024  # glibc's, where every other phase leaves it
# During a CPU training step: a checkpointed backward pass allocates row blocks of 1-4 MiB (SmolLM2: a
# [tokens, 576] activation is 3.2 MiB at 1400 tokens) among blocks that outlive them; in the heap their
# holes stay resident, 0.5 GB of SmolLM2's worst-case step. Mmapped, each costs page faults instead
# (12% of that step's time, docs/performance.md).
TRAINING_MMAP_THRESHOLD_BYTES = 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_fixed_threshold: int | None = None  # what this process last fixed (glibc has no getter)


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _mallopt(param: int, value: int) -> bool:
    libc = _libc()
    return libc is not None and hasattr(libc, "mallopt") and bool(libc.mallopt(param, value))


def return_large_blocks_on_free(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold (once, at start); False (and nothing done) without glibc."""
    global _fixed_threshold
    fixed = _mallopt(_M_MMAP_THRESHOLD, threshold_bytes)
    if fixed:
        _fixed_threshold = threshold_bytes
    return fixed


@contextlib.contextmanager
def _heap_phase(threshold_bytes: int, *, keep_lower: bool, trim_bytes: int | None = None) -> Iterator[None]:
    """``threshold_bytes`` fixed inside (with ``keep_lower``, a lower one already fixed stays, as the memory
    benchmark's), and the trim threshold at ``trim_bytes`` if given; afterwards the threshold fixed
    before (MMAP_THRESHOLD_BYTES if none) and glibc's trim threshold."""
    before = _fixed_threshold
    if not (keep_lower and before is not None and before <= threshold_bytes):
        return_large_blocks_on_free(threshold_bytes)
    if trim_bytes is not None:
        _mallopt(_M_TRIM_THRESHOLD, trim_bytes)
    try:
        yield
    finally:
        return_large_blocks_on_free(before if before is not None else MMAP_THRESHOLD_BYTES)
        if trim_bytes is not None:
            _mallopt(_M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD_BYTES)


def training_heap() -> contextlib.AbstractContextManager[None]:
    """A CPU training step: blocks of TRAINING_MMAP_THRESHOLD_BYTES and more mmapped inside."""
    return _heap_phase(TRAINING_MMAP_THRESHOLD_BYTES, keep_lower=True)


def sampling_heap() -> contextlib.AbstractContextManager[None]:
    """Sampling and weight sync: blocks under SAMPLING_MMAP_THRESHOLD_BYTES reused from the heap, whose
    top is kept up to SAMPLING_TRIM_THRESHOLD_BYTES (the round trims it after the phase)."""
    return _heap_phase(
        SAMPLING_MMAP_THRESHOLD_BYTES, keep_lower=False, trim_bytes=SAMPLING_TRIM_THRESHOLD_BYTES
    )


def return_freed_heap() -> None:
    """glibc ``malloc_trim(0)``: every free page of every heap goes back; a no-op without glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
