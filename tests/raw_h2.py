"""One gRPC call over a bare HTTP/2 connection, for header bytes grpcio's own client will not send.

grpcio refuses to send a metadata value that is not printable ASCII (``Illegal header value``),
so a test of what the sink answers a client that does (a non-UTF-8 ``authorization``) writes
the frames itself: the connection preface, SETTINGS, one HEADERS frame whose fields are HPACK
literals without Huffman coding, one DATA frame with the gRPC message. The answer's header
fields (``:status``, ``grpc-status``, ``grpc-message``) are read back from its HEADERS frames
by a small HPACK decoder: static and dynamic table entries and literals (a Huffman-coded
string reads as ``<huffman>``; grpcio sends these fields without).
"""

from __future__ import annotations

import socket
import struct

_STATIC: list[tuple[bytes, bytes]] = [
    (b"", b""),
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
] + [(b"?", b"")] * 47
"""RFC 7541's static table: the entries a gRPC answer uses by index, the rest as placeholders."""

_DATA, _HEADERS, _SETTINGS, _GOAWAY = 0, 1, 4, 7
_END_STREAM, _END_HEADERS, _PADDED, _PRIORITY = 1, 4, 8, 0x20


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as an HPACK literal without indexing, new name, no Huffman coding."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _integer(data: bytes, i: int, prefix: int) -> tuple[int, int]:
    mask = (1 << prefix) - 1
    value, i = data[i] & mask, i + 1
    if value < mask:
        return value, i
    shift = 0
    while True:
        byte, i = data[i], i + 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _string(data: bytes, i: int) -> tuple[bytes, int]:
    huffman = data[i] & 0x80
    n, i = _integer(data, i, 7)
    return (b"<huffman>" if huffman else data[i : i + n]), i + n


def _decode(block: bytes, table: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    def entry(index: int) -> tuple[bytes, bytes]:
        return _STATIC[index] if index < len(_STATIC) else table[index - len(_STATIC)]

    fields: list[tuple[bytes, bytes]] = []
    i = 0
    while i < len(block):
        first = block[i]
        if first & 0x80:  # indexed field
            index, i = _integer(block, i, 7)
            fields.append(entry(index))
        elif first & 0xE0 == 0x20:  # dynamic table size update
            _, i = _integer(block, i, 5)
        else:  # a literal, with incremental indexing (0x40) or without
            index, i = _integer(block, i, 6 if first & 0x40 else 4)
            if index:
                name = entry(index)[0]
            else:
                name, i = _string(block, i)
            value, i = _string(block, i)
            if first & 0x40:
                table.insert(0, (name, value))
            fields.append((name, value))
    return fields


def grpc_call(port: int, path: str, authorization: bytes, message: bytes, timeout: float = 10.0) -> dict[bytes, bytes]:
    """Call ``path`` on ``127.0.0.1:port`` with these ``authorization`` bytes; the answer's header fields."""
    request = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", f"127.0.0.1:{port}".encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"authorization", authorization),
    ]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + _frame(_SETTINGS, 0, 0, b"")
            + _frame(_HEADERS, _END_HEADERS, 1, b"".join(_literal(k, v) for k, v in request))
            + _frame(_DATA, _END_STREAM, 1, b"\x00" + struct.pack(">I", len(message)) + message)
        )
        found: dict[bytes, bytes] = {}
        table: list[tuple[bytes, bytes]] = []
        buffer = b""
        while True:
            while len(buffer) < 9 or len(buffer) < 9 + int.from_bytes(buffer[:3], "big"):
                chunk = sock.recv(65536)
                if not chunk:
                    return found
                buffer += chunk
            n, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
            stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            payload, buffer = buffer[9 : 9 + n], buffer[9 + n :]
            if kind == _SETTINGS and not flags & 1:
                sock.sendall(_frame(_SETTINGS, 1, 0, b""))  # acknowledged, as the protocol asks
            elif kind == _HEADERS and stream == 1:
                if flags & _PADDED:
                    payload = payload[1 : len(payload) - payload[0]]
                if flags & _PRIORITY:
                    payload = payload[5:]
                found.update(_decode(payload, table))
                if flags & _END_STREAM:
                    return found
            elif kind == _GOAWAY:
                return found
