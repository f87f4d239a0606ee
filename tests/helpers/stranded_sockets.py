"""Remove the socket files a test run strands in /tmp when its crash tests kill processes.

hivemind names its unix sockets ``/tmp/hivemind-p2pd-*.sock`` and ``/tmp/hivemind-p2pclient-*.sock``, and
multiprocessing puts a listener's socket in a ``/tmp/pymp-*`` folder; both are removed only on an orderly
exit. The chaos and crash tests end processes with SIGKILL (and a DHT process whose node was killed
leaves by ``os._exit``) on purpose, so a full run used to leave ~40 sockets and a few folders behind. A
socket is removed only if it appeared after ``since`` and no live process is bound to it
(``/proc/net/unix``), and a folder only if it holds nothing but such sockets: whatever else runs on the
machine, an experiment beside the suite included, keeps its files.
"""

from __future__ import annotations

import glob
import os
import stat
from pathlib import Path

HIVEMIND_SOCKETS = "hivemind-*.sock"
MULTIPROCESSING_FOLDERS = "pymp-*"
BOUND_SOCKETS = Path("/proc/net/unix")


def bound_socket_paths() -> set[str] | None:
    """The filesystem paths live unix sockets are bound to; None where /proc/net/unix does not exist."""
    try:
        lines = BOUND_SOCKETS.read_text().splitlines()[1:]
    except OSError:
        return None
    # columns: Num RefCount Protocol Flags Type St Inode [Path]
    return {fields[7] for fields in (line.split() for line in lines) if len(fields) > 7}


def remove_stranded_sockets(since: float, folder: str = "/tmp") -> list[str]:
    """Unlink hivemind's sockets and multiprocessing's socket folders in ``folder`` that were made after
    ``since`` (epoch s) and that no live process is bound to; returns what it removed."""
    bound = bound_socket_paths()
    if bound is None:  # not Linux: no way to tell a live socket from a stranded one, so keep them all
        return []

    def stranded(path: str) -> bool:
        made = os.lstat(path)
        return stat.S_ISSOCK(made.st_mode) and made.st_mtime >= since and path not in bound

    removed = []
    for path in glob.glob(os.path.join(folder, HIVEMIND_SOCKETS)):
        try:
            if stranded(path):
                os.unlink(path)
                removed.append(path)
        except OSError:  # gone already, or not ours to remove
            continue
    for path in glob.glob(os.path.join(folder, MULTIPROCESSING_FOLDERS)):
        try:
            inside = [os.path.join(path, name) for name in os.listdir(path)]
            made_since = os.lstat(path).st_mtime >= since
            if inside and made_since and all(stranded(p) for p in inside):
                for p in inside:
                    os.unlink(p)
                os.rmdir(path)
                removed.append(path)
        except OSError:
            continue
    return removed
