"""``rankscope sink``: run the OTLP sink; its options are shared with ``rankscope run``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ..core.settings import resolve


def add_parser(commands: Any) -> None:
    p = commands.add_parser("sink", help="run the OTLP sink: per-experiment step alignment, reduction and views")
    add_server_options(p, "sink", 4317, 4318)
    p.add_argument(
        "--trust-posted-paths",
        action="store_true",
        help="use the paths in the views clients post as given (default: relative, without '..')",
    )
    p.add_argument(
        "--tokens",
        metavar="FILE",
        help="scoped tokens, JSON or TOML (RANKSCOPE_SINK_TOKENS): each token writes only the experiments "
        "its scope names or prefixes, and only its scope's runs; teams sharing a sink need them (docs/sink.md)",
    )
    p.set_defaults(fn=command)


def add_server_options(
    p: argparse.ArgumentParser, name: str, grpc_default: int | None, http_default: int | None
) -> None:
    """The options ``rankscope sink`` and ``rankscope run`` share (both run a sink); ``name`` says which."""
    from ..sink.config import JOB_START_HOLD
    from ..sink.durable.wal import default_state_dir

    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, default=grpc_default, help=f"OTLP/gRPC port (default {grpc_default})")
    p.add_argument("--http-port", type=int, default=http_default, help=f"OTLP/HTTP port (default {http_default})")
    p.add_argument(
        "--backends",
        help='views for every experiment as JSON, e.g. \'{"wandb": {"logging_mode": "global_reduce"}}\' '
        "(default: what each experiment's processes ask for, else the console global view)",
    )
    p.add_argument("--grace", type=float, help="seconds to wait for a step's last processes (RANKSCOPE_SINK_GRACE)")
    hold = JOB_START_HOLD if name == "run" else 0.0
    p.add_argument(
        "--start-hold",
        type=float,
        default=hold,
        help="seconds from a run's first data in which a step is final only by its grace, so a process "
        f"that starts a little after the others is in the first step (default {hold:g})",
    )
    p.add_argument("--token", help="bearer token clients must send, for every experiment (RANKSCOPE_SINK_TOKEN)")
    p.add_argument(
        "--state-dir",
        default=str(default_state_dir()) if name == "sink" else None,
        help="write-ahead log: what the sink acknowledged survives a crash "
        + ("(default %(default)s)" if name == "sink" else "(default: none)"),
    )
    p.add_argument("--no-state-dir", action="store_true", help="keep acknowledged data in memory only")
    p.add_argument(
        "--resume-window",
        type=float,
        default=7 * 86400.0,
        help="seconds after a run was last seen during which a launch may resume it (default 7 days)",
    )
    p.add_argument(
        "--spans-dir",
        help="write every run's spans here as they arrive (SPANS_DIR/EXPERIMENT/runs/RUN/spans.jsonl): "
        "the whole run's Gantt" + (" (--gantt: a temporary directory)" if name == "run" else ""),
    )
    p.add_argument(
        "--max-span-file-bytes",
        type=int,
        default=1 << 30,
        help="an experiment's span file stops growing here, and says so (default 1 GiB)",
    )
    p.add_argument(
        "--step-window",
        type=int,
        default=1_000_000,
        help="a step may be at most this far ahead of its run's last finalized step, a new run's "
        "first step this far from 0; further is refused (default 1000000)",
    )
    p.add_argument(
        "--time-bucket",
        type=float,
        default=1.0,
        help="seconds per step of an experiment none of whose processes steps (default 1)",
    )
    p.add_argument(
        "--view-workers",
        type=int,
        default=4,
        help="threads that write every run's views, however many runs are open (default 4)",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="every experiment also gets the report view: one HTML page per run, "
        "rankscope_logs/EXPERIMENT/RUN/report.html" + (", written when the command ends" if name == "run" else ""),
    )


def sink_config(args: argparse.Namespace) -> Any:
    """The ``SinkConfig`` the options say; raises ``ValueError`` for a tokens file that does not load
    and for ``--backends`` that are not JSON views or name a view that cannot be made (a misspelled
    backend, a bad option: ``backends.base.check_views``)."""
    from ..backends.base import check_views
    from ..sink import BookConfig, RunLimits, SinkConfig, Transport
    from ..sink.edge.auth import load_tokens

    try:
        backends = json.loads(args.backends) if args.backends else None
    except ValueError as exc:
        raise ValueError(f"--backends is not JSON: {exc}") from None
    if backends is not None:
        if not isinstance(backends, dict):
            raise ValueError("--backends must be a JSON object of views, e.g. '{\"console\": {}}'")
        check_views(backends)
    tokens_file = getattr(args, "tokens", None)  # a shared sink's: `rankscope run` serves its own job
    if args.command == "sink":
        tokens_file = tokens_file or os.environ.get("RANKSCOPE_SINK_TOKENS")
    try:
        tokens = load_tokens(Path(tokens_file)) if tokens_file else {}
    except OSError as exc:
        raise ValueError(f"{tokens_file}: {exc.strerror or exc}") from None
    return SinkConfig(
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        transport=Transport(
            host=args.host,
            token=args.token or os.environ.get("RANKSCOPE_SINK_TOKEN") or None,
            tokens=tokens,
        ),
        backends=backends,
        book=BookConfig(
            grace=args.grace if args.grace is not None else resolve("sink_grace"),
            start_hold=max(0.0, args.start_hold),
            time_bucket=args.time_bucket,
            step_window=args.step_window,
        ),
        state_dir=None if args.no_state_dir or args.state_dir in (None, "") else Path(args.state_dir),
        spans_dir=Path(args.spans_dir) if args.spans_dir else None,
        max_span_file_bytes=args.max_span_file_bytes,
        view_workers=max(1, args.view_workers),
        resume_window=args.resume_window,
        added_views=_added_views(args),
        trust_posted_paths=args.command == "run" or args.trust_posted_paths,
        runs=RunLimits(close_ended=args.command != "run"),  # `rankscope run` reads its run at the end
    )


def _added_views(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The views every run gets: a job's sink (``rankscope run``) keeps its run unless told not
    to; ``--report`` adds the page."""
    from ..sink.config import KEPT_BACKENDS, REPORT_VIEW

    if args.command == "run" and resolve("keep") and not args.no_keep:
        return KEPT_BACKENDS
    return REPORT_VIEW if args.report else {}


def command(args: argparse.Namespace) -> int:
    from ..sink import Sink
    from ..sink.durable.wal import StateDirBusyError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    # The W&B runs of a sink are its own: a parent's W&B service (inherited through WANDB_SERVICE)
    # would outlive this process if it were killed and hold its runs open ("run ID is in use"), and
    # the restarted sink's W&B view would be off.
    os.environ.pop("WANDB_SERVICE", None)
    try:
        config = sink_config(args)
        sink = Sink(config).start()
    except (StateDirBusyError, OSError, ValueError) as exc:
        print(f"rankscope sink: {exc}", file=sys.stderr)
        return 2
    durable = f"write-ahead log in {config.state_dir}" if config.state_dir else "no write-ahead log (--no-state-dir)"
    print(
        f"rankscope sink: OTLP/gRPC on {args.host}:{sink.grpc_port}, OTLP/HTTP on {args.host}:{sink.http_port}, "
        f"{durable}; status: http://{args.host}:{sink.http_port}/rankscope/v1/status",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("rankscope sink: stopping (finalizing open steps)", file=sys.stderr, flush=True)
    sink.stop()
    return 0


DEFAULT_SINK = "http://127.0.0.1:4318"
"""A ``rankscope sink`` on its default port: where commands look when nothing else says."""


def find_sink(given: str | None) -> str:
    """The HTTP URL of the sink a command (``top``, ``report``, ``capture``, ``gantt``) talks to:
    ``--sink``, else ``RANKSCOPE_SINK_CONTROL`` (inside a ``rankscope run``), else the newest sink
    running on this machine (a ``rankscope run``'s or an embedded one: ``sink.embedded.discover``),
    else ``DEFAULT_SINK``."""
    from ..sink.embedded import discover

    if given:
        return given
    inside = resolve("sink_control")
    if inside:
        return str(inside)
    found = discover()
    return str(found[0]["control"]) if found else DEFAULT_SINK


def sink_experiments(url: str, token: str | None) -> list[dict[str, Any]] | str:
    """The sink's experiments and runs (its status route's ``experiment_list``), or why not."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{url.rstrip('/')}/rankscope/v1/status", headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            listed = json.loads(response.read()).get("experiment_list", [])
    except (OSError, ValueError, AttributeError) as exc:
        return f"no answer from {url} ({exc})"
    return [e for e in listed if isinstance(e, dict) and e.get("id") is not None]


def the_experiment(url: str, token: str | None) -> str:
    """The sink's one experiment, for a command given none; raises ``LookupError`` saying what to give."""
    listed = sink_experiments(url, token)
    if isinstance(listed, str):
        raise LookupError(listed)
    names = sorted({str(e["id"]) for e in listed})
    if len(names) == 1:
        return names[0]
    if not names:
        raise LookupError(f"{url} has no experiment yet")
    shown = ", ".join(repr(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")
    raise LookupError(f"{url} has {len(names)} experiments ({shown}): give --experiment")
