"""Protobuf's wire format by hand, for tests that build requests of millions of parts as bytes
(fast, and able to say what no encoder would: junk fields, broken framing)."""

from __future__ import annotations


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload
