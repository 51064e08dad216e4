"""``rankscope capture``: ask a running experiment's processes to profile their next steps."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..core.settings import resolve
from .sink import find_sink, the_experiment


def add_parser(commands: Any) -> None:
    c = commands.add_parser("capture", help="profile the next steps of a running experiment's processes")
    c.add_argument(
        "--sink",
        help="the sink's HTTP URL (default: the newest `rankscope run` or embedded sink on this machine, "
        "else http://127.0.0.1:4318)",
    )
    c.add_argument("--experiment", help="experiment id (default RANKSCOPE_EXPERIMENT, else the sink's only one)")
    c.add_argument("--ranks", help="rank subset: 3,7 or 0-3 (default: every process)")
    c.add_argument("--steps", type=int, default=2, help="steps to profile (default 2)")
    c.add_argument("--reason", default="asked from a shell", help="why (kept with the files)")
    c.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the files, then print them")
    c.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    c.set_defaults(fn=command)


def command(args: argparse.Namespace) -> int:
    """Ask a running experiment's processes to profile their next steps; with --wait, print the files."""
    import json
    import time
    import urllib.error
    import urllib.parse
    import urllib.request

    from ..sink.book.traces import parse_ranks

    sink = find_sink(args.sink)
    token = args.token or os.environ.get("RANKSCOPE_SINK_TOKEN")
    try:
        experiment = args.experiment or resolve("experiment") or the_experiment(sink, token)
    except LookupError as exc:
        print(f"rankscope capture: {exc}", file=sys.stderr)
        return 2
    ranks = parse_ranks(args.ranks)
    body = {"experiment": experiment, "steps": args.steps, "reason": args.reason, "ranks": sorted(ranks or ()) or None}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    base = sink.rstrip("/")
    request = urllib.request.Request(f"{base}/rankscope/v1/captures", json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            capture = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(
            f"rankscope capture: the sink said {exc.code}: {exc.read()[:300].decode(errors='replace')}", file=sys.stderr
        )
        return 1
    except OSError as exc:
        print(f"rankscope capture: {sink}: {exc}", file=sys.stderr)
        return 1
    who = "every process" if ranks is None else f"ranks {','.join(map(str, sorted(ranks)))}"
    print(f"rankscope capture: {capture['id']}: {who}, next {capture['steps']} steps", file=sys.stderr)
    deadline = time.monotonic() + args.wait
    files: dict[str, str] = {}
    while time.monotonic() < deadline:
        time.sleep(0.5)
        status = urllib.request.Request(
            f"{base}/rankscope/v1/status?experiment={urllib.parse.quote(experiment)}", headers=headers
        )
        try:
            with urllib.request.urlopen(status, timeout=10) as response:
                found = next(
                    (c for c in json.loads(response.read()).get("captures", []) if c["id"] == capture["id"]), None
                )
        except OSError:
            continue
        if found is not None:
            files = found["files"]
            if found["taken"] and len(files) >= found["taken"]:
                break
    for label, path in sorted(files.items()):
        print(f"{label}\t{path}")
    return 0
