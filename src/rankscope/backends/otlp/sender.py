"""The ``otlp`` view's sender: a bounded buffer of encoded steps and its own thread, so that a
Collector that is down or slow never holds up the sink's view thread (nor another view).

The view appends one request per step (``put``) and returns. The thread sends the oldest first,
one attempt of at most ``timeout`` seconds each, over gRPC or HTTP (``Transport``). A Collector
that does not answer (or answers UNAVAILABLE, 429, 503...) is tried again after a backoff (0.5 s
doubling to ``max_backoff``, jittered), the request kept: nothing is lost while the buffer has
room. A full buffer drops its oldest step for the new one (``dropped_steps``, ``dropped_points``);
a request refused for good (a bad request) and the points a ``partial_success`` names are
counted as refused (``refused_points``). Each is said once in the log; ``status`` says all of it
to the sink's status route. ``begin_close`` sets a deadline that every attempt and backoff ends
by (so several views drain at once); ``close`` waits for it, and what is left then is dropped,
counted and said.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from ..draining import Draining

log = logging.getLogger("rankscope")

_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
_RETRY_GRPC = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
_RETRY_HTTP = frozenset({408, 429, 502, 503, 504})


class UnreachableError(Exception):
    """The endpoint did not take a request it may take later."""


class RefusedError(Exception):
    """The endpoint refused a request for good."""


class Transport:
    """One OTLP metrics request per call, gRPC or HTTP: the points its ``partial_success`` refused
    (and why), or ``UnreachableError`` / ``RefusedError``."""

    def __init__(self, endpoint: str, protocol: str, timeout: float) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.protocol = protocol
        self.timeout = timeout
        self._call: Any = None
        if protocol == "grpc":
            target = self.endpoint.split("://", 1)[-1]
            self._channel = grpc.insecure_channel(target, options=(("grpc.max_reconnect_backoff_ms", 1000),))
            self._call = self._channel.unary_unary(_METHOD)

    def send(self, payload: bytes, timeout: float) -> tuple[int, str]:
        answer = self._grpc(payload, timeout) if self._call is not None else self._http(payload, timeout)
        try:
            partial = ExportMetricsServiceResponse.FromString(answer).partial_success
        except Exception:
            return 0, ""
        said = "".join(c if c.isprintable() else " " for c in partial.error_message[:1000])  # no escapes to the log
        return int(partial.rejected_data_points), " ".join(said.split())[:300]

    def _grpc(self, payload: bytes, timeout: float) -> bytes:
        try:
            answer = self._call(payload, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            why = f"{getattr(code, 'name', code)}: {' '.join(str(exc.details()).split())[:200]}"
            raise (UnreachableError if code in _RETRY_GRPC else RefusedError)(why) from None
        return answer if isinstance(answer, bytes) else b""

    def _http(self, payload: bytes, timeout: float) -> bytes:
        request = urllib.request.Request(
            self.endpoint + "/v1/metrics",
            data=payload,
            headers={"Content-Type": "application/x-protobuf"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # http or https: the view checked
                return bytes(response.read(1 << 20))
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code} {exc.reason}"
            raise (UnreachableError if exc.code in _RETRY_HTTP else RefusedError)(why) from None
        except (OSError, ValueError) as exc:  # refused connection, timeout, DNS
            raise UnreachableError(" ".join(str(getattr(exc, "reason", exc)).split())[:200]) from None

    def close(self) -> None:
        if self._call is not None:
            self._channel.close()


class Sender(Draining):
    def __init__(self, transport: Transport, *, name: str, max_buffered: int, max_backoff: float) -> None:
        if max_buffered < 2:  # one for the step being sent, one for the newest
            raise ValueError("the otlp view's max_buffered must be >= 2")
        holds = f"{max_buffered} steps"
        super().__init__(
            view="otlp", name=name, where=transport.endpoint, holds=holds, dropped=lambda: self.dropped_points
        )
        self._transport = transport
        self.max_buffered = max_buffered
        self.max_backoff = max_backoff
        self._queue: deque[tuple[bytes, int]] = deque()
        """(request, points), oldest first."""
        self._sending = False
        """The head of the queue is being sent (a full buffer drops the next one instead)."""
        self.sent_points = 0
        self.dropped_points = 0
        self.dropped_steps = 0
        self.refused_points = 0
        self._said: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="rankscope-otlp-view", daemon=True)
        self._thread.start()

    def put(self, payload: bytes, points: int) -> None:
        """Append one step's request; past ``max_buffered`` steps the oldest is dropped (counted)."""
        with self._cond:
            if self._closing:
                self._drop(points, "the view is closing")
                return
            if len(self._queue) >= self.max_buffered:  # the oldest not being sent goes
                oldest = 1 if self._sending and len(self._queue) > 1 else 0
                self._drop(self._queue[oldest][1], f"its buffer of {self.max_buffered} steps is full")
                del self._queue[oldest]
            self._queue.append((payload, points))
            self._cond.notify()

    def _drop(self, points: int, why: str) -> None:
        self.dropped_points += points
        self.dropped_steps += 1
        self._say_once("drop", "drops values: %s while %s does not take them", why, self._transport.endpoint)

    def _say_once(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self._said:
            self._said.add(kind)
            said = "rankscope: the otlp view of %s " + message + " (counted in the sink's status)"
            log.warning(said, self.name, *args)

    def status(self) -> dict[str, Any]:
        with self._cond:
            buffered = len(self._queue)
        return {
            "endpoint": self._transport.endpoint,
            "protocol": self._transport.protocol,
            "buffered_steps": buffered,
            "sent_points": self.sent_points,
            "dropped_points": self.dropped_points,
            "dropped_steps": self.dropped_steps,
            "refused_points": self.refused_points,
            "down_since": self.down_since,
            "last_error": self.last_error,
        }

    def close(self, timeout: float) -> None:
        """``begin_close``, then wait for the thread (every attempt ends by the deadline); what is
        left is dropped, counted and said."""
        self.begin_close(timeout)
        self.wait_closed(self._thread)
        with self._cond:
            steps, left = len(self._queue), sum(points for _, points in self._queue)
            self._queue.clear()
        if left:
            self.dropped_points += left
            self.dropped_steps += steps
            log.warning(
                "rankscope: the otlp view of %s dropped %d steps (%d points) that %s did not take before it closed%s",
                self.name,
                steps,
                left,
                self._transport.endpoint,
                f" ({self.last_error})" if self.last_error else "",
            )
        self._transport.close()

    def _loop(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue or time.monotonic() >= self._deadline:
                    return
                payload, points = self._queue[0]
                self._sending = True
                timeout = min(self._transport.timeout, max(0.001, self._deadline - time.monotonic()))
            try:
                rejected, why = self._transport.send(payload, timeout)
            except UnreachableError as exc:
                with self._cond:
                    self._sending = False
                failures += 1
                self.down(str(exc))
                self.sleep(min(self.max_backoff, 0.5 * 2 ** min(failures - 1, 16)) * random.uniform(0.8, 1.2))
                continue
            except RefusedError as exc:
                rejected, why = points, str(exc)
            except Exception as exc:  # a bug must not end the thread: the buffer would only fill
                with self._cond:
                    self._sending = False
                self.last_error = f"{type(exc).__name__}: {str(exc)[:300]}"
                self._say_once("bug", "failed: %s", self.last_error)
                self.sleep(1.0)
                continue
            with self._cond:
                if self._queue and self._queue[0][0] is payload:  # close() may have counted it already
                    self._queue.popleft()
                self._sending = False
            failures = 0
            self.up("points")
            rejected = min(max(rejected, 0), points)
            self.sent_points += points - rejected
            if rejected:
                self.refused_points += rejected
                self.last_error = why
                self._say_once("refused", "has points refused by %s: %s", self._transport.endpoint, why)
