"""Remove the socket files hivemind leaves in /tmp when a test kills a node, its DHT process or p2pd.

hivemind names its unix sockets ``/tmp/hivemind-p2pd-*.sock`` and ``/tmp/hivemind-p2pclient-*.sock``
and unlinks them only on an orderly shutdown; the chaos and crash tests end processes with SIGKILL on
purpose, so a full run used to leave ~45 such files behind. A file is removed only if it appeared
after ``since`` and no live process is bound to it (``/proc/net/unix``), so the sockets of anything
else running on the machine, an experiment beside the suite included, stay untouched.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

HIVEMIND_SOCKETS = "/tmp/hivemind-*.sock"
BOUND_SOCKETS = Path("/proc/net/unix")


def bound_socket_paths() -> set[str] | None:
    """The filesystem paths live unix sockets are bound to; None where /proc/net/unix does not exist."""
    try:
        lines = BOUND_SOCKETS.read_text().splitlines()[1:]
    except OSError:
        return None
    # columns: Num RefCount Protocol Flags Type St Inode [Path]
    return {fields[7] for fields in (line.split() for line in lines) if len(fields) > 7}


def remove_stale_hivemind_sockets(since: float, pattern: str = HIVEMIND_SOCKETS) -> list[str]:
    """Unlink the files matching ``pattern`` made after ``since`` (epoch s) that nothing is bound to."""
    bound = bound_socket_paths()
    if bound is None:  # not Linux: no way to tell a live socket from a stale one, so keep them all
        return []
    removed = []
    for path in glob.glob(pattern):
        try:
            if os.lstat(path).st_mtime < since or path in bound:
                continue
            os.unlink(path)
        except OSError:  # gone already, or not ours to remove
            continue
        removed.append(path)
    return removed
