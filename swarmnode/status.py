"""``swarmnode status``: a node's view of itself and its swarm, read from its run folder.

A running node rewrites ``status.json`` every round and appends to ``metrics.jsonl``; reading files
keeps ``status`` independent of the node's process (it works after a crash too). Whether a node is running
is read from the run folder's lock (``LOCK_FILE``), an flock a node holds for the life of its process: a
stopped or crashed node holds none, and ``status`` then says so and how old its data is.

Peers choose some of what it prints (ids, model names, ban reasons): each such string, and then every
line, goes through ``swarm.wire.printable`` (control, bidi and format characters escaped; a peer's string
cut to ``MAX_PRINTED_CHARS``), so nothing a peer sends reaches the terminal raw.
"""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path

from swarmnode.errors import StatusError
from swarmnode.runlog import RunLog
from swarmnode.swarm.wire.printable import printable

LOCK_FILE = ".lock"  # in the run folder; node.py holds an flock on it and writes "pid N" into it


def lock_holder(run_dir: Path) -> str | None:
    """What the lock file says ("pid N") while a node holds its flock, else None (no node running).

    The check takes the lock for an instant: a node starting in that instant is refused as if another ran.
    """
    try:
        handle = (run_dir / LOCK_FILE).open()
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "a running process"
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def read_status(run_dir: Path) -> dict:
    log = RunLog(run_dir)
    records = log.records()
    swarm = None
    path = run_dir / "status.json"
    if path.exists():
        swarm = json.loads(path.read_text())
    if not records and swarm is None:
        raise StatusError(
            f"{run_dir}: no metrics.jsonl or status.json yet (is a node running with --run-dir {run_dir}?)"
        )
    times = [swarm["updated"]] if swarm else []
    if records:
        times.append(log.path.stat().st_mtime)
    return {
        "last_round": records[-1] if records else None,
        "swarm": swarm,
        "running": lock_holder(run_dir),
        "data_time": max(times),
    }


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def format_status(status: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["data_time"]))
    age = _ago(time.time() - status["data_time"])
    if status["running"] is None:
        lines = [f"node not running: its last data below dates from {when} ({age})"]
    else:
        lines = [f"node running ({status['running']}), data from {when} ({age})"]
    last = status["last_round"]
    if last is not None:
        lines.append(
            f"round {last['round']}  policy v{last['policy_version']}  reward {last['reward_mean']:.3f}  "
            f"format {last['format_rate']:.0%}  groups local {last['groups_local']} / peer "
            f"{last['groups_peer']} (kept {last['groups_kept']})"
        )
    swarm = status["swarm"]
    if swarm is None:
        lines.append("solo node (no swarm status)")
        return "\n".join(printable(line, max_chars=None) for line in lines)
    age = time.time() - swarm["updated"]
    lines.append(f"peer id {swarm['peer_id']}  swarm {swarm['swarm_id']}  (updated {age:.0f}s ago)")
    lines.extend(f"  listening on {addr}" for addr in swarm["addrs"])
    lines.append(f"peers in the roster: {len(swarm['peers'])}, libp2p connections: {swarm['connected']}")
    for peer, info in swarm["peers"].items():
        flag = "  BANNED" if info["banned"] else ""
        lines.append(
            f"  {printable(peer)}  {printable(info['model'])}  policy v{info['policy_version']}  "
            f"round {info['round']}  seen {info['seen_s_ago']:.0f}s ago{flag}"
        )
    r = swarm["rollouts"]
    lines.append(
        f"rollouts: published {r['groups_published']} groups in {r['batches_published']} batches; "
        f"received {r['batches_received']} batches, accepted {r['groups_accepted']} groups, "
        f"trained on {r['groups_trained']}"
    )
    arrival = swarm["arrival_s"]
    if arrival["count"]:
        lines.append(
            f"peer batches arrive {arrival['sum'] / arrival['count']:.2f}s after announcement (mean)"
        )
    rejected = swarm["rejected"]
    lines.append("rejected: " + (", ".join(f"{k} {v}" for k, v in rejected.items()) if rejected else "none"))
    for ban in swarm["bans"]:
        lines.append(
            f"banned: {printable(ban['peer'])} for {ban['remaining_s']:.0f}s more "
            f"({printable(ban['reason'])}, #{ban['count']})"
        )
    return "\n".join(printable(line, max_chars=None) for line in lines)
