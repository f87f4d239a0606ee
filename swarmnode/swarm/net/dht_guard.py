"""The hivemind side of ``swarm.wire.dht_rules``: the record validator, the bounded storage and the bounded
decoder every node installs.

Imported only where a DHT starts (``daemon.start_dht``) and inside the DHT process: it imports hivemind.

- ``SignedRecordValidator`` runs ``dht.check_record`` on every record this node is asked to store
  (``rpc_store``), stores itself, or gets back from a lookup.
- ``BoundedStorage`` replaces hivemind's ``DHTLocalStorage`` (which has no size limit): at most
  ``MAX_SUBKEYS_PER_KEY`` (key, subkey) records per key and ``MAX_KEYS_PER_PEER`` keys per subkey (= per
  signer, since the validator ties each subkey to its signer); records of this node's own swarms (its
  *home* swarms: their roster shards and announcement keys) at most ``MAX_HOME_RECORDS`` per home swarm,
  and every other record, whatever its swarm, shares ``MAX_STORED_RECORDS``. So junk swarms and junk keys
  fill only that shared budget, never the node's own swarm's. A store past a bound is refused (returns
  False); updates of a record already held always go through. Memory for records is then bounded by about
  (``MAX_STORED_RECORDS`` + ``MAX_HOME_RECORDS`` per home swarm) x (``MAX_RECORD_BYTES`` + overhead).
- Identity work, the storage's own rule (the validator's must be the same at every node; d is this node's
  ``swarm.identity_work_bits``): a home swarm's card whose signer proves fewer than d bits is refused (the
  swarm's readers all refuse it); a record *with work* is one whose signer proves d
  (``dht_rules.record_work``: one hash), or an announcement whose signer's card with work is held here.
  Records without work, of any swarm, fill at most ``MAX_WORKLESS_PER_KEY`` of a key's subkeys and
  ``WORKLESS_SHARE`` of each budget, so free keys cannot take the room of the records with work. At d = 0
  every record has work.
- The node's *cache* is its storage (one object): hivemind answers a find with the cache's dictionary or
  the storage's, whichever expires later, never both, so a record a peer stored ``in_cache`` with a late
  expiration hid every record of its key in storage. Records a peer asks to cache are now stored under the
  storage's rules, and a find answers with all of them.
- ``BoundedSerializer`` is what the DHT protocol decodes peers' msgpack with (an ``rpc_store``'s whole
  dictionary, a ``call_find`` answer): hivemind decodes those before any validator runs, without limits
  (1.9 MiB of empty maps: +139 MiB). It refuses a buffer over ``MAX_DECODE_BYTES`` or one holding more than
  ``MAX_DECODE_OBJECTS`` msgpack objects or nested deeper than ``MAX_DECODE_DEPTH`` (a walk over the
  object headers that stops at the first bound passed) before decoding it: one decode allocates at most
  ~``MAX_DECODE_BYTES`` + ``MAX_DECODE_OBJECTS`` small objects.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.swarm.wire.dht_rules import (
    MAX_SUBKEYS_PER_KEY,
    MSGPACK_BIN_HEADER_BYTES,
    NO_IDENTITY_WORK,
    WITHOUT_WORK,
    announce_key,
    check_record,
    record_work,
    roster_key,
    roster_keys,
    work_verdict,
)
from swarmnode.swarm.wire.limits import MAX_PEER_ID_BYTES, MAX_RECORD_BYTES, validate_swarm_id

logger = logging.getLogger(__name__)

MAX_STORED_RECORDS = 4096  # records of swarms this node is not in, all together: ~32 MiB at 8 KiB each
MAX_HOME_RECORDS = 2048  # records of each of this node's own swarms: its 512 cards and 1536 announcements
MAX_KEYS_PER_PEER = 8  # keys one subkey (one signer) may hold records under, across swarms
# Records without identity work take at most a quarter of each budget and of each key: the rest stays for
# records with work (512 of a home swarm's 2 048, 1 024 of the shared 4 096, 16 of a roster shard's 64)
WORKLESS_SHARE = 0.25
MAX_WORKLESS_PER_KEY = int(WORKLESS_SHARE * MAX_SUBKEYS_PER_KEY)
HEAP_SLACK = 4  # expiration-heap entries per record held before the heap is rebuilt
SHARED = ""  # the budget of records of no home swarm
# What hivemind may decode from a peer: at most one key's whole dictionary. Each of its records is an array
# header, the subkey (a str of at most MAX_PEER_ID_BYTES), the value (our record, msgpack-packed, as bin)
# and the expiration (a float64).
DICTIONARY_ITEM_BYTES = 1 + (2 + MAX_PEER_ID_BYTES) + (MAX_RECORD_BYTES + 2 * MSGPACK_BIN_HEADER_BYTES) + 9
MAX_DECODE_BYTES = MAX_SUBKEYS_PER_KEY * DICTIONARY_ITEM_BYTES + 64  # ~521 KiB
MAX_DECODE_OBJECTS = 8 + 4 * MAX_SUBKEYS_PER_KEY  # ext, [maxsize, latest, [[subkey, value, expiration]...]]
MAX_DECODE_DEPTH = 4  # ext > array > array of records > record
DICTIONARY_EXT_CODE = 0x50  # hivemind's DictionaryDHTValue: an ext whose payload is msgpack again
TUPLE_EXT_CODE = 0x40  # hivemind's tuple: the same


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
    """DHTLocalStorage with a cap on records per key, per signer and per budget (see the module doc).

    ``home_swarms``: the swarms whose records get a budget of their own (``MAX_HOME_RECORDS`` each); a record
    is a home swarm's when its key is one of that swarm's roster shards, or that swarm's announcement key of
    the record's subkey (both computed from the key and subkey alone). ``work_bits``: this node's d, the
    identity work a record's signer must prove to count as *with work* (module doc; 0: every record does).

    The counts are kept beside hivemind's data, so a store costs O(log n) whatever the storage holds:
    ``_expires`` maps each (key, subkey) held to its expiration, budget and work, a heap of expirations
    forgets records as hivemind does (expiration < now); the heap is rebuilt from ``_expires`` when stale
    entries (records refreshed since) make it more than ``HEAP_SLACK`` times larger, at most once per that
    many stores. Reading a record's work (``dht_rules.record_work``) costs about 10 µs a store.
    """

    def __init__(self, home_swarms: Iterable[str] = (), work_bits: int = 0) -> None:
        super().__init__(maxsize=None)  # the budgets below are the bound, checked before hivemind stores
        self.refused = 0
        self.refused_no_work = 0  # home swarms' cards refused for lacking identity work (also in refused)
        self.work_bits = work_bits
        self.home_swarms = tuple(dict.fromkeys(s for s in home_swarms if _names_keys(s)))
        self._home_roster = {
            DHTID.generate(source=key): swarm for swarm in self.home_swarms for key in roster_keys(swarm)
        }
        self._expires: dict[tuple[DHTID, Any], tuple[float, str, bool]] = {}  # expiration, budget, with work
        self._heap: list[tuple[float, int, DHTID, Any]] = []
        self._tie = itertools.count()  # heap entries never compare DHTIDs with subkeys
        self._per_key: Counter[DHTID] = Counter()
        self._per_signer: Counter[Any] = Counter()
        self._per_budget: Counter[str] = Counter()
        self._workless_per_key: Counter[DHTID] = Counter()
        self._workless_per_budget: Counter[str] = Counter()

    @property
    def records(self) -> int:
        """(key, subkey) records held now."""
        self._forget_expired()
        return len(self._expires)

    def held(self, budget: str = SHARED, *, workless: bool = False) -> int:
        """Records held now in one budget: a home swarm's, or the shared one (``SHARED``); ``workless``: only
        those without identity work."""
        self._forget_expired()
        return (self._workless_per_budget if workless else self._per_budget)[budget]

    def cap(self, budget: str, *, workless: bool = False) -> int:
        """The most records ``budget`` holds (``workless``: of records without identity work)."""
        cap = MAX_HOME_RECORDS if budget else MAX_STORED_RECORDS
        return int(WORKLESS_SHARE * cap) if workless else cap

    def budget_of(self, key: DHTID, subkey: Any) -> str:
        """The home swarm a (key, subkey) record belongs to, or ``SHARED``."""
        home = self._home_roster.get(key)
        if home is not None:
            return home
        if isinstance(subkey, str):
            for swarm in self.home_swarms:
                if DHTID.generate(source=announce_key(swarm, subkey)) == key:
                    return swarm
        return SHARED

    def has_work(self, subkey: Any, value: Any, budget: str) -> bool | None:
        """Whether a record counts as with identity work here (class doc); None: refused for lacking it (a
        home swarm's card)."""
        if self.work_bits == 0:
            return True
        facts = record_work(value) if isinstance(value, bytes) and isinstance(subkey, str) else None
        verdict = WITHOUT_WORK if facts is None else work_verdict(facts, self.work_bits, home=bool(budget))
        if verdict != WITHOUT_WORK:
            return None if verdict == NO_IDENTITY_WORK else True
        if facts is None or facts.is_card:
            return False
        try:  # an announcement: as good as its signer's card held here
            card = self._expires.get((DHTID.generate(source=roster_key(facts.swarm_id, subkey)), subkey))
        except ValueError:  # a swarm id that names no keys: the validator lets none through
            return False
        return card is not None and card[2]

    def _forget_expired(self) -> None:
        now = get_dht_time()
        while self._heap and self._heap[0][0] < now:
            expiration, _, key, subkey = heapq.heappop(self._heap)
            held = self._expires.get((key, subkey))
            if held is not None and held[0] == expiration:
                del self._expires[key, subkey]
                self._count(key, subkey, held[1], held[2], -1)

    def _count(self, key: DHTID, subkey: Any, budget: str, worked: bool, step: int) -> None:
        counters = [(self._per_key, key), (self._per_signer, subkey), (self._per_budget, budget)]
        if not worked:
            counters += [(self._workless_per_key, key), (self._workless_per_budget, budget)]
        for counter, name in counters:
            counter[name] += step
            if counter[name] <= 0:
                del counter[name]

    def _note(self, key: DHTID, subkey: Any, expiration_time: float, budget: str, worked: bool) -> None:
        held = self._expires.get((key, subkey))
        if held is not None:
            self._count(key, subkey, budget, held[2], -1)
        self._count(key, subkey, budget, worked, +1)
        expiration = max(expiration_time, held[0]) if held else expiration_time
        self._expires[key, subkey] = (expiration, budget, worked)
        heapq.heappush(self._heap, (expiration_time, next(self._tie), key, subkey))
        if len(self._heap) > HEAP_SLACK * max(len(self._expires), MAX_SUBKEYS_PER_KEY):
            self._heap = [(exp, next(self._tie), k, s) for (k, s), (exp, _, _) in self._expires.items()]
            heapq.heapify(self._heap)

    def store_subkey(self, key: DHTID, subkey: Any, value: bytes, expiration_time: float) -> bool:
        self._forget_expired()
        held = self._expires.get((key, subkey))
        budget = held[1] if held is not None else self.budget_of(key, subkey)
        worked = self.has_work(subkey, value, budget)
        if worked is None:
            self.refused_no_work += 1
        if worked is None or not self._room(key, subkey, budget, worked, held):
            self.refused += 1
            return False
        stored = super().store_subkey(key, subkey, value, expiration_time)
        if stored:
            self._note(key, subkey, expiration_time, budget, worked)
        return stored

    def _room(self, key: DHTID, subkey: Any, budget: str, worked: bool, held: tuple | None) -> bool:
        """Whether a record fits its bounds: always, for an update that keeps its work; one without work
        (new, or an update that lost it) also within the work-less bounds."""
        if held is None and (
            self._per_signer[subkey] >= MAX_KEYS_PER_PEER
            or self._per_key[key] >= MAX_SUBKEYS_PER_KEY
            or self._per_budget[budget] >= self.cap(budget)
        ):
            return False
        if worked or (held is not None and not held[2]):
            return True
        key_room = self._workless_per_key[key] < MAX_WORKLESS_PER_KEY
        return key_room and self._workless_per_budget[budget] < self.cap(budget, workless=True)

    def store(self, key: DHTID, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        if isinstance(value, DictionaryDHTValue):  # a whole dictionary: each record on its own terms
            results = [self.store_subkey(key, s, v, e) for s, (v, e) in value.items()]
            return any(results)
        self.refused += 1  # plain values: the validator refuses them too
        return False


def _names_keys(swarm_id: str) -> bool:
    """Whether ``swarm_id`` can name DHT keys (a bootstrap's config may hold any string: it has no swarm)."""
    try:
        validate_swarm_id(swarm_id)
    except ValueError:
        return False
    return True


class DecodeRefused(ValueError):
    """A peer's msgpack past a decoding bound (``BoundedSerializer``); hivemind answers the RPC with an
    error (``rpc_store``) or drops the answer (``call_find``)."""


class BoundedSerializer(MSGPackSerializer):
    """hivemind's serializer for the DHT protocol, with ``loads`` bounded (module doc): what hivemind decodes
    from peers before any validator runs."""

    @classmethod
    def loads(cls, buf: bytes) -> object:
        check_decode_cost(buf)
        return super().loads(buf)


def check_decode_cost(buf: bytes) -> None:
    """Raise DecodeRefused unless ``buf`` is one msgpack value of at most MAX_DECODE_BYTES bytes, at most
    MAX_DECODE_OBJECTS objects (the payloads of hivemind's dictionary and tuple ext types included, as
    hivemind decodes them too) and MAX_DECODE_DEPTH levels of containers. Reads headers only: it stops at
    the first bound passed, so its cost is bounded too."""
    if len(buf) > MAX_DECODE_BYTES:
        raise DecodeRefused(f"{len(buf)} bytes to decode; the limit is {MAX_DECODE_BYTES}")
    view = memoryview(buf)
    budget = [MAX_DECODE_OBJECTS]
    if _walk(view, 0, 0, budget) != len(view):
        raise DecodeRefused("trailing bytes after the value")


# msgpack type bytes (the spec's format table): scalars of a fixed size, and lengths of str/bin/ext
_FIXED_SIZE = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED_SIZE |= {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin 8/16/32, str 8/16/32: length bytes
_CONTAINER = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # array/map 16/32: (length bytes, per)
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext 8/16/32: length bytes
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


def _walk(buf: memoryview, pos: int, depth: int, budget: list[int]) -> int:
    """Where the msgpack value at ``pos`` ends; DecodeRefused past a bound (``check_decode_cost``)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise DecodeRefused(f"more than {MAX_DECODE_OBJECTS} msgpack objects")
    kind = _read(buf, pos, 1)
    pos += 1
    if kind <= 0x7F or kind >= 0xE0:  # fixint
        return pos
    if 0xA0 <= kind <= 0xBF:  # fixstr
        return _skip(buf, pos, kind & 0x1F)
    if kind in _FIXED_SIZE:
        return _skip(buf, pos, _FIXED_SIZE[kind])
    if kind in _SIZED:
        width = _SIZED[kind]
        return _skip(buf, pos + width, _read(buf, pos, width))
    if kind in _EXT or kind in _FIXEXT:
        width = _EXT.get(kind, 0)
        length = _read(buf, pos, width) if width else _FIXEXT[kind]
        code, start = _read(buf, pos + width, 1), pos + width + 1
        end = _skip(buf, start, length)
        if code in (DICTIONARY_EXT_CODE, TUPLE_EXT_CODE):  # decoded again by hivemind: walk it too
            if depth >= MAX_DECODE_DEPTH or _walk(buf[start:end], 0, depth + 1, budget) != length:
                raise DecodeRefused("an ext payload nested too deep or not one msgpack value")
        return end
    if 0x80 <= kind <= 0x9F:  # fixmap, fixarray
        count = (kind & 0x0F) * (2 if kind <= 0x8F else 1)
    elif kind in _CONTAINER:
        width, per = _CONTAINER[kind]
        count = _read(buf, pos, width) * per
        pos += width
    else:  # 0xC1: never used
        raise DecodeRefused(f"not msgpack (type byte {kind:#x})")
    if depth >= MAX_DECODE_DEPTH:
        raise DecodeRefused(f"containers nested more than {MAX_DECODE_DEPTH} deep")
    if count > budget[0]:
        raise DecodeRefused(f"more than {MAX_DECODE_OBJECTS} msgpack objects")
    for _ in range(count):
        pos = _walk(buf, pos, depth + 1, budget)
    return pos


def _read(buf: memoryview, pos: int, width: int) -> int:
    if pos + width > len(buf):
        raise DecodeRefused("truncated msgpack")
    return int.from_bytes(buf[pos : pos + width], "big")


def _skip(buf: memoryview, pos: int, length: int) -> int:
    if pos + length > len(buf):
        raise DecodeRefused("truncated msgpack")
    return pos + length


async def install_guard(_dht: Any, node: Any, *, home_swarms: Iterable[str] = (), work_bits: int = 0) -> None:
    """Runs inside the DHT process: one BoundedStorage (``home_swarms`` get budgets of their own, records are
    ranked by ``work_bits`` of identity work: the swarm's ``identity_work_bits``) as both the node's storage
    and its cache, holding what the two held, and the bounded decoder (module doc)."""
    storage = BoundedStorage(home_swarms, work_bits)
    for name in ("storage", "cache"):
        for key, item in list(getattr(node.protocol, name).items()):
            if isinstance(item.value, DictionaryDHTValue):
                for subkey, (value, expiration) in item.value.items():
                    storage.store_subkey(key, subkey, value, expiration)
    node.protocol.storage = node.protocol.cache = storage
    node.protocol.serializer = BoundedSerializer


async def guard_stats(_dht: Any, node: Any) -> dict[str, int]:
    """Runs inside the DHT process: records refused by the validator (by reason) and by the storage."""
    validator = node.protocol.record_validator
    stats: dict[str, int] = {}
    for inner in getattr(validator, "_validators", [validator]):
        if isinstance(inner, SignedRecordValidator):
            stats.update({f"record_refused_{k}": v for k, v in inner.rejected.items()})
    # the same object since the cache stopped shadowing storage: counted once
    storages = {id(s): s for s in (node.protocol.storage, node.protocol.cache)}.values()
    stats["storage_refused"] = sum(s.refused for s in storages)
    stats["storage_refused_no_work"] = sum(getattr(s, "refused_no_work", 0) for s in storages)
    return stats
