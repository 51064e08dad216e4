"""The gRPC transport's connections under the HTTP side's rules: a relay in front of grpcio.

grpcio accepts its own connections and offers no hook to choose which one to close: at its cap
(``grpc.max_allowed_incoming_connections``) it closes the *newcomer*, so connections that
finished the HTTP/2 handshake and idle (or never finish it) locked every new channel out until
they timed out (1 of 201 served). ``Front`` accepts on the gRPC port itself (``edge.listener``:
out of descriptors, a newcomer is refused with a reason) and relays each connection's bytes to
grpcio, which listens on a loopback port of its own; at ``max_connections`` (or ``per_peer``
from one address) a newcomer closes, in this order:

- the connection waiting longest for its handshake (its client has not sent the 24-byte HTTP/2
  preface yet: grpcio's end opens only then, and it is closed after ``header_timeout``);
- else the one *idle* longest: the last bytes on it were grpcio's (an answer, a SETTINGS
  acknowledgement), so no call is waiting for an answer;
- else the one quiet longest (nothing either way for ``SLOW_AFTER`` seconds): a call whose
  request stalled, or a client that does not read its answer;

and only when every connection is moving bytes is the newcomer closed. Besides, a connection
quiet both ways for ``idle_timeout`` is closed (``_sweep``): a stream opened and never finished
keeps grpcio's own idle timer off. A connection closed by these rules is aborted (what is unsent
dropped: closing would wait for a client that does not read). The rules count what they did in
the same ``Counts`` the status route shows (``connections.grpc``).

grpcio sees every call come from the relay: ``peer_of`` maps the relay's local port of a
connection back to its client's address (the run quotas count by it). Back-pressure: either
side's transport past ``HIGH_WATER`` bytes pauses reading from the other. Each relayed
connection holds three descriptors (the client's, the relay's and grpcio's ends of the
loopback connection): ``max_connections`` is the plan's gRPC share divided by three.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from .connections import SLOW_AFTER, Counts
from .listener import Listener, OnExhausted
from .ports import network_of

log = logging.getLogger("rankscope.sink")

PREFACE = 24
"""Bytes of the HTTP/2 client connection preface (``PRI * HTTP/2.0...``)."""
HIGH_WATER = 1 << 20
"""Bytes buffered towards one side past which the other side is not read."""


class Relay(asyncio.Protocol):
    """One client connection, relayed to grpcio."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.peer = ""
        self.network = ""
        self.opened = 0.0
        self.received = 0
        """Bytes the client sent."""
        self.last_in = 0.0
        """Loop time the client last sent bytes."""
        self.last_out = 0.0
        """Loop time grpcio last sent bytes to the client."""
        self.local_port: int | None = None
        """The relay's port of its connection to grpcio (what grpcio sees as the call's peer)."""
        self._pending: list[bytes] = []
        self._connecting = False
        self._deadline: asyncio.TimerHandle | None = None
        self._closed = False

    # -- the client's side ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.client = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.network = network_of(self.peer)
        """What the per-address cap counts by (an IPv6 address by its /64)."""
        self.opened = self.last_in = self.front.loop.time()
        if self.front.admit(self):
            self._deadline = self.front.loop.call_later(self.front.header_timeout, self._handshake_overdue)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self.last_in = self.front.loop.time()
        if self.upstream is None:  # grpcio's end opens once the preface is whole (reading pauses till then)
            self._pending.append(data)
            if self.received >= PREFACE and not self._connecting:
                self._connecting = True
                self.front.connect(self)
            return
        self.upstream.write(data)
        if self.upstream.get_write_buffer_size() > HIGH_WATER and self.client is not None:
            self.client.pause_reading()

    def eof_received(self) -> bool | None:
        if self.upstream is not None and self.upstream.can_write_eof():
            self.upstream.write_eof()
            return True
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.close()

    def _handshake_overdue(self) -> None:
        """No whole preface within ``header_timeout``: closed, as grpcio closes a slow handshake."""
        if self.received < PREFACE:
            self.close(abort=True)

    def pause_writing(self) -> None:  # the client reads slower than grpcio answers
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    # -- what the rules read --------------------------------------------------------------

    @property
    def waiting(self) -> bool:
        """Whether it has not sent its preface yet."""
        return not self._closed and self.received < PREFACE

    @property
    def last_active(self) -> float:
        """Loop time the last bytes went either way."""
        return max(self.last_in, self.last_out)

    @property
    def idle(self) -> bool:
        """Whether the last bytes on it were grpcio's: no call waits for an answer."""
        return not self._closed and self.received >= PREFACE and self.last_out >= self.last_in

    # -- grpcio's side --------------------------------------------------------------------

    def upstream_made(self, transport: asyncio.Transport) -> None:
        if self._closed:
            transport.close()
            return
        self.upstream = transport
        sockname = transport.get_extra_info("sockname")
        if isinstance(sockname, tuple) and len(sockname) >= 2:
            self.local_port = int(sockname[1])
            self.front.mapped(self)  # before grpcio sees a byte of it
        for data in self._pending:
            transport.write(data)
        self._pending.clear()
        if self.client is not None and transport.get_write_buffer_size() <= HIGH_WATER:
            self.client.resume_reading()

    def upstream_data(self, data: bytes) -> None:
        self.last_out = self.front.loop.time()
        if self.client is not None:
            self.client.write(data)
            if self.client.get_write_buffer_size() > HIGH_WATER and self.upstream is not None:
                self.upstream.pause_reading()

    def upstream_drained(self) -> None:
        if self.client is not None:
            self.client.resume_reading()

    def close(self, *, abort: bool = False) -> None:
        """Close both ends (``abort``: dropping what is unsent, as for a connection closed to make
        room: ``close`` would wait for a client that does not read, holding its descriptor)."""
        if self._closed:
            return
        self._closed = True
        if self._deadline is not None:
            self._deadline.cancel()
        self.front.gone(self)
        for transport in (self.client, self.upstream):
            if transport is not None:
                transport.abort() if abort else transport.close()


class _Upstream(asyncio.Protocol):
    """The relay's connection to grpcio."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.relay.upstream_made(transport)

    def data_received(self, data: bytes) -> None:
        self.relay.upstream_data(data)

    def pause_writing(self) -> None:  # grpcio reads slower than the client sends
        if self.relay.client is not None:
            self.relay.client.pause_reading()

    def resume_writing(self) -> None:
        self.relay.upstream_drained()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.relay.close()


class Front:
    """The relays of one gRPC port, on their own event loop (``serve`` on a supervised thread)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_connections: int,
        per_peer: int,
        header_timeout: float = 5.0,
        idle_timeout: float = 15.0,
        counts: Counts | None = None,
        on_exhausted: OnExhausted | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.upstream_port = 0
        """grpcio's loopback port (set once its server listens, before ``serve``)."""
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max(1, max_connections)
        self.per_peer = max(1, min(per_peer, self.max_connections))
        self.counts = counts or Counts()
        self.counts.per_peer = self.per_peer
        self.relays: dict[Relay, None] = {}
        self._peers: dict[int, str] = {}
        """The relay's local port of each connection to grpcio -> its client's host."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self.on_exhausted = on_exhausted
        self.listener = Listener(self.loop, lambda: Relay(self), host, port, backlog=1024, on_exhausted=on_exhausted)
        self.listener.start()
        self.port = self.listener.port
        self._stopped = threading.Event()

    def peer_of(self, host: str, port: int) -> str:
        """The client's host of a call grpcio saw come from ``host:port`` (the relay's end)."""
        return self._peers.get(port, host) if host in ("127.0.0.1", "::1") else host

    def admit(self, newcomer: Relay) -> bool:
        """Count the newcomer in, making room by the module's rules; False: it was closed."""
        self.relays[newcomer] = None
        same = [r for r in self.relays if r.network == newcomer.network]
        if len(same) > self.per_peer:
            return self._make_room(newcomer, same, "per_peer")
        if len(self.relays) > self.max_connections:
            return self._make_room(newcomer, list(self.relays), "full")
        self.counts.open = len(self.relays)
        return True

    def _make_room(self, newcomer: Relay, among: list[Relay], bound: str) -> bool:
        now = self.loop.time()
        others = [r for r in among if r is not newcomer]
        waiting = [r for r in others if r.waiting]
        if waiting:
            self._close(min(waiting, key=lambda r: r.opened), "waiting")
            return True
        idle = [r for r in others if r.idle]
        if idle:
            self._close(min(idle, key=lambda r: r.last_active), "idle")
            return True
        stalled = [r for r in others if now - r.last_active >= SLOW_AFTER]
        if stalled:  # a call sent and nothing since, either way: a stalled stream, or a slow answer
            self._close(min(stalled, key=lambda r: r.last_active), "slow")
            return True
        self.counts.turned_away[bound] += 1
        newcomer.close(abort=True)
        return False

    def _close(self, relay: Relay, doing: str) -> None:
        relay.close(abort=True)
        self.counts.closed[doing] += 1

    def connect(self, relay: Relay) -> None:
        if relay.client is not None:
            relay.client.pause_reading()  # until grpcio's end is open (what came is kept)
        task = self.loop.create_task(self._connect(relay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, relay: Relay) -> None:
        try:
            await self.loop.create_connection(lambda: _Upstream(relay), "127.0.0.1", self.upstream_port)
        except OSError as exc:  # out of descriptors, or grpcio stopping: the client is closed, counted
            self.counts.relay_failed += 1
            if self.on_exhausted is not None and exc.errno in (errno.EMFILE, errno.ENFILE):
                self.on_exhausted("relay", exc)
            log.debug("rankscope sink: relaying a gRPC connection failed: %r", exc)
            relay.close()

    def mapped(self, relay: Relay) -> None:
        """The relay's connection to grpcio is open: calls on it come from the relay's client."""
        if relay.local_port is not None:
            self._peers[relay.local_port] = relay.peer

    def gone(self, relay: Relay) -> None:
        self.relays.pop(relay, None)
        self.counts.open = len(self.relays)
        if relay.local_port is not None:
            self._peers.pop(relay.local_port, None)

    def _sweep(self) -> None:
        """Every second: a connection quiet both ways for ``idle_timeout`` is closed, whatever grpcio
        thinks of it (a stream opened and never finished keeps grpcio's idle timer off)."""
        now = self.loop.time()
        for relay in [r for r in self.relays if now - r.last_active >= self.idle_timeout]:
            relay.close(abort=True)
            self.counts.timed_out += 1
        self.loop.call_later(1.0, self._sweep)

    def serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_later(1.0, self._sweep)
        self.loop.run_forever()
        self.listener.close()
        for relay in list(self.relays):
            relay.close(abort=True)
        for task in self._tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*self._tasks, asyncio.sleep(0), return_exceptions=True))
        self.loop.close()
        self._stopped.set()

    def stop(self, before: Callable[[], Awaitable[object]] | None = None) -> None:
        """Stop accepting, await ``before`` (grpcio's server answering its calls in progress), then
        close every connection and the loop."""

        async def stopping() -> None:
            self.listener.close()
            if before is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(before(), 5.0)
            self.loop.stop()

        if self.loop.is_closed():
            return
        if not self.loop.is_running():  # never served: nothing to wait for
            self.loop.run_until_complete(stopping())
            self.loop.close()
            return
        asyncio.run_coroutine_threadsafe(stopping(), self.loop)
        self._stopped.wait(10.0)
