"""The hivemind side of ``swarm.dht``: the record validator and the bounded storage every node installs.

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

import logging
import time
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import DHTRecord, RecordValidatorBase

from swarmnode.swarm.dht import check_record
from swarmnode.swarm.protocol import MAX_SUBKEYS_PER_KEY

logger = logging.getLogger(__name__)

MAX_STORED_RECORDS = 4096  # (key, subkey) records one DHT storage holds: ~40 MiB at 8 KiB each
MAX_KEYS_PER_PEER = 8  # keys one subkey (one signer) may hold records under, across swarms


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
    """DHTLocalStorage with a cap on records in all, per key and per signer (see the module doc)."""

    def __init__(self) -> None:
        super().__init__(maxsize=MAX_STORED_RECORDS)
        self.refused = 0
        self._keys_of: dict[Any, set[DHTID]] = {}  # subkey -> keys it may hold a record under

    def _records(self) -> int:
        return sum(len(v.value) if isinstance(v.value, DictionaryDHTValue) else 1 for _, v in self.items())

    def _held(self, key: DHTID, subkey: Any) -> bool:
        item = self.get(key)
        return item is not None and isinstance(item.value, DictionaryDHTValue) and subkey in item.value.data

    def store_subkey(self, key: DHTID, subkey: Any, value: bytes, expiration_time: float) -> bool:
        if not self._held(key, subkey):
            keys = {k for k in self._keys_of.get(subkey, ()) if self._held(k, subkey)}
            item = self.get(key)
            per_key = len(item.value) if item and isinstance(item.value, DictionaryDHTValue) else 0
            if (
                len(keys) >= MAX_KEYS_PER_PEER
                or per_key >= MAX_SUBKEYS_PER_KEY
                or self._records() >= MAX_STORED_RECORDS
            ):
                self.refused += 1
                self._keys_of[subkey] = keys
                return False
            keys.add(key)
            self._keys_of[subkey] = keys
            if len(self._keys_of) > 2 * MAX_STORED_RECORDS:  # forget signers that hold nothing any more
                held = {s: {k for k in ks if self._held(k, s)} for s, ks in self._keys_of.items()}
                self._keys_of = {s: ks for s, ks in held.items() if ks}
        return super().store_subkey(key, subkey, value, expiration_time)

    def store(self, key: DHTID, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is None and not isinstance(value, DictionaryDHTValue):
            self.refused += 1  # plain values: the validator refuses them too
            return False
        return super().store(key, value, expiration_time, subkey)


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
