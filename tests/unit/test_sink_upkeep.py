"""Runs that are done let go, and only runs with work are visited (``sink.upkeep``); who may open
another run and which run makes room (``sink.quotas``). A sink without servers, its clock
injected, its finalizer's rounds run by the test."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.raw import parse_metrics
from rankscope.sink import BookConfig, RunLimits, Sink, SinkConfig
from rankscope.sink.testing import ENDED_MARGIN, Agenda, Claim, Client, DiskBudget, Quotas, ViewWriter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _sink(tmp_path: Path, clock: Clock, stop_timeout: float = 10.0) -> Iterator[Sink]:
    views = {"jsonl": {"logging_mode": "global_reduce", "path": str(tmp_path / "{experiment}-{run}.jsonl")}}
    config = SinkConfig(
        grpc_port=None,
        http_port=None,
        tick=3600.0,
        state_dir=tmp_path / "state",
        backends=views,
        runs=RunLimits(quiet_after=30.0, idle_timeout=120.0),
        book=BookConfig(grace=1.0, start_hold=0.0),
        stop_timeout=stop_timeout,
    )
    started = Sink(config, clock=clock).start()
    yield started
    started.stop()
    assert started.internal_errors == []


@pytest.fixture
def sink(tmp_path: Path, clock: Clock) -> Iterator[Sink]:
    yield from _sink(tmp_path, clock)


@pytest.fixture
def impatient_sink(tmp_path: Path, clock: Clock) -> Iterator[Sink]:
    """A closed run's log closes at once, whether its views finished or not (``stop_timeout`` 0)."""
    yield from _sink(tmp_path, clock, stop_timeout=0.0)


def step(experiment: str, run: str, *, goodbye: bool = False, at: int = 0) -> list[object]:
    r = mpb.ExportMetricsServiceRequest()
    resource = {attr.EXPERIMENT_ID: experiment, attr.RUN_ID: run, attr.SERVICE_INSTANCE_ID: f"{run}-p", attr.RANK: "0"}
    metrics = r.resource_metrics.add(resource=encode_resource(resource)).scope_metrics.add().metrics
    if goodbye:
        metrics.add(name=attr.GOODBYE).sum.data_points.add(as_int=1)
    else:
        point = metrics.add(name="loss").gauge.data_points.add(as_double=1.0)
        point.attributes.extend([key_value(attr.REDUCE, "max"), key_value(attr.STEP, at)])
        metrics.add(name=attr.FLUSH_MARKER).sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, at)])
    return parse_metrics(r.SerializeToString())  # type: ignore[return-value]


def settle(sink: Sink) -> None:
    """A round, then the views write and the closer closes what it was handed."""
    sink.upkeep.round()
    for tenant in sink.tenants.all():
        if tenant.writer is not None:
            assert tenant.writer.wait_idle(10)
    deadline = time.monotonic() + 10
    while sink.closer.closing and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_run_that_said_goodbye_closes_within_seconds_and_is_still_answered_for(sink: Sink, clock: Clock) -> None:
    client = Client(peer="10.0.0.1")
    assert sink.export_metrics(step("exp", "short"), client).rejected == 0
    assert sink.export_metrics(step("exp", "short", goodbye=True), client).rejected == 0
    settle(sink)
    tenant = sink.tenants.find("exp", "short")
    assert tenant is not None and tenant.ended and sink.tenants.descriptors.used > 0
    clock.now += 1.0 + ENDED_MARGIN + 0.1  # the run book now refuses the id's reuse: it may close
    settle(sink)
    assert sink.tenants.find("exp", "short") is None and sink.tenants.descriptors.used == 0
    status = sink.status("exp", "short")
    assert status is not None and not status["open"] and status["last_written_step"] == 0
    assert [r["run"] for r in status["runs"]] == ["short"]  # the run book remembers it
    assert status["client"] == "10.0.0.1"


def test_a_quiet_run_gives_its_descriptors_back_and_takes_them_again(sink: Sink, clock: Clock) -> None:
    assert sink.export_metrics(step("exp", "quiet")).rejected == 0
    settle(sink)
    tenant = sink.tenants.find("exp", "quiet")
    assert tenant is not None and tenant.writer is not None
    assert sink.tenants.descriptors.holds(tenant) == 1 and sink.tenants.descriptors.holds(tenant.writer) == 1
    clock.now += 31.0
    settle(sink)
    assert sink.tenants.descriptors.used == 0 and tenant.releases == 1
    assert tenant.log is not None and not [f for f in _open_files() if f.startswith(str(tenant.log.directory))]
    assert sink.export_metrics(step("exp", "quiet", at=1)).rejected == 0  # the same run: its files open again
    settle(sink)
    assert tenant.writer.opens == 2 and sink.tenants.descriptors.holds(tenant) == 1
    clock.now += 121.0  # idle: closed (its steps go on where they were on new data)
    settle(sink)
    settle(sink)
    assert sink.tenants.find("exp", "quiet") is None and sink.closed.evicted == 1


def test_a_run_closed_before_its_views_finished_keeps_its_disk_reservation_until_they_do(
    impatient_sink: Sink, clock: Clock
) -> None:
    """A loaded view pool finishes a closed run's views after its log closed (``stop_timeout``):
    what they wrote is charged once they finish, the run's reservation held till then. Charged at
    once, a page still being written was measured short and the client's next runs went past its
    budget (a flood of report pages under load, ``test_sink_floods``)."""
    sink, disk = impatient_sink, impatient_sink.tenants.disk
    for run in ("first", "second"):
        assert sink.export_metrics(step("exp", run)).rejected == 0
        assert sink.export_metrics(step("exp", run, goodbye=True)).rejected == 0
    settle(sink)
    clock.now += 1.0 + ENDED_MARGIN + 0.1
    first = sink.tenants.find("exp", "first")
    second = sink.tenants.find("exp", "second")
    assert first is not None and second is not None and second.writer is not None
    # The second run's views held by the test as a busy pool thread holds them: they cannot finish.
    release = hold(second.writer)
    settle(sink)
    assert sink.tenants.find("exp", "first") is None and sink.tenants.find("exp", "second") is None
    assert first.writer is not None and first.writer.join(10) and not second.writer.closed.is_set()
    charged(disk, first.claim)  # the first run's views finished: what they wrote is charged
    wrote = disk.status()["most_used_bytes"]
    assert wrote == os.path.getsize(first.writer.status()["jsonl"]["location"]) > 0
    time.sleep(0.3)  # the closer's rounds (every 0.1 s) go by: the second run's views have not finished
    assert second.claim in disk._reserved and disk.status()["most_used_bytes"] == wrote  # still reserved
    release()
    assert second.writer.join(10)
    charged(disk, second.claim)
    assert disk.status()["most_used_bytes"] > wrote  # charged now: both runs' files, one client's


def test_a_closed_run_counts_as_settling_from_its_close_until_its_views_are_charged(sink: Sink, clock: Clock) -> None:
    """``settling_runs`` is what a caller waits on before reading the disk charge: it read 0 while a
    closed run's page was still being written before its log closed, and a flood test read the
    charge a page short."""
    assert sink.export_metrics(step("exp", "slow")).rejected == 0
    assert sink.export_metrics(step("exp", "slow", goodbye=True)).rejected == 0
    settle(sink)
    tenant = sink.tenants.find("exp", "slow")
    assert tenant is not None and tenant.writer is not None
    release = hold(tenant.writer)  # a busy pool thread: its views cannot finish
    clock.now += 1.0 + ENDED_MARGIN + 0.1
    sink.upkeep.round()
    assert sink.tenants.find("exp", "slow") is None
    time.sleep(0.3)  # the closer's rounds go by: the run's log waits for its views (stop_timeout, 10 s)
    status = sink.overview()
    assert status["closing_runs"] == 1 and status["settling_runs"] == 1, status
    assert tenant.claim in sink.tenants.disk._reserved
    release()
    charged(sink.tenants.disk, tenant.claim)
    assert sink.overview()["settling_runs"] == 0 and sink.tenants.disk.status()["most_used_bytes"] > 0


def test_a_run_taken_back_before_the_closer_reached_it_gives_its_reservation_back(sink: Sink, clock: Clock) -> None:
    """A run closed and reopened before the closer thread took it: its old opening's views are closed
    by the reopening, and what they wrote is charged. Its reservation was held for ever before, a
    client's budget 5 MiB (a report page) smaller each time."""
    assert sink.export_metrics(step("exp", "back")).rejected == 0
    settle(sink)
    tenant = sink.tenants.find("exp", "back")
    assert tenant is not None and tenant.claim in sink.tenants.disk._reserved
    clock.now += 121.0  # idle: it may close
    with sink.tenants.lock:  # the closer thread waits for this lock to take the runs to close
        assert sink.closer.retire(tenant)
        sink.closer.take_back(tenant.key)  # data came back for it, as opening does
    charged(sink.tenants.disk, tenant.claim)
    assert sink.overview()["settling_runs"] == 0


def test_a_charge_that_fails_gives_that_runs_reservation_back_and_the_others_are_charged(
    sink: Sink, clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A charge that raised (a failing disk, a bug) dropped the runs after it in the same round:
    neither charged nor reserved, yet no longer counted as settling."""
    disk = sink.tenants.disk
    real, calls = disk.settle, []

    def failing_once(claim: Claim, client: str, locations: Any) -> int:
        calls.append(claim)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        return real(claim, client, locations)

    monkeypatch.setattr(disk, "settle", failing_once)
    for run in ("one", "two", "three"):
        assert sink.export_metrics(step("exp", run)).rejected == 0
        assert sink.export_metrics(step("exp", run, goodbye=True)).rejected == 0
    settle(sink)
    tenants = [sink.tenants.find("exp", run) for run in ("one", "two", "three")]
    clock.now += 1.0 + ENDED_MARGIN + 0.1
    settle(sink)
    for tenant in tenants:
        assert tenant is not None
        charged(disk, tenant.claim)
    assert len(calls) == 3 and sink.overview()["settling_runs"] == 0
    assert disk.status()["reserved_bytes"] == 0 and disk.status()["most_used_bytes"] > 0
    assert "charging what the views of" in caplog.text and "Input/output error" in caplog.text
    assert sink.overview()["internal_errors"] == 1  # counted where the status route shows it
    sink.internal_errors.clear()  # the fixture checks none were left: this one was the test's


def test_views_that_never_finish_are_charged_what_they_hold_after_a_while(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A hung backend does not hold its client's reservation for ever: past ``SETTLE_TIMEOUT`` its
    run is charged what its views hold, said once in the log."""
    made = _sink(tmp_path, clock, stop_timeout=0.0)
    sink = next(made)
    sink.closer._settle_timeout = 0.3  # SETTLE_TIMEOUT's 60 s, for a test
    try:
        assert sink.export_metrics(step("exp", "hung")).rejected == 0
        assert sink.export_metrics(step("exp", "hung", goodbye=True)).rejected == 0
        settle(sink)
        clock.now += 1.0 + ENDED_MARGIN + 0.1
        tenant = sink.tenants.find("exp", "hung")
        assert tenant is not None and tenant.writer is not None
        release = hold(tenant.writer)
        settle(sink)
        assert sink.tenants.find("exp", "hung") is None and not tenant.writer.closed.is_set()
        charged(sink.tenants.disk, tenant.claim)
        assert not tenant.writer.closed.is_set() and sink.overview()["settling_runs"] == 0
        assert "had not finished 0 s after the run closed" in caplog.text
        release()
    finally:
        next(made, None)


def charged(disk: DiskBudget, claim: Claim) -> None:
    """Until ``claim``'s reservation is replaced by what its views wrote (the closer thread's round)."""
    deadline = time.monotonic() + 10
    while claim in disk._reserved and time.monotonic() < deadline:
        time.sleep(0.02)
    assert claim not in disk._reserved


def hold(writer: ViewWriter) -> Callable[[], None]:
    """``writer``'s inbox claimed by the caller, as a pool thread's turn claims it: nothing it is
    sent runs until the call returned is made. A turn just done may still hold it a moment."""
    inbox = writer._inbox
    deadline = time.monotonic() + 10
    while (found := inbox.claim()) == "busy" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert found == "claimed"
    return inbox.unclaim


def test_the_finalizer_visits_only_the_runs_with_work(sink: Sink, clock: Clock) -> None:
    for i in range(200):
        assert sink.export_metrics(step("many", f"r{i}")).rejected == 0
    settle(sink)
    settle(sink)
    visits = sink.upkeep.visits
    for _ in range(100):  # two seconds of ticks with nothing due
        clock.now += 0.02
        sink.upkeep.round()
    assert sink.upkeep.visits == visits
    assert sink.export_metrics(step("many", "r7", at=1)).rejected == 0
    sink.upkeep.round()
    assert sink.upkeep.visits == visits + 1  # the one that took data


def test_the_agenda_hands_out_the_woken_and_the_due_once_each() -> None:
    agenda: Agenda[str] = Agenda()
    agenda.at("b", 5.0)
    agenda.at("a", 3.0)
    agenda.at("b", 2.0)  # sooner: stands; the later entry is stale
    agenda.wake("c")
    assert agenda.due(1.0) == ["c"]
    assert agenda.due(4.0) == ["b", "a"]
    assert agenda.due(10.0) == [] and len(agenda) == 0


@dataclass
class Run:
    ended: bool = False
    closable: bool = False


def test_admission_takes_room_from_the_bound_reached_and_refuses_only_busy_excess() -> None:
    quotas = Quotas(RunLimits(max_open=6, per_experiment=2, per_client=3))
    runs: dict[tuple[str, str], Run] = {}

    def open_run(experiment: str, run: str, client: str, **state: bool) -> None:
        runs[(experiment, run)] = Run(**state)
        quotas.touched((experiment, run), client)

    open_run("e", "1", "hog")
    open_run("e", "2", "hog")
    refused = quotas.admit("e", "hog", runs)
    assert refused.refused is not None and "experiment 'e' has 2 runs open (limit)" in refused.refused
    runs[("e", "1")].ended = True  # an ended run counts against neither quota
    assert quotas.admit("e", "hog", runs).victims == []
    open_run("f", "1", "hog", closable=True)
    open_run("g", "1", "hog")
    assert quotas.admit("h", "hog", runs).victims == [("f", "1")]  # its own quiet run makes room
    open_run("x", "1", "other")
    open_run("y", "1", "other", closable=True)
    assert len(runs) == 6
    runs[("e", "1")].closable = True
    assert quotas.admit("z", "newcomer", runs).victims == [("e", "1")]  # full: the ended run goes first
    runs[("e", "1")].closable = False
    runs[("f", "1")].closable = False
    assert quotas.admit("z", "newcomer", runs).victims == [("y", "1")]
    runs[("y", "1")].closable = False
    found = quotas.admit("z", "newcomer", runs)
    assert found.refused is not None and "the sink holds 6 runs open" in found.refused
    assert quotas.status()["refused_runs"] == {"experiment": 1, "client": 0, "sink": 1}


def _open_files() -> set[str]:
    names = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile
            continue
    return names
