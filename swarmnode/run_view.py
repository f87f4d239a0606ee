"""What a run folder says about its node, read within fixed bounds: the one reader behind ``swarmnode
status``, the status page a node serves on its metrics port, and ``swarmnode status --html``.

A node appends to ``metrics.jsonl`` and ``peer_groups.jsonl`` every round and rewrites ``status.json``;
a run of months makes the logs large, and the page is asked for by whoever reaches the metrics port, as
often as they like. So a look reads at most ``MAX_TAIL_BYTES`` from the end of each log (the last
``MAX_ROUNDS`` rounds; who helped over the rounds that tail covers, and from which round when it does not
reach the start) and ``status.json`` only up to ``MAX_STATUS_BYTES``; ``RunFolderReader`` reads again only
when a file's size or modification time changed, so between rounds a request costs three ``stat`` calls.

Peers choose some of these strings (ids, model names, tokenizers, ban reasons; status.json holds them as
received): every string of status.json and peer_groups.jsonl goes through ``swarm.wire.printable``
here, so neither a terminal nor a page gets one raw or longer than ``MAX_PRINTED_CHARS``; a number that is
not finite becomes None (a page's JSON has no NaN).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from swarmnode.errors import StatusError
from swarmnode.runlog import METRICS_FILE
from swarmnode.swarm.exchange.records import PEER_GROUPS_FILE
from swarmnode.swarm.exchange.status import STATUS_FILE
from swarmnode.swarm.wire.printable import printable

MAX_ROUNDS = 200  # rounds a look keeps (the curves' x range)
MAX_TAIL_BYTES = 1 << 20  # read from the end of metrics.jsonl and of peer_groups.jsonl, each
MAX_STATUS_BYTES = 4 << 20  # status.json larger than this is not read (a roster's worth is ~0.3 MiB)
# the keys of a round record a look keeps: what the curves and the round line show
ROUND_KEYS = (
    "round", "policy_version", "reward_mean", "reward_peer_mean", "format_rate", "groups_local",
    "groups_peer", "groups_kept", "seconds_sample", "seconds_score", "seconds_share", "seconds_train",
    "seconds_sync", "seconds_total",
)  # fmt: skip


@dataclass(frozen=True)
class PeerRow:
    """One peer: as status.json lists it (a roster peer) and what this node trained from it (from
    peer_groups.jsonl). A peer that helped but is no longer in the roster has ``in_roster`` False and no
    round; ``standing`` is None when status.json predates it."""

    peer: str
    in_roster: bool
    model: str = ""
    tokenizer: str = ""
    round: int | None = None  # from its newest signed message (card or batch announcement) ...
    policy_version: int | None = None
    signed_at: float | None = None  # ... signed then (status.json's ``updated`` - the message's age)
    standing: bool | None = None
    banned: bool = False
    groups_trained: int = 0  # its groups this node trained on (over ``RunView.helpers_from_round`` on)
    last_trained_round: int | None = None


@dataclass(frozen=True)
class RunView:
    """A run folder at one look: the last rounds (dicts of ``ROUND_KEYS``, oldest first; ``rounds_cut``:
    older ones exist), ``status.json`` (strings made printable; None on a solo node), one row per peer
    (roster peers first, then those that helped most), and ``helpers_from_round``: the first round the
    trained-groups counts cover (None: the whole run)."""

    rounds: tuple[dict[str, Any], ...]
    rounds_cut: bool
    swarm: dict[str, Any] | None
    peers: tuple[PeerRow, ...]
    helpers_from_round: int | None
    data_time: float  # newest of status.json's ``updated`` and metrics.jsonl's modification time

    def as_dict(self) -> dict[str, Any]:
        """For the page's JSON (status.json's peers are in ``peers`` already, not twice)."""
        out = asdict(self)
        if self.swarm is not None:
            out["swarm"] = {key: value for key, value in out["swarm"].items() if key != "peers"}
        return out


def read_run(run_dir: Path) -> RunView:
    """The run folder's view (module docstring); StatusError when it holds neither log nor status."""
    lines, rounds_cut = _tail(run_dir / METRICS_FILE)
    records = [_clean({k: r[k] for k in ROUND_KEYS if k in r}) for r in _last_records(lines, MAX_ROUNDS)]
    swarm = _read_status(run_dir / STATUS_FILE)
    if not records and swarm is None:
        raise StatusError(
            f"{run_dir}: no metrics.jsonl or status.json yet (is a node running with --run-dir {run_dir}?)"
        )
    helped, first_round = _helped(_tail(run_dir / PEER_GROUPS_FILE))
    times = [swarm["updated"]] if swarm and isinstance(swarm.get("updated"), int | float) else []
    if records:
        times.append((run_dir / METRICS_FILE).stat().st_mtime)
    return RunView(
        rounds=tuple(records),
        rounds_cut=rounds_cut or sum(1 for line in lines if line.strip()) > MAX_ROUNDS,
        swarm=swarm,
        peers=_peer_rows(swarm, helped),
        helpers_from_round=first_round,
        data_time=max(times, default=time.time()),
    )


class RunFolderReader:
    """``read_run`` for a server: the last view is kept and read again only when metrics.jsonl,
    status.json or peer_groups.jsonl changed (size or modification time). Thread-safe."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._view: RunView | None = None
        self.reads = 0  # looks that read the files (the rest were answered from the last one)

    def read(self) -> RunView:
        with self._lock:
            key = tuple(_stat(self.run_dir / name) for name in (METRICS_FILE, STATUS_FILE, PEER_GROUPS_FILE))
            if key != self._key or self._view is None:
                self._view, self._key = read_run(self.run_dir), key
                self.reads += 1
            return self._view


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def _tail(path: Path) -> tuple[list[bytes], bool]:
    """The lines in the last MAX_TAIL_BYTES of ``path`` (the first one dropped when the window cuts it),
    and whether the window left earlier lines out."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(size - MAX_TAIL_BYTES, 0)
            f.seek(start)
            lines = f.read(MAX_TAIL_BYTES).split(b"\n")
    except FileNotFoundError:
        return [], False
    return (lines[1:] if start > 0 else lines), start > 0


def _records(lines: list[bytes]) -> Iterator[dict]:
    """The JSON objects among ``lines``; a torn or empty line is skipped."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def _last_records(lines: list[bytes], n: int) -> list[dict]:
    """The last ``n`` JSON objects among ``lines``, oldest first (only those are parsed)."""
    found = list(islice(_records(reversed(lines)), n))
    return found[::-1]


@dataclass
class _Helped:
    groups: int = 0
    last_round: Any = None
    model: str = ""


def _helped(tail: tuple[list[bytes], bool]) -> tuple[dict[str, _Helped], int | None]:
    """Peer groups trained on, per producer, from peer_groups.jsonl's tail; and the first round the tail
    covers when it is not the whole file (else None). Each line is parsed and dropped."""
    lines, cut = tail
    helped: dict[str, _Helped] = {}
    names: dict[Any, str] = {}  # raw string -> printable (a producer is on many lines)
    first_round = None
    for group in _records(lines):
        producer = str(group.get("producer"))
        producer = names.get(producer) or names.setdefault(producer, printable(producer))
        entry = helped.setdefault(producer, _Helped())
        entry.groups += 1
        entry.last_round = _clean(group.get("round"))
        entry.model = printable(str(group.get("model", "")))
        first_round = entry.last_round if first_round is None else first_round
    return helped, first_round if cut else None


def _read_status(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_STATUS_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_STATUS_BYTES:
        raise StatusError(f"{path} is over {MAX_STATUS_BYTES >> 20} MiB: not read (is it a node's?)")
    try:
        status = json.loads(data)
    except ValueError as exc:
        raise StatusError(f"{path} is not valid JSON ({exc}); a node rewrites it every round") from None
    return _clean(status) if isinstance(status, dict) else None


def _clean(value: Any) -> Any:
    """``value`` with every string in it (dict keys too) passed through ``printable`` and every number
    that is not finite (``NaN`` in a JSON file) made None, which JSON has."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {printable(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _peer_rows(swarm: dict | None, helped: dict[str, _Helped]) -> tuple[PeerRow, ...]:
    """Roster peers (status.json order), then peers this node trained from that are not in the roster,
    most groups first."""
    roster = swarm.get("peers", {}) if swarm else {}
    updated = swarm.get("updated") if swarm else None
    rows = [_roster_row(peer, info, helped.get(peer, _Helped()), updated) for peer, info in roster.items()]
    away = sorted((peer for peer in helped if peer not in roster), key=lambda peer: -helped[peer].groups)
    rows += [
        PeerRow(peer, False, helped[peer].model, groups_trained=helped[peer].groups,
                last_trained_round=helped[peer].last_round)
        for peer in away
    ]  # fmt: skip
    return tuple(rows)


def _roster_row(peer: str, info: Any, helped: _Helped, updated: Any) -> PeerRow:
    """A roster peer's row: its message's age in status.json counts from when status.json was written
    (once a round, which may be minutes ago), so the row keeps when the message was signed instead."""
    info = info if isinstance(info, dict) else {}
    age = info.get("seen_s_ago")
    numbers = isinstance(age, int | float) and isinstance(updated, int | float)
    return PeerRow(
        peer, True, model=info.get("model", ""), tokenizer=info.get("tokenizer", ""), round=info.get("round"),
        policy_version=info.get("policy_version"), signed_at=updated - age if numbers else None,
        standing=info.get("standing"), banned=bool(info.get("banned")), groups_trained=helped.groups,
        last_trained_round=helped.last_round,
    )  # fmt: skip
