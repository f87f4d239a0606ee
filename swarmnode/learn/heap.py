"""Giving the heap a phase freed back to the system, so the next phase's peak stands on live memory.

glibc keeps freed memory mapped in its heaps, so after sampling (a KV cache grown step by step) or the
backward passes of a step (activations, temporaries) the resident set stays near that phase's peak,
and the next phase's allocations land on top of what the allocator cannot reuse. The round calls
``return_freed_heap`` after sampling and after the step, the trainer before the optimizer step
(docs/performance.md, "Memory and time of a Quick-start round").
"""

from __future__ import annotations

import ctypes

# Blocks at least this large are mmapped, so freeing one gives its pages back at once. glibc otherwise
# raises its threshold (up to 32 MiB) each time such a block is freed, and later tensors of that size
# land in heaps that fragment between phases.
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def return_large_blocks_on_free(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold (once, at start); False (and nothing done) without glibc."""
    libc = _libc()
    return (
        libc is not None
        and hasattr(libc, "mallopt")
        and bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes))
    )


def return_freed_heap() -> None:
    """glibc ``malloc_trim(0)``: every free page of every heap goes back; a no-op without glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
