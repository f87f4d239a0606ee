"""Stream framing for payload pulls (PROTOCOL.md section 9): a 32-byte request, then our 4-byte
big-endian length header and the body. The daemon's own length prefixes have no upper bound, so both
sides use this header with a hard cap, checked before the body is read.
"""

from __future__ import annotations

from swarmnode.swarm.wire.limits import MAX_FRAME_BYTES, ProtocolError

PAYLOAD_STREAM = "/swarmnode/v1/payload"  # hivemind add_binary_stream_handler name
PULL_REQUEST_BYTES = 32  # the request is the payload's sha256
FRAME_HEADER_BYTES = 4  # response: big-endian uint32 length, then the body; length 0 = "not here"


def encode_pull_request(payload_sha256: bytes) -> bytes:
    if len(payload_sha256) != PULL_REQUEST_BYTES:
        raise ValueError("a pull request is a 32-byte sha256")
    return bytes(payload_sha256)


def parse_pull_request(data: bytes) -> bytes:
    if len(data) != PULL_REQUEST_BYTES:
        raise ProtocolError("malformed", f"pull request of {len(data)} bytes; expected {PULL_REQUEST_BYTES}")
    return bytes(data)


def encode_frame_header(length: int, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    if not 0 <= length <= max_bytes:
        raise ProtocolError("oversize", f"frame of {length} bytes; the limit is {max_bytes}")
    return length.to_bytes(FRAME_HEADER_BYTES, "big")


def parse_frame_header(header: bytes, max_bytes: int = MAX_FRAME_BYTES) -> int:
    """Body length from a 4-byte header; rejects before the body is read. 0 means "payload not here"."""
    if len(header) != FRAME_HEADER_BYTES:
        raise ProtocolError("malformed", f"frame header of {len(header)} bytes")
    length = int.from_bytes(header, "big")
    if length > max_bytes:
        raise ProtocolError("oversize", f"frame of {length} bytes; the limit is {max_bytes}")
    return length


def encode_frame(body: bytes, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    return encode_frame_header(len(body), max_bytes) + body
