"""Giving the heap a phase freed back to the system, so the next phase's peak stands on live memory.

glibc keeps freed memory mapped in its heaps, so after sampling (a KV cache grown step by step) or the
backward passes of a step (activations, temporaries) the resident set stays near that phase's peak,
and the next phase's allocations land on top of what the allocator cannot reuse. The round calls
``return_freed_heap`` after sampling and after the step, the trainer before the optimizer step
(docs/performance.md, "Memory and time of a Quick-start round").
"""

from __future__ import annotations

import ctypes


def return_freed_heap() -> None:
    """glibc ``malloc_trim(0)``: every free page of every heap goes back; a no-op without glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
