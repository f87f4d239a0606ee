"""Which peers score as this node does: the task fingerprint a roster card carries.

A node pulls batches only from peers whose card carries its own ``TaskBank.fingerprint`` (task mix,
scorer revision, reasoning-gym version): any other peer may score differently, so its groups would look
like ``bad_task`` or ``reward_mismatch`` here and an honest peer would be banned. Peers with another
fingerprint are skipped (``incompatible``), never charged.
"""

from __future__ import annotations

import re

from swarmnode.swarm.wire.protocol import RosterCard

# a roster card field (v1: optional, carried like unknown fields)
TASK_FINGERPRINT_FIELD = "task_fingerprint"
_FINGERPRINT_RE = re.compile(r"[0-9a-f]{32}")


def roster_extra(fingerprint: str) -> dict[str, str]:
    """The extra fields of this node's roster card."""
    return {TASK_FINGERPRINT_FIELD: fingerprint}


def card_fingerprint(card: RosterCard) -> str | None:
    """The task fingerprint a roster card advertises, or None (none, or not one)."""
    value = card.extra.get(TASK_FINGERPRINT_FIELD)
    return value if isinstance(value, str) and _FINGERPRINT_RE.fullmatch(value) else None
