"""The hivemind side of ``swarm.wire.dht_rules``: the record validator and the bounded storage every node
installs.

Imported only where a DHT starts (``daemon.start_dht``) and inside the DHT process: it imports hivemind.

- ``SignedRecordValidator`` runs ``dht.check_record`` on every record this node is asked to store
  (``rpc_store``), stores itself, or gets back from a lookup.
- ``BoundedStorage`` replaces hivemind's ``DHTLocalStorage`` (which has no size limit) for both the
  storage and the cache of the DHT node: at most ``MAX_STORED_RECORDS`` (key, subkey) records in all,
  ``MAX_SUBKEYS_PER_KEY`` per key and ``MAX_KEYS_PER_PEER`` keys per subkey (= per signer, since the
  validator ties each subkey to its signer); a store past a bound is refused (returns False), updates
  of a record already held always go through. Memory for records is then bounded by about
  ``MAX_STORED_RECORDS`` x (``MAX_RECORD_BYTES`` + overhead) per storage, whatever peers send.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import Counter
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.swarm.wire.dht_rules import MAX_SUBKEYS_PER_KEY, check_record

logger = logging.getLogger(__name__)

MAX_STORED_RECORDS = 4096  # (key, subkey) records one DHT storage holds: ~40 MiB at 8 KiB each
MAX_KEYS_PER_PEER = 8  # keys one subkey (one signer) may hold records under, across swarms
HEAP_SLACK = 4  # expiration-heap entries per record held before the heap is rebuilt


class SignedRecordValidator(RecordValidatorBase):
    """hivemind record validator: ``dht.check_record`` (rejections are counted by reason)."""

    def __init__(self) -> None:
        self.rejected: dict[str, int] = {}

    def validate(self, record: DHTRecord) -> bool:
        reason = check_record(record.key, record.subkey, record.value, record.expiration_time, time.time())
        if reason is not None:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            logger.debug("refused a DHT record: %s", reason)
        return reason is None

    @property
    def priority(self) -> int:
        return 20


class BoundedStorage(DHTLocalStorage):
    """DHTLocalStorage with a cap on records in all, per key and per signer (see the module doc).

    The counts are kept beside hivemind's data, so a store costs O(log n) whatever the storage holds:
    ``_expires`` maps each (key, subkey) held to its expiration, a heap of expirations forgets records as
    hivemind does (expiration < now); the heap is rebuilt from ``_expires`` when stale entries (records
    refreshed since) make it more than ``HEAP_SLACK`` times larger, at most once per that many stores.
    """

    def __init__(self) -> None:
        super().__init__(maxsize=MAX_STORED_RECORDS)
        self.refused = 0
        self._expires: dict[tuple[DHTID, Any], float] = {}
        self._heap: list[tuple[float, int, DHTID, Any]] = []
        self._tie = itertools.count()  # heap entries never compare DHTIDs with subkeys
        self._per_key: Counter[DHTID] = Counter()
        self._per_signer: Counter[Any] = Counter()

    @property
    def records(self) -> int:
        """(key, subkey) records held now."""
        self._forget_expired()
        return len(self._expires)

    def _forget_expired(self) -> None:
        now = get_dht_time()
        while self._heap and self._heap[0][0] < now:
            expiration, _, key, subkey = heapq.heappop(self._heap)
            if self._expires.get((key, subkey)) == expiration:
                del self._expires[key, subkey]
                for counter, name in ((self._per_key, key), (self._per_signer, subkey)):
                    counter[name] -= 1
                    if counter[name] <= 0:
                        del counter[name]

    def _note(self, key: DHTID, subkey: Any, expiration_time: float) -> None:
        if (key, subkey) not in self._expires:
            self._per_key[key] += 1
            self._per_signer[subkey] += 1
        self._expires[key, subkey] = max(expiration_time, self._expires.get((key, subkey), expiration_time))
        heapq.heappush(self._heap, (expiration_time, next(self._tie), key, subkey))
        if len(self._heap) > HEAP_SLACK * max(len(self._expires), MAX_SUBKEYS_PER_KEY):
            self._heap = [(exp, next(self._tie), k, s) for (k, s), exp in self._expires.items()]
            heapq.heapify(self._heap)

    def store_subkey(self, key: DHTID, subkey: Any, value: bytes, expiration_time: float) -> bool:
        self._forget_expired()
        if (key, subkey) not in self._expires and (
            self._per_signer[subkey] >= MAX_KEYS_PER_PEER
            or self._per_key[key] >= MAX_SUBKEYS_PER_KEY
            or len(self._expires) >= MAX_STORED_RECORDS
        ):
            self.refused += 1
            return False
        stored = super().store_subkey(key, subkey, value, expiration_time)
        if stored:
            self._note(key, subkey, expiration_time)
        return stored

    def store(self, key: DHTID, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        if isinstance(value, DictionaryDHTValue):  # a whole dictionary: each record on its own terms
            results = [self.store_subkey(key, s, v, e) for s, (v, e) in value.items()]
            return any(results)
        self.refused += 1  # plain values: the validator refuses them too
        return False


async def install_bounded_storage(_dht: Any, node: Any) -> None:
    """Runs inside the DHT process: swap the node's storage and cache for bounded ones."""
    for name in ("storage", "cache"):
        old = getattr(node.protocol, name)
        new = BoundedStorage()
        for key, item in list(old.items()):
            if isinstance(item.value, DictionaryDHTValue):
                for subkey, (value, expiration) in item.value.items():
                    new.store_subkey(key, subkey, value, expiration)
        setattr(node.protocol, name, new)


async def guard_stats(_dht: Any, node: Any) -> dict[str, int]:
    """Runs inside the DHT process: records refused by the validator (by reason) and by the storage."""
    validator = node.protocol.record_validator
    stats: dict[str, int] = {}
    for inner in getattr(validator, "_validators", [validator]):
        if isinstance(inner, SignedRecordValidator):
            stats.update({f"record_refused_{k}": v for k, v in inner.rejected.items()})
    stats["storage_refused"] = sum(getattr(node.protocol, n).refused for n in ("storage", "cache"))
    return stats
