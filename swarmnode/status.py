"""``swarmnode status``: a node's view of itself and its swarm, read from its run folder.

A running node rewrites ``status.json`` every round and appends to ``metrics.jsonl`` and
``peer_groups.jsonl``; reading files keeps ``status`` independent of the node's process (it works after a
crash too). The files are read by ``run_view.read_run``, within its bounds, the same reader the status page
uses. Whether a node is running is read from the run folder's lock (``LOCK_FILE``), an flock a node holds
for the life of its process: a stopped or crashed node holds none, and ``status`` then says so and how old
its data is.

Besides the last round it shows how the node is connected (client mode or a full member), each roster
peer (model, tokenizer, round and policy version from its newest signed message with that message's age,
standing, groups trained from it), who helped (peers this node trained from, in the roster or not), where
peer batches were found (notice, poll, holder), rejections and bans.

Peers choose some of what it prints (ids, model names, ban reasons): ``read_run`` passes each such string
through ``swarm.wire.printable`` (control, bidi and format characters escaped, cut to
``MAX_PRINTED_CHARS``) and every line goes through it again, so nothing a peer sends reaches the terminal
raw.
"""

from __future__ import annotations

import fcntl
import time
from dataclasses import dataclass
from pathlib import Path

from swarmnode.run_view import PeerRow, RunView, read_run
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


@dataclass(frozen=True)
class NodeStatus:
    """A run folder's view and whether a node runs on it (the lock's "pid N", else None)."""

    view: RunView
    running: str | None


def read_status(run_dir: Path) -> NodeStatus:
    return NodeStatus(read_run(run_dir), lock_holder(run_dir))


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def format_status(status: NodeStatus) -> str:
    view = status.view
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(view.data_time))
    age = _ago(time.time() - view.data_time)
    if status.running is None:
        lines = [f"node not running: its last data below dates from {when} ({age})"]
    else:
        lines = [f"node running ({status.running}), data from {when} ({age})"]
    if view.rounds:
        last = view.rounds[-1]
        lines.append(
            f"round {last['round']}  policy v{last['policy_version']}  reward {last['reward_mean']:.3f}  "
            f"format {last['format_rate']:.0%}  groups local {last['groups_local']} / peer "
            f"{last['groups_peer']} (kept {last['groups_kept']})"
        )
    swarm = view.swarm
    if swarm is None:
        lines.append("solo node (no swarm status)")
    else:
        lines += _swarm_lines(swarm, view)
    return "\n".join(printable(line, max_chars=None) for line in lines)


def _swarm_lines(swarm: dict, view: RunView) -> list[str]:
    age = time.time() - swarm["updated"]
    lines = [f"peer id {swarm['peer_id']}  swarm {swarm['swarm_id']}  (updated {age:.0f}s ago)"]
    lines.extend(f"  listening on {addr}" for addr in swarm["addrs"])
    lines.append(_connection(swarm))
    lines.append(f"peers in the roster: {len(swarm['peers'])}, libp2p connections: {swarm['connected']}")
    ours = swarm.get("tokenizer")
    rows = [row for row in view.peers if row.in_roster]
    lines.extend("  " + _peer_line(row, ours) for row in rows)
    helpers = [row for row in view.peers if row.groups_trained]
    since = "" if view.helpers_from_round is None else f" since round {view.helpers_from_round}"
    lines.append(
        f"who helped{since}: {sum(row.groups_trained for row in helpers)} peer groups trained on, from "
        f"{len(helpers)} peer(s)"
    )
    lines.extend(
        f"  {row.peer}  {row.model}  (not in the roster now)  {_trained(row)}" for row in view.peers
        if not row.in_roster
    )  # fmt: skip
    r = swarm["rollouts"]
    lines.append(
        f"rollouts: published {r['groups_published']} groups in {r['batches_published']} batches; "
        f"received {r['batches_received']} batches, accepted {r['groups_accepted']} groups, "
        f"trained on {r['groups_trained']}"
    )
    pulls = swarm.get("pulls_by_source") or {}
    lines.append("peer batches found by: " + (_counts(pulls) if pulls else "none yet"))
    arrival = swarm["arrival_s"]
    if arrival["count"]:
        lines.append(
            f"peer batches arrive {arrival['sum'] / arrival['count']:.2f}s after announcement (mean)"
        )
    rejected = swarm["rejected"]
    lines.append("rejected: " + (_counts(rejected) if rejected else "none"))
    for ban in swarm["bans"]:
        lines.append(
            f"banned: {ban['peer']} for {ban['remaining_s']:.0f}s more ({ban['reason']}, #{ban['count']})"
        )
    return lines


def _connection(swarm: dict) -> str:
    """How the node is connected: client mode (behind NAT or a firewall) or a full member."""
    mode = swarm.get("client_mode")
    checked = f" (dial-back: {swarm['reachability']})" if swarm.get("reachability") else ""
    if mode is None:
        return "connection: not recorded (status.json from an older swarmnode)"
    if mode:
        return (
            f"connection: client mode{checked}: peers cannot connect to this node; it connects out and "
            "they pull its batches over those connections"
        )
    return f"connection: full member{checked}: peers connect to it"


def _peer_line(row: PeerRow, our_tokenizer: str | None) -> str:
    tokenizer = row.tokenizer[:12] + (" (ours)" if row.tokenizer == our_tokenizer else "")
    standing = "  standing" if row.standing is True else "  no standing yet" if row.standing is False else ""
    flag = "  BANNED" if row.banned else ""
    age = "" if row.signed_at is None else f" (announced {_ago(time.time() - row.signed_at)})"
    return (
        f"{row.peer}  {row.model}  tokenizer {tokenizer or '?'}  policy v{row.policy_version}  "
        f"round {row.round}{age}{standing}{flag}  {_trained(row)}"
    )


def _trained(row: PeerRow) -> str:
    if not row.groups_trained:
        return "trained on none of its groups"
    return f"trained on {row.groups_trained} of its groups (last in round {row.last_trained_round})"


def _counts(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())
