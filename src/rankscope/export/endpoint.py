"""The endpoint as the outboxes see it: a ``Sender``, one backoff, one warning when it is away.

Every outbox sends through ``Endpoint.attempt``: one attempt with the round's deadline, counted (the
export cadence spaces rounds by the requests they sent), an exception turned into a refused attempt
(an embedded sink that cannot start is counted as dropped, warned once), and what a taken request's
``partial_success`` refused (a sink under its disk floor, a run past its quota) counted as dropped.
When an attempt that may work later fails, the export round stops and ``failed`` schedules the
next one: doubling from 0.5 s, capped at 2 s (one small request per 2 s is less than a process
sends when all is well), jittered, stretched to the endpoint's own hint (gRPC RetryInfo, HTTP
Retry-After) up to 30 s. While it is away nothing is lost: the outboxes hold their data, within
their bounds. It is said away once a round fails for good reason: at once when refused or
unreachable, at the second round in a row when the first only ran into its deadline (a sink still
starting on a busy machine answers the next one; one slow answer is not an outage).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from ..core.errors import warn
from .senders import Attempt, Sender, Signal

OnRejected = Callable[[Signal, int, str], None]

RETRY_FIRST = 0.5
RETRY_MAX = 2.0
RETRY_AFTER_MAX = 30.0

log = logging.getLogger("rankscope")


class Endpoint:
    """One process's way out: attempts, the backoff between failed rounds, and what to say about it."""

    def __init__(
        self,
        sender: Sender,
        max_queued_steps: int,
        who: str = "rankscope",
        says_down: bool = True,
        rejected: OnRejected | None = None,
    ) -> None:
        self.sender = sender
        self._rejected = rejected
        """Told what a taken request's ``partial_success`` refused (``Drops.rejected``)."""
        self.who = who
        """How its lines start: ``rankscope``, or ``rankscope [trainer_r1]`` in a multi-process job."""
        self.says_down = says_down
        """Whether it says the endpoint is down and back (each node's first rank: the others see the same)."""
        self.requests = 0
        """Attempts since ``start_round`` (the cadence's measure of a round)."""
        self.failures = 0
        self.next_attempt = 0.0
        self._max_queued_steps = max_queued_steps
        self._down_since: float | None = None
        self._warned_down = False
        self._warned_unreachable = False

    def start_round(self) -> None:
        self.requests = 0

    def attempt(self, signal: Signal, payload: bytes, deadline: float | None) -> Attempt:
        self.requests += 1
        timeout = None if deadline is None else max(0.001, deadline - time.monotonic())
        try:
            attempt = self.sender.send(signal, payload, timeout)
        except Exception as exc:  # e.g. the embedded sink could not start: counted, warned once
            if not self._warned_unreachable:
                self._warned_unreachable = True
                if self.says_down:  # the others of this machine count theirs as dropped, said at their end
                    warn(f"{self.who}: no sink could be reached ({exc}); metrics are counted as dropped")
            return Attempt(False, detail=repr(exc))
        if attempt.rejected and self._rejected is not None:
            self._rejected(signal, attempt.rejected, attempt.detail)
        return attempt

    def ready(self, now: float) -> bool:
        return now >= self.next_attempt

    def failed(self, attempt: Attempt) -> None:
        """The endpoint did not take a request it may take later: keep everything, retry after a backoff."""
        self.failures += 1
        backoff = min(RETRY_MAX, RETRY_FIRST * 2 ** (self.failures - 1)) * random.uniform(0.8, 1.2)
        if attempt.retry_after is not None:
            backoff = min(max(backoff, attempt.retry_after), RETRY_AFTER_MAX)
        now = time.monotonic()
        self.next_attempt = now + backoff
        if self._down_since is None:
            self._down_since = now
        if attempt.slow and self.failures == 1:  # one slow answer is not an outage: said if the next fails too
            return
        if not self._warned_down:  # a log line, not a warning: nothing is lost (yet)
            self._warned_down = True
            log.log(
                logging.WARNING if self.says_down else logging.DEBUG,
                "%s: %s does not take exports (%s); steps wait for it (up to %d) and go out when it "
                "answers; the job goes on",
                self.who,
                self.sender.target,
                _short(attempt.detail),
                self._max_queued_steps,
            )

    def recovered(self) -> None:
        """A round went through: say so once if the endpoint was away, and reset the backoff."""
        if self.failures and self._warned_down:
            down = time.monotonic() - (self._down_since or time.monotonic())
            log.log(
                logging.WARNING if self.says_down else logging.DEBUG,
                "%s: %s answers again after %.1fs; the steps held meanwhile were sent",
                self.who,
                self.sender.target,
                down,
            )
            self._warned_down = False
        self.failures, self._down_since, self.next_attempt = 0, None, 0.0

    def after_bug(self) -> None:
        """A round raised (a bug, not the endpoint): never a busy loop over it."""
        self.next_attempt = time.monotonic() + RETRY_FIRST


def _short(detail: str | None) -> str:
    """An attempt's failure, without gRPC's repetition: its last clause (``Connection refused``)."""
    text = " ".join(str(detail or "no answer").split())
    last = text.rsplit(": ", 1)[-1].rstrip(")")
    return last[:120] if len(text) > 120 else text
