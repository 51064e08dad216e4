"""What rankscope costs a training loop next to its peers, and issue 43's ratio budgets.

The same step runs through rankscope, through the least pure Python can do (the floor) and through
the loggers a training job would use instead, with ``bench_overhead.py``'s method and helpers:

- every arm runs in a fresh interpreter (``--child ARM``), in interleaved rounds (the next round in
  reverse order), each compared with the bare loop of its own round; median and IQR over rounds;
- thread CPU clocks: **inside** is the training thread's CPU inside the arm's logging calls (clock
  reads around each call, minus the same reads around nothing in the bare loop); **process** is the
  whole process's CPU beyond the bare loop, every thread counted (an exporter's, a writer's, gRPC's)
  and so is the CPU of any process the arm starts (W&B's ``wandb-core``), from the first measured
  step until the arm has flushed what it recorded (its ``flush``, below).

The step: ``bench_overhead``'s calibrated ~20 ms of single-threaded matmuls in 4 phases, then 100
scalar keys (``train/metric_{i}``, the same values in every arm) and the step's one flush or log.
Every arm records the 4 phases' durations too. Each arm calls its library the way its docs show:

- ``bare``: nothing (the same clock reads around empty sections);
- ``floor``: ``bench_overhead.FloorAPI``, rankscope's calls doing the least pure Python can (not a peer);
- ``rankscope``: ``Tracer("train").start()``, ``step(phase)`` after each phase (a span and the
  phase's duration metrics), ``stop()``, 100 ``record_metric``, ``flush(step)``; OTLP/HTTP to the
  receiver, a null receiver in another process (its CPU is not the job's), as a job sends to its
  own sink (the embedded sink, without an endpoint: ``export.kept_alive``);
- ``rankscope-grpc``: the same over OTLP/gRPC, as a job sends to a Collector's (or a sink's) gRPC
  port with ``endpoint=`` and the default protocol;
- ``otel``: the OpenTelemetry SDK: a ``MeterProvider`` with a ``PeriodicExportingMetricReader``
  (its default interval) and the OTLP/gRPC metric exporter, a ``Histogram`` per key recorded once a
  step without attributes; a ``TracerProvider`` with a ``BatchSpanProcessor`` and the OTLP/gRPC
  span exporter, a ``start_as_current_span`` around each phase (the phase's duration is the span's).
  It keeps no per-step record: a histogram folds every step into one point per key;
- ``otel-step``: the same with ``{"step": step}`` on every point and span: a series per key and
  step (cumulative, as the SDK's default temporality keeps them);
- ``wandb``: ``wandb.init(mode="offline")`` (system-metrics sampling and console capture off: only
  the logging is measured), one ``run.log({...}, step=step)`` a step with the 100 keys and the 4
  phase durations as 4 more scalars (``phase/{name}``, timed with ``perf_counter`` at the marks);
- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter.add_scalar`` per key and per phase
  duration (the same 4 scalars); its writer thread writes the event file;
- ``torchtitan``: its structured logger with its JSONL handler (``torchtitan.observability.
  structured_logger``): ``set_step(step)``, a ``log_trace_span`` around each phase (its ``_end``
  record carries the duration), one ``log_trace_scalar`` of the 100 keys;
- ``csv``: Lightning's ``CSVLogger``: ``log_metrics({...}, step)`` then ``save()`` each step, as
  Lightning's trainer calls them, the 4 phase durations as 4 more scalars.

Every arm must show its data: after its loop, what it wrote or sent must hold the last step's 100
keys and 4 phases, or the arm fails loudly (an arm that drops data cannot win). The floor: its last
closed step. rankscope (either transport) and ``otel-step``: the receiver decodes what it was sent and finds the 100
keys and the 4 phases with the last step's attribute (rankscope's ``rankscope.step``); ``otel``:
each key's histogram counts every step and each phase has a span per step. ``wandb``: the run's
offline ``.wandb`` file's history row of the last step; ``tensorboard``: the event file read back
with TensorBoard's ``EventAccumulator``; ``torchtitan``: the JSONL file's records of the last step;
``csv``: ``metrics.csv``'s row of the last step.

The budgets (issue 43), ratios over the rounds of one run: rankscope's training thread inside its
calls <= 2 x the floor's (1.5 x is where it should end up) and <= 0.5 x the cheapest peer that
keeps a per-step record of all 100 keys and 4 phases; rankscope's whole-process CPU <= every such
peer's, read directly (``direct_cost``: the calls, every other thread and helper process), with the
difference of the arm's and the bare loop's totals printed beside it as a cross-check: on this box
that difference swings by hundreds of µs a step between rounds, more than the budget it would
judge, and once read a peer's whole process below its own calls (docs/benchmarks.md). Each is
judged per round on the margin (rankscope's figure minus the budget times the other's: no
division, so a figure near zero cannot swing it) by its median and IQR, and printed with the ratio
beside it, for each rankscope arm. ``--before DIR`` adds rankscope from another checkout's ``src``, in the
same rounds, with its own budget lines.

The receiver takes OTLP/gRPC and OTLP/HTTP (the standard library's server, kept-alive) and accepts
requests up to 256 MiB: ``otel-step``'s cumulative export of every step's
series passes gRPC's (and a Collector's) 4 MiB default within 200 steps, and is then refused.

Run from the repository root:  python benchmarks/bench_peers.py [--quick] [--pairs N] ...
(``--help`` lists the flags; a small smoke run: ``--pairs 1 --steps 5 --warmup 2 --step-ms 2
--arms floor,csv``). It exits 1 when an arm's data check failed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import importlib
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import bench_overhead as overhead
from bench_overhead import BEFORE, RESULT, Receiver, Steps, cell, print_table, quartiles, run_child

HERE = os.path.abspath(__file__)
KEYS = [f"train/metric_{i}" for i in range(100)]
WEIGHTS = [1.0 + i / 100 for i in range(100)]
PHASE_KEY = "phase/{}"  # the dict-logging peers' 4 more scalars: a phase's duration in seconds
ARMS = ["bare", "floor", "rankscope", "rankscope-grpc", "otel", "otel-step"]
ARMS += ["wandb", "tensorboard", "torchtitan", "csv"]
OURS = ("rankscope", "rankscope-grpc")
"""rankscope as it sends to the job's own sink (OTLP/HTTP, the default without an endpoint), and as it
sends to a Collector's OTLP/gRPC port (``endpoint=``, the default protocol)."""
NOT_PEERS = {"bare", "floor", *OURS}
PER_STEP = {*OURS, "otel-step", "wandb", "tensorboard", "torchtitan", "csv"}
"""The arms that keep a per-step record of all 100 keys and 4 phases (``otel`` folds steps into histograms)."""
BUDGETS = {"floor": 2.0, "cheapest peer": 0.5, "process": 1.0}
"""Issue 43's ratios: inside the calls <= 2 x the floor's (1.5 x the aim) and <= 0.5 x the cheapest
per-step peer's; the whole process's CPU <= every per-step peer's (each ratio's median and IQR)."""
FLOOR_AIM = 1.5


# ---------------------------------------------------------------- the arms (in a child)


class Arm:
    """One arm's logging calls; the loop times each. ``around``: ``enter`` is called before a phase's compute."""

    around = False

    def __init__(self, phases: Sequence[str]) -> None:
        self.phases = list(phases)
        self.pairs = list(zip(KEYS, WEIGHTS, strict=True))
        self.marks: list[float] = []

    def begin(self, step: int) -> None:
        """Before the step's first phase."""

    def enter(self, phase: str) -> None:
        """Before a phase's compute (only when ``around``)."""

    def exit(self, phase: str) -> None:
        """After a phase's compute."""

    def end(self, step: int, loss: float) -> None:
        """The step's 100 scalars and its flush or log."""

    def flush(self) -> bool:
        """Until what was recorded is written or sent (inside the measured window)."""
        return True

    def check(self, step: int) -> dict[str, Any] | None:
        """What the arm's output holds of ``step`` (``found``), or None when the receiver holds it."""
        return None

    def close(self) -> None:
        """After the check."""

    def mark(self, phase: str) -> None:
        """The dict-logging peers' ``exit``: a phase boundary, for its duration."""
        self.marks.append(time.perf_counter())

    def values(self, loss: float) -> dict[str, Any]:
        """The step's 100 keys and its 4 phases' durations, as a dict-logging peer logs them."""
        values: dict[str, Any] = {key: loss * weight for key, weight in self.pairs}
        marks = self.marks
        for i, phase in enumerate(self.phases):
            values[PHASE_KEY.format(phase)] = marks[i + 1] - marks[i]
        return values


def found(keys: Sequence[str], phases: Sequence[str], expected: Sequence[str]) -> dict[str, Any]:
    """The data check's answer: how many of the 100 keys and the phases were found, and a few missing."""
    have_keys, have_phases = set(keys), set(phases)
    missing = [k for k in KEYS if k not in have_keys] + [p for p in expected if p not in have_phases]
    return {"keys": len(have_keys & set(KEYS)), "phases": len(have_phases & set(expected)), "missing": missing[:5]}


class RankscopeArm(Arm):
    """rankscope (or the floor, ``rs``): a traced block of phases, 100 ``record_metric``, ``flush``."""

    def __init__(self, phases: Sequence[str], rs: Any) -> None:
        super().__init__(phases)
        self.rs = rs
        self.tracer: Any = None

    def begin(self, step: int) -> None:
        self.tracer = self.rs.Tracer("train").start()

    def exit(self, phase: str) -> None:
        self.tracer.step(phase)

    def end(self, step: int, loss: float) -> None:
        rs = self.rs
        self.tracer.stop()
        for key, weight in self.pairs:
            rs.record_metric(key, loss * weight)
        rs.flush(step)

    def flush(self) -> bool:
        return bool(self.rs.force_flush(60))

    def close(self) -> None:
        self.rs.shutdown()


class FloorArm(RankscopeArm):
    def check(self, step: int) -> dict[str, Any]:
        closed_step, values, blocks = overhead.FLOOR.closed[-1]
        names = [name for _, marks in blocks for name, _ in marks if name] if closed_step == step else []
        return found(list(values) if closed_step == step else [], names, self.phases)


class OtelArm(Arm):
    """The OpenTelemetry SDK as its docs show it (with ``step_attribute``: the step on every point and span)."""

    around = True

    def __init__(self, phases: Sequence[str], endpoint: str, step_attribute: bool) -> None:
        super().__init__(phases)
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": "bench-peers"})
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint, insecure=True))
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
        meter = self.meter_provider.get_meter("bench-peers")
        self.tracer = self.tracer_provider.get_tracer("bench-peers")
        self.histograms = [(meter.create_histogram(key), weight) for key, weight in self.pairs]
        self.step_attribute = step_attribute
        self.attributes: dict[str, int] | None = None
        self.span: Any = None

    def begin(self, step: int) -> None:
        if self.step_attribute:
            self.attributes = {"step": step}

    def enter(self, phase: str) -> None:
        self.span = self.tracer.start_as_current_span(phase, attributes=self.attributes)
        self.span.__enter__()

    def exit(self, phase: str) -> None:
        self.span.__exit__(None, None, None)

    def end(self, step: int, loss: float) -> None:
        attributes = self.attributes
        for histogram, weight in self.histograms:
            histogram.record(loss * weight, attributes)

    def flush(self) -> bool:
        metrics = self.meter_provider.force_flush(60_000)
        return bool(self.tracer_provider.force_flush(60_000) and metrics)

    def close(self) -> None:
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()


class WandbArm(Arm):
    """``wandb.log`` offline: one call a step, the 100 keys and the 4 phase durations."""

    def __init__(self, phases: Sequence[str], directory: str) -> None:
        super().__init__(phases)
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            os.environ[name] = directory  # nothing written outside the child's temporary directory
        os.environ["WANDB_SILENT"] = "true"
        import wandb

        self.directory = directory
        self.run = wandb.init(
            project="bench-peers",
            dir=directory,
            mode="offline",
            settings=wandb.Settings(x_disable_stats=True, console="off"),
        )

    def begin(self, step: int) -> None:
        self.marks = [time.perf_counter()]

    exit = Arm.mark

    def end(self, step: int, loss: float) -> None:
        self.run.log(self.values(loss), step=step)

    def flush(self) -> bool:
        """``wandb-core`` writes the file: until its CPU clock stops moving (W&B has no flush short of ``finish``)."""
        return wait_quiet()

    def check(self, step: int) -> dict[str, Any]:
        sys.path.insert(0, overhead.ROOT)
        wandb_file = importlib.import_module("tests.wandb_file")  # the tests' reader of W&B's offline files

        self.run.finish()
        rows = [row for path in wandb_file.run_files(Path(self.directory)) for row in wandb_file.history(path)]
        last: dict[str, Any] = next((row for row in rows if row.get("_step") == step), {})
        return found(list(last), [k.removeprefix("phase/") for k in last], self.phases)


class TensorBoardArm(Arm):
    """``SummaryWriter.add_scalar`` for each key and each phase's duration."""

    def __init__(self, phases: Sequence[str], directory: str) -> None:
        super().__init__(phases)
        from torch.utils.tensorboard import SummaryWriter

        self.directory = directory
        self.writer = SummaryWriter(log_dir=directory)
        self.phase_keys = [PHASE_KEY.format(phase) for phase in phases]

    def begin(self, step: int) -> None:
        self.marks = [time.perf_counter()]

    exit = Arm.mark

    def end(self, step: int, loss: float) -> None:
        writer = self.writer
        for key, weight in self.pairs:
            writer.add_scalar(key, loss * weight, step)
        marks = self.marks
        for i, key in enumerate(self.phase_keys):
            writer.add_scalar(key, marks[i + 1] - marks[i], step)

    def flush(self) -> bool:
        self.writer.flush()
        return True

    def check(self, step: int) -> dict[str, Any]:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        self.writer.close()
        events = EventAccumulator(self.directory, size_guidance={"scalars": 0})
        events.Reload()
        tags = [tag for tag in events.Tags()["scalars"] if any(e.step == step for e in events.Scalars(tag))]
        return found(tags, [t.removeprefix("phase/") for t in tags], self.phases)


class TorchtitanArm(Arm):
    """torchtitan's structured logger and its JSONL handler: a span per phase, one ``log_trace_scalar``."""

    around = True

    def __init__(self, phases: Sequence[str], directory: str) -> None:
        super().__init__(phases)
        from torchtitan.observability import structured_logger

        self.sl = structured_logger
        self.directory = directory
        structured_logger.init_structured_logger(source="trainer", output_dir=directory, rank=0)
        self.span: Any = None

    def begin(self, step: int) -> None:
        self.sl.set_step(step)

    def enter(self, phase: str) -> None:
        self.span = self.sl.log_trace_span(phase)
        self.span.__enter__()

    def exit(self, phase: str) -> None:
        self.span.__exit__(None, None, None)

    def end(self, step: int, loss: float) -> None:
        self.sl.log_trace_scalar({key: loss * weight for key, weight in self.pairs})

    def flush(self) -> bool:
        import logging

        for handler in logging.getLogger("torchtitan.structured_logger").handlers:
            handler.flush()  # its FileHandler flushes every record already
        return True

    def check(self, step: int) -> dict[str, Any]:
        records = []
        for path in Path(self.directory).rglob("*.jsonl"):
            records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        mine = [r for r in records if r.get("step") == step]
        keys = [r["event_name"] for r in mine if r.get("log_type_name") == "metric_value" and "value" in r]
        ends = [r["log_type_name"].removesuffix("_end") for r in mine if str(r.get("log_type_name")).endswith("_end")]
        return found(keys, [p for p in ends if any(r.get("value") is not None for r in mine)], self.phases)


class CsvArm(Arm):
    """Lightning's ``CSVLogger``: ``log_metrics`` and ``save`` each step, as Lightning's trainer calls them."""

    def __init__(self, phases: Sequence[str], directory: str) -> None:
        super().__init__(phases)
        from lightning.pytorch.loggers import CSVLogger

        self.logger = CSVLogger(save_dir=directory, name="bench-peers")

    def begin(self, step: int) -> None:
        self.marks = [time.perf_counter()]

    exit = Arm.mark

    def end(self, step: int, loss: float) -> None:
        self.logger.log_metrics(self.values(loss), step=step)
        self.logger.save()

    def flush(self) -> bool:
        self.logger.finalize("success")
        return True

    def check(self, step: int) -> dict[str, Any]:
        path = Path(self.logger.log_dir) / "metrics.csv"
        with path.open(newline="") as file:
            row = next((r for r in csv.DictReader(file) if r.get("step") == str(step)), {})
        keys = [k for k, v in row.items() if v not in ("", None)]
        return found(keys, [k.removeprefix("phase/") for k in keys], self.phases)


def make_arm(name: str, phases: Sequence[str], endpoint: str, directory: str, src: str | None) -> Arm | None:
    if name == "bare":
        return None
    if name == "floor":
        return FloorArm(phases, overhead.floor_module())
    if name in OURS:
        if src is not None:  # --before: another checkout's rankscope
            sys.path.insert(0, src)
        import rankscope

        os.environ.setdefault("RANKSCOPE_CONSOLE", "off")
        protocol = "grpc" if name == "rankscope-grpc" else "http/protobuf"
        rankscope.init(experiment="bench-peers", role="trainer", endpoint=endpoint, protocol=protocol)
        return RankscopeArm(phases, rankscope)
    if name in ("otel", "otel-step"):
        return OtelArm(phases, endpoint, step_attribute=name == "otel-step")
    makers: dict[str, Callable[[Sequence[str], str], Arm]] = {
        "wandb": WandbArm,
        "tensorboard": TensorBoardArm,
        "torchtitan": TorchtitanArm,
        "csv": CsvArm,
    }
    return makers[name](phases, directory)


def helpers_cpu() -> float:
    """CPU seconds of the processes this one started and that still run (W&B's ``wandb-core``)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def wait_quiet(seconds: float = 30.0) -> bool:
    """Until the helper processes' CPU clocks stop moving for 0.3 s (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    last = helpers_cpu()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = helpers_cpu()
        if now - last < 0.005:
            return True
        last = now
    return False


def run_arm_steps(a: Any, reps: int, phases: Sequence[str], first: int, steps: int, arm: Arm | None) -> Steps:
    """``steps`` steps of ``phases`` of matmuls, the arm's calls between them, each call timed on the thread clock.

    The bare loop (``arm`` None) reads the clocks around the same sections, empty.
    """
    clock, wall = time.thread_time_ns, time.perf_counter_ns
    begin = arm.begin if arm is not None else None
    enter = arm.enter if arm is not None and arm.around else None
    leave = arm.exit if arm is not None else None
    end = arm.end if arm is not None else None
    out = Steps()
    cpu_marks, wall_marks = out.cpu, out.wall
    for step in range(first, first + steps):
        wall_marks.append(wall())
        t0 = clock()
        cpu_marks.append(t0)
        if begin is not None:
            begin(step)
        out.inside += clock() - t0
        for phase in phases:
            t0 = clock()
            if enter is not None:
                enter(phase)
            out.inside += clock() - t0
            for _ in range(reps):
                a @ a
            t0 = clock()
            if leave is not None:
                leave(phase)
            out.inside += clock() - t0
        t0 = clock()
        if end is not None:
            end(step, 1.0 / (step + 1))
        out.inside += clock() - t0
    wall_marks.append(wall())
    cpu_marks.append(clock())
    out.cpu = [b - a for a, b in itertools.pairwise(cpu_marks)]
    out.wall = [b - a for a, b in itertools.pairwise(wall_marks)]
    return out


def arm_main(name: str, endpoint: str, reps: int, phases: int, steps: int, warmup: int, src: str | None) -> None:
    """One arm's measured loop in this fresh process; prints one JSON line."""
    a = overhead._matrix("cpu")
    names = [f"phase_{i}" for i in range(phases)]
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as directory:
        arm = make_arm(name, names, endpoint, directory, src)
        run_arm_steps(a, reps, names, 0, warmup, arm)
        flushed = arm.flush() if arm is not None else True

        helpers0, process0 = helpers_cpu(), time.process_time()
        wall0, caller0 = time.perf_counter(), time.thread_time()
        measured = run_arm_steps(a, reps, names, warmup, steps, arm)
        wall1, caller1 = time.perf_counter(), time.thread_time()
        if arm is not None:  # what the measured steps recorded is theirs to write or send
            flushed = arm.flush() and flushed
        process1, helpers1 = time.process_time(), helpers_cpu()

        data = arm.check(warmup + steps - 1) if arm is not None else None
        result = {
            "arm": name,
            "steps": steps,
            "wall_s": wall1 - wall0,
            "caller_cpu_s": caller1 - caller0,
            "inside_cpu_s": measured.inside / 1e9,
            "process_cpu_s": process1 - process0 + helpers1 - helpers0,
            "helpers_cpu_s": helpers1 - helpers0,
            "flushed": flushed,
            "data": data,
        }
        print(RESULT + json.dumps(result), flush=True)
        if arm is not None:
            arm.close()


# ---------------------------------------------------------------- the receiver (its own process)


def _step_of(attributes: Any) -> int | None:
    for kv in attributes:
        if kv.key in ("rankscope.step", "step"):
            return int(kv.value.int_value)
    return None


def summarize(requests: Sequence[tuple[str, bytes]], step: int) -> dict[str, Any]:
    """What the requests since the last collection hold: the metric and span names with ``step``'s
    attribute, each unstepped histogram's count (the SDK's are cumulative: the largest), spans per name."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    at_step: set[str] = set()
    counts: dict[str, int] = {}
    spans: collections.Counter[str] = collections.Counter()
    spans_at_step: set[str] = set()
    for kind, body in requests:
        if kind == "metrics":
            metrics = ExportMetricsServiceRequest.FromString(body)
            for resource in metrics.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        shape = metric.WhichOneof("data")
                        for point in getattr(metric, shape).data_points:
                            point_step = _step_of(point.attributes)
                            if point_step == step:
                                at_step.add(metric.name)
                            elif point_step is None and shape == "histogram":
                                counts[metric.name] = max(counts.get(metric.name, 0), int(point.count))
        elif kind == "traces":
            traces = ExportTraceServiceRequest.FromString(body)
            for resource_spans in traces.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        spans[span.name] += 1
                        if _step_of(span.attributes) == step:
                            spans_at_step.add(span.name)
    return {"at_step": sorted(at_step), "counts": counts, "spans": dict(spans), "spans_at_step": sorted(spans_at_step)}


def receiver_main(max_seconds: float) -> None:
    """``bench_overhead``'s null OTLP/gRPC receiver, keeping the requests' bytes (cheap while a child runs).

    Each ``collect STEP`` line on stdin decodes what came since the last one and prints a summary
    (``summarize``) while no child runs; closing stdin ends it.
    """
    from concurrent import futures

    import grpc

    lock = threading.Lock()
    counts = {kind: [0, 0] for kind in overhead.OTLP_SERVICES}  # requests, bytes
    kept: list[tuple[str, bytes]] = []

    def export(kind: str, request: bytes) -> None:
        with lock:
            counts[kind][0] += 1
            counts[kind][1] += len(request)
            kept.append((kind, request))

    def handler(kind: str) -> grpc.RpcMethodHandler:
        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            export(kind, request)
            return b""  # an empty Export*ServiceResponse

        return grpc.unary_unary_rpc_method_handler(answer)  # no (de)serializers: raw bytes

    # otel-step's cumulative export of every step's series passes gRPC's (and a Collector's) 4 MiB default
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.max_receive_message_length", 1 << 28)]
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(name, {"Export": handler(kind)})
            for kind, name in overhead.OTLP_SERVICES.items()
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    http_server = _http_receiver(lambda kind, body: export(kind, body))
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    cpu0 = time.process_time()
    watchdog = threading.Timer(max_seconds, lambda: os._exit(3))  # bounded even if stdin never closes
    watchdog.daemon = True
    watchdog.start()
    print(f"127.0.0.1:{port} http://127.0.0.1:{http_server.server_address[1]}", flush=True)
    while line := sys.stdin.readline():
        with lock:
            taken = kept[:]
            kept.clear()
        print(RESULT + json.dumps(summarize(taken, int(line.split()[1]))), flush=True)
    server.stop(None)
    http_server.shutdown()
    print(RESULT + json.dumps({"counts": counts, "cpu_s": time.process_time() - cpu0}), flush=True)


def _http_receiver(export: Callable[[str, bytes], None]) -> Any:
    """The same null receiver over OTLP/HTTP (``/v1/metrics``, ``/v1/traces``, ``/v1/logs``), kept-alive
    connections, an empty 200 answer: the standard library's server (its CPU is this process's, not the job's)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    kinds = {"/v1/metrics": "metrics", "/v1/traces": "traces", "/v1/logs": "logs"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            kind = kinds.get(self.path)
            if kind is not None:
                export(kind, body)
            self.send_response(200 if kind is not None else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # the base class's name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


class PeerReceiver(Receiver):
    """The receiver above, in its own process; ``collect`` asks it what the last child sent."""

    def __init__(self, max_seconds: float) -> None:
        super().__init__(max_seconds, script=HERE)
        self.endpoint, self.http_endpoint = self.endpoint.split()

    def collect(self, step: int) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(f"collect {step}\n")
        stdin.flush()
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(120)
        if not answer or not answer[0].startswith(RESULT):
            raise RuntimeError("the OTLP receiver did not answer a collection in 120 s")
        return dict(json.loads(answer[0][len(RESULT) :]))


def received(arm: str, summary: Mapping[str, Any], steps: int, phases: Sequence[str]) -> dict[str, Any]:
    """The data check of an arm that sends to the receiver, from what it decoded (``steps``: warm-up included)."""
    if arm == "otel":  # no step on the wire: every step's value in each histogram, a span per phase and step
        counts, spans = summary["counts"], summary["spans"]
        return found([k for k in KEYS if counts.get(k) == steps], [p for p in phases if spans.get(p) == steps], phases)
    names = list(summary["at_step"]) + list(summary["spans_at_step"])
    # rankscope's phase durations: train/{phase}/duration_avg_s and the like; otel-step's: spans named by phase
    return found(names, [part for name in names for part in name.split("/")], phases)


# ---------------------------------------------------------------- the benchmark (parent)


def data_line(arm: str, results: Sequence[Mapping[str, Any]], phases: int) -> str:
    """``ok`` when every child of the arm held the last step's 100 keys and ``phases`` phases."""
    if arm == "bare":
        return "n/a"
    bad = [r["data"] for r in results if r["data"] is None or r["data"]["keys"] != 100 or r["data"]["phases"] != phases]
    if not bad:
        return "ok"
    return f"FAILED in {len(bad)}/{len(results)} children, the first: {bad[0]}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pairs", type=int, default=5, help="rounds of interleaved children (default 5)")
    parser.add_argument("--steps", type=int, default=150, help="measured steps per child (default 150)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured steps per child first (default 20)")
    parser.add_argument("--step-ms", type=float, default=20.0, help="target CPU time of a step (default 20)")
    parser.add_argument(
        "--arms",
        default=",".join(ARMS[1:]),
        help=f"comma-separated arms besides the bare loop (default: all: {','.join(ARMS[1:])})",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 30 steps, 5 warm-up")
    parser.add_argument(
        "--before",
        type=Path,
        help="another checkout (e.g. a git worktree of an earlier commit): its rankscope in the same rounds",
    )
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["receiver", *ARMS], help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--phases", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--max-seconds", type=float, default=3600, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.steps, args.warmup = 2, 30, 5
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}: choose from {ARMS}")
    args.arm_list = ["bare"] + [a for a in ARMS if a in arms and a != "bare"]
    if args.before is not None and not set(OURS) & set(args.arm_list):
        parser.error("--before measures rankscope: keep a rankscope arm")
    if args.pairs < 1 or args.steps < 1 or args.warmup < 1 or args.step_ms <= 0:
        parser.error("--pairs, --steps, --warmup and --step-ms must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child == "receiver":
        receiver_main(args.max_seconds)
    elif args.child is not None:
        arm_main(args.child, args.endpoint, args.reps, args.phases, args.steps, args.warmup, args.src)
    else:
        sys.exit(benchmark(args))


def benchmark(args: argparse.Namespace) -> int:
    """Calibrate once, start the receiver, run the rounds of children, print the report; 1 when a data check failed."""
    arms: list[str] = list(args.arm_list)
    if args.before is not None:
        for ours in reversed([a for a in arms if a in OURS]):
            arms.insert(arms.index(ours) + 1, ours + BEFORE)
    load_before = os.getloadavg()
    calibration = run_child(["--child", "calibrate", "--step-ms", str(args.step_ms), "--phases", str(args.phases)], 120)
    reps = int(calibration["reps"])
    expected_step_s = reps * args.phases * float(calibration["matmul_ms"]) / 1000
    # A child: interpreter + imports (Lightning's, W&B's start: seconds on a busy box), its steps, a flush.
    child_timeout = 180 + 5 * (args.steps + args.warmup) * expected_step_s
    last, total = args.warmup + args.steps - 1, args.warmup + args.steps
    phases = [f"phase_{i}" for i in range(args.phases)]
    receiver = PeerReceiver(max_seconds=60 + args.pairs * len(arms) * child_timeout)
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    try:
        for round_index in range(args.pairs):
            order = arms if round_index % 2 == 0 else arms[::-1]
            for arm in order:
                command = ["--child", arm.removesuffix(BEFORE), "--reps", str(reps), "--phases", str(args.phases)]
                if arm.endswith(BEFORE):
                    command += ["--src", str(args.before / "src")]
                endpoint = receiver.http_endpoint if arm.removesuffix(BEFORE) == "rankscope" else receiver.endpoint
                command += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--endpoint", endpoint]
                result = run_child(command, child_timeout, script=HERE)
                summary = receiver.collect(last)  # also clears what this child sent
                if arm.removesuffix(BEFORE) in (*OURS, "otel", "otel-step"):
                    result["data"] = received(arm.removesuffix(BEFORE), summary, total, phases)
                results[arm].append(result)
            line = ", ".join(f"{a} {1000 * float(results[a][-1]['wall_s']) / args.steps:.2f}" for a in order)
            print(f"round {round_index + 1}/{args.pairs}: ms/step {line}", file=sys.stderr, flush=True)
    finally:
        receiver.close()
    load_after = os.getloadavg()
    return report(args, arms, results, calibration, (load_before[0], load_after[0]))


Result = Mapping[str, Any]


def per_step(r: Result, key: str) -> float:
    return float(r[key]) / int(r["steps"])


def beyond(arm: Sequence[Result], bare: Sequence[Result], key: str) -> list[float]:
    """Per round: the arm's ``key`` per step minus the bare loop's of the same round (seconds)."""
    return [per_step(i, key) - per_step(b, key) for i, b in zip(arm, bare, strict=True)]


def direct_cost(arm: Sequence[Result], bare: Sequence[Result]) -> list[float]:
    """Per round: the arm's whole-process CPU per step read directly, not as the difference of two
    processes' totals: the training thread's CPU inside its calls, plus every other thread and helper
    process (``process - caller``), less the bare loop's other threads of the same round. It leaves out
    what the calls cost the loop's own compute after them (caches), which the difference counts; it
    swings by far less, so it settles a budget the difference cannot on a small box."""
    return [
        per_step(i, "inside_cpu_s")
        + (per_step(i, "process_cpu_s") - per_step(i, "caller_cpu_s"))
        - (per_step(b, "process_cpu_s") - per_step(b, "caller_cpu_s"))
        for i, b in zip(arm, bare, strict=True)
    ]


def ratio(xs: Sequence[float], ys: Sequence[float]) -> str:
    """``xs`` over ``ys``: the median [IQR] of the rounds' ratios, or, when a round's ``ys`` is not above
    zero (the box's noise on a figure near the bare loop's), the ratio of the medians ("of medians")."""
    if all(y > 0 for y in ys):
        return cell([x / y for x, y in zip(xs, ys, strict=True)], 1, 2)
    median = quartiles(ys)[1]
    return f"{quartiles(xs)[1] / median:.2f} of medians" if median > 0 else "n/a"


def judge(
    ours: str, figure: str, theirs: str, mine: Sequence[float], their: Sequence[float], budget: float, ok: bool
) -> str:
    """``ours``'s ``figure`` <= ``budget`` x ``theirs``'s, judged per round on the margin ``mine - budget x their``
    (no division: a figure near zero cannot swing it) by its median and IQR over rounds, as ``bench_overhead``
    judges its budgets; the ratio is printed beside it."""
    q1, median, q3 = quartiles([m - budget * t for m, t in zip(mine, their, strict=True)])
    if not ok:
        judgement = f"NOT MET: {ours}'s data check failed"
    elif q3 <= 0:
        judgement = "HOLDS (the whole IQR is within it)"
    elif q1 > 0:
        judgement = "NOT MET (the whole IQR is above it)"
    else:
        judgement = "INCONCLUSIVE on this run (the IQR straddles it: more --pairs or a quieter box)"
    margin = f"{1e6 * median:+.0f} us/step [IQR {1e6 * q1:+.0f}, {1e6 * q3:+.0f}]"
    return (
        f"{ours}'s {figure} <= {budget:g} x {theirs}'s: {ratio(mine, their)} x; {ours} - {budget:g} x {theirs}: "
        f"{margin} over {len(mine)} rounds: {judgement}"
    )


def report(
    args: argparse.Namespace,
    arms: Sequence[str],
    results: Mapping[str, Sequence[Result]],
    calibration: Mapping[str, Any],
    load: tuple[float, float],
) -> int:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def v(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "?"

    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {calibration['torch']}, rankscope {v('rankscope')}, opentelemetry-sdk {v('opentelemetry-sdk')}, "
        f"wandb {v('wandb')}, tensorboard {v('tensorboard')}, torchtitan {v('torchtitan')}, lightning {v('lightning')}"
    )
    print(f"load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f}")
    print(
        f"step: {args.phases} phases x {calibration['reps']} matmuls {overhead.MATRIX}x{overhead.MATRIX} (1 thread, "
        f"{calibration['matmul_ms']:.2f} ms each, calibrated for ~{args.step_ms:g} ms), 100 scalar keys and the "
        f"arm's flush or log; {args.steps} measured steps per child after {args.warmup} warm-up; {args.pairs} "
        "rounds, each a fresh process per arm, order alternating"
    )
    bare = results["bare"]
    measured = [a for a in arms if a != "bare"]
    inside = {a: beyond(results[a], bare, "inside_cpu_s") for a in measured}
    process = {a: beyond(results[a], bare, "process_cpu_s") for a in measured}
    direct = {a: direct_cost(results[a], bare) for a in measured}
    thread = {a: beyond(results[a], bare, "caller_cpu_s") for a in measured}
    data = {a: data_line(a, results[a], args.phases) for a in arms}
    ours = "rankscope" if "rankscope" in measured else None

    def vs_ours(figures: Mapping[str, list[float]], arm: str) -> str:
        return "n/a" if ours is None else ratio(figures[arm], figures[ours])

    rows: list[tuple[str, Sequence[str]]] = []
    for arm in measured:
        helpers = [per_step(r, "helpers_cpu_s") for r in results[arm]]
        rows.append(
            (
                arm,
                [
                    cell(inside[arm], 1e6),
                    vs_ours(inside, arm),
                    cell(process[arm], 1e6),
                    vs_ours(process, arm),
                    cell(direct[arm], 1e6),
                    vs_ours(direct, arm),
                    cell(helpers, 1e6) if any(helpers) else "0",
                    cell(thread[arm], 1e6),
                    "not a peer" if arm == "floor" else "yes" if arm.removesuffix(BEFORE) in PER_STEP else "no",
                    data[arm] if data[arm] in ("ok", "n/a") else "FAILED",
                ],
            )
        )
    print()
    print(
        "each arm's child against the bare loop's child of its round, median [IQR] over rounds; "
        "/ rankscope: the arm's figure over rankscope's, per round"
    )
    columns = ["inside the calls (us/step)", "/ rankscope", "process CPU (us/step)", "/ rankscope"]
    columns += ["calls + other threads (us/step)", "/ rankscope"]
    columns += ["of which other processes", "training thread (us/step)", "per-step record", "data"]
    print_table("arm", columns, rows)
    for arm in measured:
        notes = {"its flush timed out" for r in results[arm] if not r["flushed"]}
        notes |= {"stderr: " + r["stderr"].splitlines()[-1][:200] for r in results[arm] if r["stderr"]}
        for note in sorted(notes):
            print(f"note ({arm}): {note}")
    failed = [a for a in arms if data[a] not in ("ok", "n/a")]
    for arm in failed:
        print(f"DATA CHECK FAILED ({arm}): {data[arm]}")
    for rankscope in [a for a in measured if a.removesuffix(BEFORE) in OURS]:
        print()
        for line in budget_lines(rankscope, measured, inside, process, direct, data):
            print(line)
    return 1 if failed else 0


def budget_lines(
    ours: str,
    measured: Sequence[str],
    inside: Mapping[str, list[float]],
    process: Mapping[str, list[float]],
    direct: Mapping[str, list[float]],
    data: Mapping[str, str],
) -> list[str]:
    """Issue 43's budgets for ``ours`` (rankscope, or its ``--before`` checkout), each judged over the rounds."""
    ok = data[ours] == "ok"
    inside_calls = "training thread inside its calls"
    lines = []
    if "floor" in measured:
        lines.append(judge(ours, inside_calls, "floor", inside[ours], inside["floor"], BUDGETS["floor"], ok))
        aim = judge(ours, inside_calls, "floor", inside[ours], inside["floor"], FLOOR_AIM, ok)
        lines.append(f"  (the aim) {aim}")
    peers = [a for a in measured if a in PER_STEP and a not in NOT_PEERS and data[a] == "ok"]
    if peers:
        cheapest = min(peers, key=lambda a: quartiles(inside[a])[1])
        lines.append(f"the cheapest per-step peer inside its calls: {cheapest}")
        budget = BUDGETS["cheapest peer"]
        lines.append(judge(ours, inside_calls, cheapest, inside[ours], inside[cheapest], budget, ok))
        for peer in peers:
            read = "whole-process CPU (calls + other threads)"
            lines.append(judge(ours, read, peer, direct[ours], direct[peer], BUDGETS["process"], ok))
            differenced = judge(ours, "whole-process CPU", peer, process[ours], process[peer], BUDGETS["process"], ok)
            lines.append(f"  (cross-check, two processes' totals differenced: noisier) {differenced}")
    skipped = [a for a in measured if a not in NOT_PEERS and not a.endswith(BEFORE) and a not in peers]
    if skipped:
        why = {a: "no per-step record" if a not in PER_STEP else "its data check failed" for a in skipped}
        lines.append("not compared: " + ", ".join(f"{a} ({reason})" for a, reason in why.items()))
    return lines


if __name__ == "__main__":
    main()
