"""Every DHT call the node makes, and the only module outside ``wire.dht_rules`` that names DHT keys.

``DHTRecords`` (a transport's ``records``) puts and gets small values (at most ``MAX_RECORD_BYTES``) under
a key, one subkey per peer, each call within a deadline, and keeps the health stamps ``/health`` reads.
hivemind's DHT worker crashes on values over ~64 KiB stored from this process, so oversize values never
reach it. The free functions below are the swarm's records by name (petals' ``utils/dht.py`` shape): this
node's roster card and announcement, the roster and the peers' announcements; their keys and the rules a
stored record meets are ``wire.dht_rules`` (PROTOCOL.md section 8).

Record trouble is a logged miss, never an exception: a put returns False and a get returns what it
found (nothing, on any network trouble); what comes back is untrusted (``daemon.get_many`` drops entries
whose subkey is not a str or whose value is not bytes of at most MAX_RECORD_BYTES).

Every call is one request over the pipe to hivemind's DHT process (``daemon`` makes that pipe safe for
requests of any size from several threads). A get of many keys is still sent as pages of at most
``KEYS_PER_REQUEST`` keys: each request then stays under ~8 KiB (one write on the pipe) and each answer
under ``KEYS_PER_REQUEST`` keys' records, however large the roster.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from swarmnode.errors import TransportError
from swarmnode.swarm.net import daemon
from swarmnode.swarm.net.counts import DHTCounts, Tally
from swarmnode.swarm.wire.codec import decode_message
from swarmnode.swarm.wire.dht_rules import (
    ANNOUNCE_RECORD_TTL_S,
    announce_key,
    record_expiration,
    roster_key,
    roster_keys,
)
from swarmnode.swarm.wire.limits import BATCH_ANNOUNCEMENT, MAX_RECORD_BYTES

if TYPE_CHECKING:  # hivemind (and torch behind it) is imported when a transport starts, not on import
    import hivemind

logger = logging.getLogger(__name__)

RECORD_GET_TIMEOUT_S = 5.0
# keys in one request to the DHT process: 32 keys of at most ~220 bytes (a 64-byte swarm id, a 128-byte
# peer id) pickle to under 8 KiB, below the 16 KiB past which a request is two writes on the pipe
KEYS_PER_REQUEST = 32


class DHTRecords:
    """Puts and gets on the DHT that ``dht()`` returns (None while the transport is not running).

    ``counts()``: the gets and stores that failed (``DHTCounts``, counted here alone); ``last_read_ok`` /
    ``last_write_ok`` are the time.time() of the last get / store that succeeded (0: never)."""

    def __init__(self, dht: Callable[[], hivemind.DHT | None], record_timeout_s: float):
        self._dht = dht
        self._counts = Tally(DHTCounts())
        self.record_timeout_s = record_timeout_s
        self.last_read_ok = 0.0
        self.last_write_ok = 0.0
        self._trouble_logged = False

    def counts(self) -> DHTCounts:
        return self._counts.read()

    def put(
        self,
        key: str,
        subkey: str,
        value: bytes,
        ttl_s: float,
        timeout_s: float | None = None,
        *,
        expires_at: float | None = None,
    ) -> bool:
        """Store ``value`` under (key, subkey) for ``ttl_s`` seconds (until DHT time ``expires_at`` when
        given). False if the DHT did not take it within ``timeout_s`` (at most ``record_timeout_s``, the
        default).

        Raises TransportError("oversize") for a value over MAX_RECORD_BYTES: hivemind's DHT worker
        process dies on large values, so they are refused here, before they reach it.
        """
        if not isinstance(value, bytes | bytearray):
            raise TypeError("a record value is bytes")
        if len(value) > MAX_RECORD_BYTES:
            raise TransportError("oversize", f"record of {len(value)} bytes; the limit is {MAX_RECORD_BYTES}")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        dht = self._dht()
        if dht is None:
            logger.warning("a DHT put of %r on a transport that is not running", key)
            return False
        from hivemind.utils import get_dht_time

        timeout = self.record_timeout_s if timeout_s is None else min(timeout_s, self.record_timeout_s)
        expiration = get_dht_time() + ttl_s if expires_at is None else expires_at
        try:
            future = dht.store(
                key, bytes(value), expiration_time=expiration, subkey=subkey, return_future=True
            )
            ok = bool(_result(future, timeout))
        except Exception as exc:
            self._trouble(f"DHT store of {key!r} failed: {exc!r}")
            self._counts.add("store_failed")
            return False
        self._trouble_logged = False
        if ok:
            self.last_write_ok = time.time()
        else:  # no node took it: the DHT's validators refused it, or every storing node is full
            self._counts.add("store_failed")
        return ok

    def get(self, key: str, timeout_s: float | None = None) -> dict[str, bytes]:
        """All live (subkey -> value) pairs under ``key`` (``get_many`` of one key)."""
        return self.get_many([key], timeout_s).get(key, {})

    def get_many(self, keys: list[str], timeout_s: float | None = None) -> dict[str, dict[str, bytes]]:
        """Live (subkey -> value) pairs under each of ``keys``, looked up together (pages of
        ``KEYS_PER_REQUEST`` keys, sent at once); a key is missing on a miss, and all are on any network
        trouble or no answer within ``timeout_s`` (default ``RECORD_GET_TIMEOUT_S``) for every page."""
        dht = self._dht()
        if dht is None or not keys:
            return {}
        keys = list(keys)
        deadline = time.monotonic() + (RECORD_GET_TIMEOUT_S if timeout_s is None else timeout_s)
        futures: list[concurrent.futures.Future] = []
        found: dict[str, dict[str, bytes]] = {}
        try:
            for first in range(0, len(keys), KEYS_PER_REQUEST):
                page = keys[first : first + KEYS_PER_REQUEST]
                futures.append(
                    dht.run_coroutine(functools.partial(daemon.get_many, keys=page), return_future=True)
                )
            for future in futures:
                found.update(_result(future, max(deadline - time.monotonic(), 0.0)))
        except Exception as exc:
            for future in futures:
                future.cancel()
            self._trouble(f"DHT get of {keys[0]!r} and {len(keys) - 1} more failed: {exc!r}")
            self._counts.add("read_failed")
            return {}
        self._trouble_logged = False
        self.last_read_ok = time.time()
        return found

    def _trouble(self, message: str) -> None:
        """Warn once per outage; repeats go to debug so a flaky network does not flood the log."""
        if self._trouble_logged:
            logger.debug(message)
        else:
            logger.warning("%s (further DHT errors are logged at debug level until one succeeds)", message)
            self._trouble_logged = True


def _result(future: concurrent.futures.Future, timeout_s: float):
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise


def put_card(
    records: DHTRecords,
    swarm_id: str,
    peer_id: str,
    card: bytes,
    ttl_s: float,
    timeout_s: float | None = None,
) -> bool:
    """This node's signed roster card, under its roster shard."""
    return records.put(roster_key(swarm_id, peer_id), peer_id, card, ttl_s, timeout_s=timeout_s)


def put_announcement(
    records: DHTRecords,
    swarm_id: str,
    peer_id: str,
    announcement: bytes,
    timeout_s: float | None,
) -> bool:
    """This node's signed batch announcement, under its own announcement key, stored until exactly its
    signed timestamp + ``ANNOUNCE_RECORD_TTL_S``, the latest expiration storing nodes accept: no older
    announcement, replayed, can then outlive it (PROTOCOL.md section 8). Readers judge freshness by the
    timestamp, not by the expiration."""
    msg, _ = decode_message(
        announcement, swarm_id=swarm_id, expected_type=BATCH_ANNOUNCEMENT, expected_peer_id=peer_id
    )
    key = announce_key(swarm_id, peer_id)
    expires_at = record_expiration(msg)
    return records.put(key, peer_id, announcement, ANNOUNCE_RECORD_TTL_S, timeout_s, expires_at=expires_at)


def read_roster(
    records: DHTRecords, swarm_id: str, timeout_s: float | None, shards: Iterable[int] | None = None
) -> list[tuple[str, bytes]]:
    """Every (peer id, card record) in the swarm's roster ``shards`` (None: all of them), unchecked."""
    keys = roster_keys(swarm_id)
    found = records.get_many(keys if shards is None else [keys[shard] for shard in shards], timeout_s)
    return [item for shard in found.values() for item in shard.items()]


def read_announcements(
    records: DHTRecords, swarm_id: str, peers: Iterable[str], timeout_s: float
) -> list[tuple[bytes, str]]:
    """(announcement record, author) of each of ``peers`` that has one, unchecked; only the author's own
    subkey counts."""
    keys = {announce_key(swarm_id, peer): peer for peer in peers}
    found = records.get_many(list(keys), timeout_s)
    return [(found[key][peer], peer) for key, peer in keys.items() if peer in found.get(key, {})]
