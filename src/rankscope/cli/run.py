"""``rankscope run``: run a command with a sink of its own, and forward its exit code."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..core.paths import shown_path
from ..core.settings import resolve
from .sink import add_server_options, sink_config


def add_parser(commands: Any) -> None:
    p = commands.add_parser("run", help="run a command with its own sink: rankscope run -- python train.py")
    add_server_options(p, "run", None, None)
    p.add_argument("--gantt", help="after the command, write its spans as a Perfetto file here")
    p.add_argument(
        "--no-keep",
        action="store_true",
        help="do not keep the run on disk (its report and JSONL in rankscope_logs/EXPERIMENT/RUN/, "
        "kept by default: RANKSCOPE_KEEP)",
    )
    p.add_argument(
        "--instrument",
        action="store_true",
        help="auto-instrument every Python process of the command, as opentelemetry-instrument does",
    )
    p.add_argument("command_line", nargs=argparse.REMAINDER, help="-- command [args...]")
    p.set_defaults(fn=command)


def command(args: argparse.Namespace) -> int:
    """Start a sink, run the command with the experiment's environment, forward its exit code; then
    finalize, and write the Gantt and the report of every run the command's processes reported."""
    from ..core.identity import detect_run, experiment_from_command, generate_run_id
    from ..sink import Sink
    from ..sink.embedded import announce, withdraw

    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if not command:
        print("rankscope run: give a command, e.g. rankscope run -- python train.py", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("rankscope.sink").setLevel(logging.INFO)  # "new experiment ...: where its views write"
    args.grpc_port = args.grpc_port if args.grpc_port is not None else 0
    args.http_port = args.http_port if args.http_port is not None else 0
    spans_tmp = None
    if args.gantt and not args.spans_dir:  # the whole run's spans, not only the last steps kept in memory
        spans_tmp = tempfile.TemporaryDirectory(prefix="rankscope-spans-")
        args.spans_dir = spans_tmp.name
    try:
        config = sink_config(args)
    except ValueError as exc:
        print(f"rankscope run: {exc}", file=sys.stderr)
        return 2
    sink = Sink(config).start()
    control = f"http://{_local(args.host)}:{sink.http_port}"
    announced = announce(sink.endpoint, control, command)  # `rankscope top` and `report` find it
    # The experiment unless the code names its own: the command's entry script (train for train.py).
    experiment = resolve("experiment") or experiment_from_command(command)
    run = resolve("run") or detect_run(os.environ) or generate_run_id()  # the command is one launch
    env = dict(os.environ)
    env.update(
        RANKSCOPE_EXPERIMENT=experiment,
        RANKSCOPE_RUN_ID=run,
        # OTLP/HTTP to the control port, on one kept-alive connection: ~0.45 ms of CPU a request against
        # gRPC's ~1.3 (``export.kept_alive``); a script's own ``protocol="grpc"`` does not apply to it
        RANKSCOPE_ENDPOINT=control,
        RANKSCOPE_SINK_CONTROL=control,
    )
    if args.instrument:
        env.update(auto_instrumentation_env(env))
    fixed = config.backends
    if fixed is not None and not any(str(v.get("backend", k)) == "console" for k, v in fixed.items()):
        env["RANKSCOPE_CONSOLE"] = "off"  # no console prints the steps here: a framework's own printing stays
    _say(f"sink on HTTP {control} (the command's OTLP/HTTP, status) and OTLP/gRPC {sink.endpoint}")
    _say(f"watch it: rankscope top --sink {control}")
    if config.added_views:
        _say(f"its report now: rankscope report --sink {control}")
    try:
        code = _run(command, env)
        if code is None:
            return 127
        sink.finalize()
        reported = _reported_runs(sink)
        if not reported:
            _say("the command reported no metrics to this sink (no rankscope calls, or RANKSCOPE_DISABLE)")
        if args.gantt:
            _write_gantts(sink, reported, args.gantt)
        if config.added_views:
            _write_reports(sink, reported)
        return code if code >= 0 else 128 - code
    finally:
        sink.stop()
        withdraw(announced)
        if spans_tmp is not None:
            spans_tmp.cleanup()


def _say(line: str) -> None:
    print(f"rankscope run: {line}", file=sys.stderr, flush=True)


def _local(host: str) -> str:
    """Where a process on this machine reaches a sink bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _run(command: list[str], env: dict[str, str]) -> int | None:
    """The command's exit code (None: it could not start)."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        print(f"rankscope run: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return None
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:  # the child got the same SIGINT; wait for it to finish
            continue


def _reported_runs(sink: Any) -> list[tuple[str, str]]:
    """Every (experiment, run) the command's processes reported, named in code or not: what the
    Gantt and the report follow."""
    listed = sink.overview().get("experiment_list") or []
    return [(str(e["id"]), str(e.get("run") or "")) for e in listed if e.get("id") is not None]


def _write_gantts(sink: Any, reported: list[tuple[str, str]], path: str) -> None:
    """One Perfetto file per run: ``path`` for the only one, else ``path`` with the run in its name."""
    from ..core.paths import safe_component
    from ..report import perfetto

    for experiment, run in reported:
        out = Path(path)
        if len(reported) > 1:  # names never become paths: their safe components do
            out = out.with_name(f"{out.stem}.{safe_component(experiment)}.{safe_component(run or 'run')}{out.suffix}")
        rows = (json.loads(line) for line in sink.span_rows(experiment, run=run or None) or ())
        written = perfetto.write(rows, out)
        status = sink.status(experiment, run or None) or {}
        capped = (status.get("span_file") or {}).get("not_saved", 0)
        _say(
            f"{_named(experiment, run)}: Gantt of {written.spans} spans, {written.processes} processes -> {out}"
            + (f" ({capped} spans past the span file's cap are not in it)" if capped else "")
        )


def _write_reports(sink: Any, reported: list[tuple[str, str]]) -> None:
    """Each run's report page, and the command that rebuilds it with the experiment's other runs."""
    experiments: dict[str, Path] = {}
    for experiment, run in reported:
        answer = sink.report(experiment, run=run or None)
        if isinstance(answer, str):
            _say(f"{_named(experiment, run)}: no report: {answer}")
            continue
        for page in map(shown_path, answer):
            print(f"report: {page}" + (f"  ({_named(experiment, run)})" if len(reported) > 1 else ""), flush=True)
            experiments.setdefault(experiment, page.parent.parent if run else page.parent)
    for experiment, directory in experiments.items():
        _say(f"every run of {experiment!r}: rankscope report {directory}/")


def _named(experiment: str, run: str) -> str:
    return f"experiment {experiment!r}" + (f", run {run}" if run else "")


def auto_instrumentation_env(env: dict[str, str]) -> dict[str, str]:
    """What ``opentelemetry-instrument`` sets: its ``sitecustomize`` first on PYTHONPATH (so every
    Python process of the command loads the distro and the instrumentors), rankscope's distro."""
    from opentelemetry.instrumentation import auto_instrumentation

    here = os.path.dirname(os.path.abspath(auto_instrumentation.__file__))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return {
        "PYTHONPATH": os.pathsep.join([here, os.getcwd(), *paths]),
        "OTEL_PYTHON_DISTRO": env.get("OTEL_PYTHON_DISTRO", "rankscope"),
        "OTEL_PYTHON_CONFIGURATOR": env.get("OTEL_PYTHON_CONFIGURATOR", "rankscope"),
    }
