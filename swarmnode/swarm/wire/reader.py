"""Typed, bounded access to a decoded message map: every field check the message types' ``from_body``
makes, raising ``ProtocolError`` naming the field path (and nothing else, whatever the input).
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

from swarmnode.swarm.wire.limits import (
    INT64_MAX,
    INT64_MIN,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_ENTRIES,
    MAX_CONFIG_KEY_BYTES,
    MAX_CONFIG_LIST,
    MAX_CONFIG_STR_BYTES,
    MAX_PEER_ID_BYTES,
    MAX_SWARM_ID_BYTES,
    SWARM_ID_RE,
    ProtocolError,
)


class Reader:
    """Typed access to one decoded map; every failure is a ProtocolError naming the field path."""

    def __init__(self, d: dict[str, Any], path: str):
        self.d, self.path, self.used = d, path, set()

    def take(self, name: str) -> Any:
        if name not in self.d:
            raise ProtocolError("missing_field", self.path + name)
        self.used.add(name)
        return self.d[name]

    def fail(self, name: str, what: str, reason: str = "bad_field") -> ProtocolError:
        return ProtocolError(reason, f"{self.path}{name}: {what}")

    def int(self, name: str, lo: int, hi: int, *, over_limit: bool = False) -> int:
        v = self.take(name)
        if type(v) is not int:
            raise self.fail(name, f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            reason = "over_limit" if over_limit and v > hi else "bad_field"
            raise self.fail(name, f"{v} outside [{lo}, {hi}]", reason)
        return v

    def bool(self, name: str) -> bool:
        v = self.take(name)
        if type(v) is not bool:
            raise self.fail(name, f"expected a boolean, got {type(v).__name__}")
        return v

    def timestamp(self) -> float:
        v = self.take("timestamp")
        if type(v) is not float or not math.isfinite(v) or v < 0:
            raise self.fail("timestamp", "expected finite non-negative float64 seconds")
        return v

    def str(self, name: str, max_bytes: int, pattern: re.Pattern | None = None, *, min_bytes: int = 0) -> str:
        return self._check_str(self.take(name), name, max_bytes, pattern, min_bytes)

    def _check_str(
        self, v: Any, name: str, max_bytes: int, pattern: re.Pattern | None, min_bytes: int
    ) -> str:
        if type(v) is not str:
            raise self.fail(name, f"expected a string, got {type(v).__name__}")
        n = utf8_len(v, self.path + name)
        if n > max_bytes:
            raise self.fail(name, f"{n} bytes; the limit is {max_bytes}", "over_limit")
        if n < min_bytes or (pattern is not None and not pattern.fullmatch(v)):
            raise self.fail(name, "empty or badly formatted")
        return v

    def peer_id(self) -> str:
        return self.str("peer_id", MAX_PEER_ID_BYTES, min_bytes=1)

    def swarm_id(self) -> str:
        return self.str("swarm_id", MAX_SWARM_ID_BYTES, SWARM_ID_RE, min_bytes=1)

    def bin(self, name: str, size: int) -> bytes:
        v = self.take(name)
        if type(v) is not bytes or len(v) != size:
            raise self.fail(name, f"expected {size} bytes (bin)")
        return v

    def packed(self, name: str, code: str, count: int) -> tuple | None:
        v = self.take(name)
        if v is None:
            return None
        if type(v) is not bytes or len(v) != 4 * count:
            raise self.fail(name, f"expected nil or {4 * count} bytes (bin, {count} x 4-byte little-endian)")
        return struct.unpack(f"<{count}{code}", v)

    def _list(self, name: str, max_len: int, min_len: int = 0) -> list:
        v = self.take(name)
        if type(v) is not list:
            raise self.fail(name, f"expected an array, got {type(v).__name__}")
        if len(v) > max_len:
            raise self.fail(name, f"{len(v)} items; the limit is {max_len}", "over_limit")
        if len(v) < min_len:
            raise self.fail(name, f"at least {min_len} item(s) required")
        return v

    def strs(self, name: str, max_len: int, max_bytes: int, pattern: re.Pattern) -> tuple[str, ...]:
        items = self._list(name, max_len)
        return tuple(self._check_str(v, f"{name}[{i}]", max_bytes, pattern, 1) for i, v in enumerate(items))

    def floats(self, name: str, max_len: int) -> tuple[float, ...]:
        items = self._list(name, max_len)
        if not all(type(v) is float and math.isfinite(v) for v in items):
            raise self.fail(name, "expected finite float64 values")
        return tuple(items)

    def map(self, name: str) -> Reader:
        v = self.take(name)
        if type(v) is not dict:
            raise self.fail(name, f"expected a map, got {type(v).__name__}")
        return Reader(v, f"{self.path}{name}.")

    def maps(self, name: str, max_len: int, min_len: int = 0) -> list[Reader]:
        out = []
        for i, v in enumerate(self._list(name, max_len, min_len)):
            if type(v) is not dict:
                raise self.fail(f"{name}[{i}]", f"expected a map, got {type(v).__name__}")
            out.append(Reader(v, f"{self.path}{name}[{i}]."))
        return out

    def config(self, name: str) -> dict[str, Any]:
        v = self.take(name)
        if type(v) is not dict:
            raise self.fail(name, f"expected a map, got {type(v).__name__}")
        check_config(v, self.path + name, 1)
        return v

    def extra(self) -> dict[str, Any]:
        """Unknown fields: ignored by v1, but kept so the message re-encodes byte for byte."""
        return {k: v for k, v in self.d.items() if k not in self.used}


def utf8_len(s: str, path: str) -> int:
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise ProtocolError("bad_field", f"{path}: not valid UTF-8 (lone surrogate)") from None


def check_config(v: Any, path: str, depth: int) -> None:
    """Task configs are JSON-like: nil, bool, int64, finite float, short str, small lists and maps."""
    if depth > MAX_CONFIG_DEPTH:
        raise ProtocolError("over_limit", f"{path}: nested deeper than {MAX_CONFIG_DEPTH}")
    if v is None or type(v) is bool:
        return
    if type(v) is int:
        if not INT64_MIN <= v <= INT64_MAX:
            raise ProtocolError("bad_field", f"{path}: integer outside int64")
    elif type(v) is float:
        if not math.isfinite(v):
            raise ProtocolError("bad_field", f"{path}: not finite")
    elif type(v) is str:
        if utf8_len(v, path) > MAX_CONFIG_STR_BYTES:
            raise ProtocolError("over_limit", f"{path}: string over {MAX_CONFIG_STR_BYTES} bytes")
    elif type(v) is list:
        if len(v) > MAX_CONFIG_LIST:
            raise ProtocolError("over_limit", f"{path}: list over {MAX_CONFIG_LIST} items")
        for i, item in enumerate(v):
            check_config(item, f"{path}[{i}]", depth + 1)
    elif type(v) is dict:
        if len(v) > MAX_CONFIG_ENTRIES:
            raise ProtocolError("over_limit", f"{path}: map over {MAX_CONFIG_ENTRIES} entries")
        for k, item in v.items():
            if not 1 <= utf8_len(k, path) <= MAX_CONFIG_KEY_BYTES:
                raise ProtocolError(
                    "bad_field", f"{path}: key length outside 1..{MAX_CONFIG_KEY_BYTES} bytes"
                )
            check_config(item, f"{path}.{k}", depth + 1)
    else:
        raise ProtocolError("bad_field", f"{path}: {type(v).__name__} is not allowed in a task config")
