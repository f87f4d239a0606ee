"""Sybil attacks on the DHT with free identities (issue #26), each against real hivemind nodes on 127.0.0.1.

The attacker is a bare hivemind DHT started by the test (tests/helpers/dht_attacker.py coroutines run in
its process) and speaks hivemind's RPCs straight to the honest DHT servers, as an outsider can:

- a full roster (512 valid cards of ~8 KiB, 64 per shard) read with its announcement keys, as the exchange
  service reads it, while other threads store: the honest DHT process stays alive and keeps storing; and
  the cause itself: requests over the node<->DHT pipe's 64 KiB, from 8 threads at once, all answered;
- a Sybil card stored in the storing nodes' *cache*, dated 29 s ahead and expiring timestamp + 903 s, does
  not hide the honest cards of its roster shard from a fresh reader;
- 512 identities x 8 junk-swarm keys (4,096 records, a storing node's whole budget) do not make the nodes
  refuse their own swarm's records;
- msgpack bombs (1.9 MiB of empty maps) in an ``rpc_store`` and in a ``call_find`` answer cost the honest
  DHT process no more than DECODE_PEAK_BOUND_MIB of peak memory;
- an old announcement re-stored with expiry timestamp + 902 s (and with the longest expiry the storing rule
  allows) never wins over the author's newer one.
"""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import hivemind
import psutil

from benchmarks.harness.waiting import wait_until
from swarmnode.identity import Identity
from swarmnode.swarm.exchange.swarm import Swarm
from swarmnode.swarm.net import daemon, dht
from swarmnode.swarm.wire import codec, dht_rules
from swarmnode.swarm.wire.limits import MAX_SWARM_ID_BYTES
from tests.helpers import dht_attacker
from tests.helpers.inprocess_swarm import make_swarm
from tests.helpers.verify_world import Peer

MIB = 1024 * 1024
ROSTER_SYBILS_PER_SHARD = 64  # dht_rules.MAX_SUBKEYS_PER_KEY x ROSTER_SHARDS = 512 cards
CARD_PAD_CHARS = 7700  # a card of ~8,000 bytes: a full roster's answer is ~4 MiB
ROSTER_READS = 3
WRITER_THREADS = 4
FILL_IDENTITIES = 512
FILL_KEYS_PER_IDENTITY = 8  # 512 x 8 = 4,096 records: a storing node's whole budget before #26
BOMB_BYTES = 1_900_000  # what the outside attacker sent: +139 MiB RSS on hivemind's unbounded decoder
DECODE_PEAK_BOUND_MIB = 16
RECORD_WAIT_S = 20.0
# the swarms' identity_work_bits: storing nodes refuse their own swarm's cards without it, and rank other
# records by it (dht_guard), so the Sybils below mint it as a real attacker must (8 bits: instant)
WORK_BITS = 8


def _run(attacker: hivemind.DHT, coroutine, timeout_s: float = 120.0, **kwargs):
    return attacker.run_coroutine(functools.partial(coroutine, **kwargs), return_future=True).result(
        timeout_s
    )


def _own_card(identity: Identity, swarm_id: str) -> bytes:
    return dht_attacker.card(identity, swarm_id, time.time(), work_bits=WORK_BITS)


def test_a_full_roster_read_with_its_announcement_keys_leaves_the_dht_process_alive(dht_world):
    """Before #26 one read of ~510 announcement keys sent hivemind's DHT process a request over its command
    pipe that the process read from a non-blocking socket ([Errno 11], then EOFError): the process died."""
    swarm_id = "s" * MAX_SWARM_ID_BYTES  # an honest swarm may have the longest id: the longest keys
    a, _, addrs = dht_world.honest("a", swarm_id, [])
    reader, reader_id, _ = dht_world.honest("reader", swarm_id, addrs)
    attacker = dht_world.attacker(addrs)
    indices = dht_attacker.shard_filling(b"roster-fill", ROSTER_SYBILS_PER_SHARD)
    t = time.monotonic()
    stored = _run(
        attacker,
        dht_attacker.store_cards,
        swarm=swarm_id,
        tag=b"roster-fill",
        indices=indices,
        pad=CARD_PAD_CHARS,
        work_bits=WORK_BITS,
    )
    print(f"{len(indices)} Sybil cards: {stored} stores accepted in {time.monotonic() - t:.1f} s")
    assert stored >= len(indices)

    stop = threading.Event()
    puts: list[bool] = []
    other = "w" * MAX_SWARM_ID_BYTES  # the roster shards of swarm_id are full: the writers store elsewhere

    def keep_storing(writer: Identity) -> None:  # as the announcer and the announcement store do
        while not stop.is_set() and len(puts) < 200:  # each writer its own subkey: its puts never race
            puts.append(dht.put_card(reader.records, other, writer.peer_id, _own_card(writer, other), 60))

    writers = [
        threading.Thread(target=keep_storing, args=(dht_attacker.sybil(b"writer", i),), daemon=True)
        for i in range(WRITER_THREADS)
    ]
    for writer in writers:
        writer.start()
    try:
        for _ in range(ROSTER_READS):
            t = time.monotonic()
            roster = dht.read_roster(reader.records, swarm_id, RECORD_WAIT_S)
            members = [peer for peer, _ in roster]
            found = dht.read_announcements(reader.records, swarm_id, members, RECORD_WAIT_S)
            print(f"read {len(roster)} cards, {len(members)} announcement keys: {time.monotonic() - t:.1f} s")
            assert reader.dht_alive(), "the reader's DHT process died"
            assert reader.counts().dht.read_failed == 0, "a read failed: the DHT process stopped answering"
            assert len(roster) >= len(indices) and found == []
    finally:
        stop.set()
        for writer in writers:
            writer.join(30)
    assert reader.dht_alive() and a.dht_alive()
    print(f"{sum(puts)} of {len(puts)} stores from {WRITER_THREADS} threads beside the reads went through")
    assert puts and all(puts)
    assert dht.put_card(reader.records, other, reader_id.peer_id, _own_card(reader_id, other), 60)


def test_requests_of_any_size_from_many_threads_reach_the_dht_process_whole(dht_world):
    """The cause itself, without the pages ``DHTRecords`` sends: 8 threads each send one 600-key request
    (~80 KiB pickled, over the pipe's 64 KiB) to the DHT process at once, 3 times."""
    node, _, _ = dht_world.honest("node", "pipe", [])
    keys = [
        dht_rules.announce_key("p" * MAX_SWARM_ID_BYTES, dht_attacker.sybil(b"pipe", i).peer_id)
        for i in range(600)
    ]
    answers: list[object] = []

    def ask() -> None:
        for _ in range(3):
            request = functools.partial(daemon.get_many, keys=keys)
            answers.append(node._dht.run_coroutine(request, return_future=True).result(RECORD_WAIT_S))

    askers = [threading.Thread(target=ask, daemon=True) for _ in range(8)]
    for asker in askers:
        asker.start()
    deadline = time.monotonic() + 3 * RECORD_WAIT_S + 10  # one deadline for all: a dead process ends the test
    for asker in askers:
        asker.join(max(deadline - time.monotonic(), 0.0))
    assert node.dht_alive() and answers == [{}] * 24


def test_a_sybil_card_in_the_cache_does_not_hide_the_honest_cards_of_its_shard(dht_world):
    swarm_id = "shadow"
    a, _, addrs = dht_world.honest("a", swarm_id, [])
    b, _, _ = dht_world.honest("b", swarm_id, addrs)
    attacker = dht_world.attacker(addrs)
    in_shard_0 = (dht_attacker.sybil(b"honest", i) for i in range(1000))
    honest = [h for h in in_shard_0 if dht_rules.roster_shard(h.peer_id) == 0][:3]
    for identity in honest:  # stored the honest way: through a node, for the full record lifetime
        assert a.records.put(
            dht_rules.roster_key(swarm_id, identity.peer_id),
            identity.peer_id,
            _own_card(identity, swarm_id),
            900,
        )
    sybil = next(
        i for i in range(10_000) if dht_rules.roster_shard(dht_attacker.sybil(b"shadow", i).peer_id) == 0
    )
    cached = _run(
        attacker, dht_attacker.store_cards, swarm=swarm_id, tag=b"shadow", indices=[sybil], ahead_s=29.0,
        expiration_past_timestamp_s=903.0, in_cache=True, work_bits=WORK_BITS,
    )  # fmt: skip
    print(f"the Sybil card was taken into {cached} storing node(s)' cache")

    fresh, _, _ = dht_world.honest("fresh", swarm_id, addrs, mode="private")  # a client: it stores nothing
    seen = {peer for peer, _ in dht.read_roster(fresh.records, swarm_id, RECORD_WAIT_S)}
    assert {h.peer_id for h in honest} <= seen, (
        f"{len({h.peer_id for h in honest} & seen)} of 3 honest cards seen"
    )


def test_junk_swarms_filling_the_storage_budget_do_not_refuse_the_nodes_own_swarm(dht_world):
    swarm_id = "home"
    a, _, addrs = dht_world.honest("a", swarm_id, [])
    b, b_id, _ = dht_world.honest("b", swarm_id, addrs)
    attacker = dht_world.attacker(addrs)
    indices = dht_attacker.shard_filling(b"fill", FILL_IDENTITIES // dht_rules.ROSTER_SHARDS)  # 64 a shard
    t = time.monotonic()
    stored = 0
    for j in range(FILL_KEYS_PER_IDENTITY):
        stored += _run(
            attacker,
            dht_attacker.store_cards,
            swarm=f"junk-{j}",
            tag=b"fill",
            indices=indices,
            work_bits=WORK_BITS,
        )  # with work: junk without it fills only a quarter of the budget (test_dht_work)
    print(f"{FILL_IDENTITIES} identities x {FILL_KEYS_PER_IDENTITY} junk keys: {stored} stores accepted "
          f"at 2 nodes in {time.monotonic() - t:.1f} s; {a.dht_stats()}")  # fmt: skip
    assert stored >= FILL_IDENTITIES * FILL_KEYS_PER_IDENTITY  # the junk fills (at least) one node's budget

    assert dht.put_card(b.records, swarm_id, b_id.peer_id, _own_card(b_id, swarm_id), 60), "own swarm refused"
    assert b_id.peer_id in {peer for peer, _ in dht.read_roster(a.records, swarm_id, RECORD_WAIT_S)}


def _peak_rss(pid: int) -> int:
    """VmHWM of ``pid`` in bytes (its peak resident memory since the last ``_reset_peak``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _reset_peak(pid: int) -> int:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    return psutil.Process(pid).memory_info().rss


def test_msgpack_bombs_in_a_store_and_a_find_answer_cost_the_dht_process_little_memory(dht_world):
    swarm_id = "bombed"
    a, a_id, addrs = dht_world.honest("a", swarm_id, [])
    attacker = dht_world.attacker(addrs, client=False)  # a server: it answers a's finds
    pid = a._dht.pid

    before = _reset_peak(pid)
    assert _run(attacker, dht_attacker.store_bomb, nbytes=BOMB_BYTES) >= 1
    store_peak = (_peak_rss(pid) - before) / MIB

    before = _reset_peak(pid)
    _run(attacker, dht_attacker.serve_bomb, key="swarmnode/bombed/roster/0", nbytes=BOMB_BYTES)
    a.records.get("swarmnode/bombed/roster/0", RECORD_WAIT_S)
    find_peak = (_peak_rss(pid) - before) / MIB
    print(
        f"peak RSS of the DHT process: +{store_peak:.1f} MiB (store bomb), +{find_peak:.1f} MiB (find bomb)"
    )
    assert a.dht_alive()
    assert store_peak < DECODE_PEAK_BOUND_MIB and find_peak < DECODE_PEAK_BOUND_MIB
    assert dht.put_card(a.records, swarm_id, a_id.peer_id, _own_card(a_id, swarm_id), 60)


def _announcement(records, swarm_id: str, author: str) -> bytes | None:
    found = dht.read_announcements(records, swarm_id, [author], 5.0)
    return found[0][0] if found else None


def test_a_replayed_old_announcement_never_wins_over_the_newer_one(tmp_path):
    swarm_id = "replay"
    nodes: list[Swarm] = []
    attacker = None
    try:
        reader = make_swarm(tmp_path, "reader", [], swarm_id)
        nodes.append(reader)
        address = reader.start()[0]
        victim = make_swarm(tmp_path, "victim", [address], swarm_id)
        nodes.append(victim)
        victim.start()
        author, records = victim.identity.peer_id, reader.transport.records

        victim.publish(1, 0, Peer(victim.identity, victim.verifier.bank).groups(2))
        assert wait_until(lambda: _announcement(records, swarm_id, author) is not None, RECORD_WAIT_S, 0.3)
        old = _announcement(records, swarm_id, author)
        time.sleep(1.0)
        victim.publish(2, 0, Peer(victim.identity, victim.verifier.bank).groups(2))
        assert wait_until(
            lambda: _announcement(records, swarm_id, author) not in (None, old), RECORD_WAIT_S, 0.3
        )
        new = _announcement(records, swarm_id, author)

        signed_at = codec.decode_message(old, swarm_id=swarm_id, expected_peer_id=author)[0].timestamp
        key = dht_rules.announce_key(swarm_id, author)
        attacker = hivemind.DHT(initial_peers=[address], client_mode=True, start=True)
        replays = [  # the measured replay (timestamp + 902 s), and the longest expiry any storing rule allows
            (key, author, old, signed_at + dht_rules.MAX_RECORD_TTL_S + 2.0),
            (key, author, old, signed_at + dht_rules.MAX_RECORD_TTL_S + dht_rules.RECORD_CLOCK_TOLERANCE_S),
            (key, author, old, signed_at + getattr(dht_rules, "ANNOUNCE_RECORD_TTL_S", 0.0)),
        ]
        accepted = _run(attacker, dht_attacker.store_records, records=replays)
        print(f"replays of the old announcement accepted by {accepted} store(s)")
        for _ in range(5):
            assert _announcement(records, swarm_id, author) == new, "the replayed announcement won"
            time.sleep(0.5)
    finally:
        if attacker is not None:
            daemon.stop_dht_process(attacker)
        for node in reversed(nodes):
            node.shutdown()
