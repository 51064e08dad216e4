"""A backend whose init fails turns itself off with one clear error naming the fix; the job goes on.

W&B without an API key and not offline is the common case. Each run is a fresh process with a
home directory of its own (no saved W&B login), so the real ``wandb.init`` fails the way it
does on a new machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ..conftest import run_python

IN_PROCESS = """
import rankscope as rs
rs.init(experiment="no-key", backends={"wandb": {"logging_mode": "per_rank_reduce"}, "console": {"format": "full"}})
for step in range(3):
    rs.record_metric("loss", float(step))
    rs.flush(step)
rs.force_flush(30)
rs.shutdown()
from rankscope.core import errors
print("internal_errors", len(errors.internal_errors))
"""

IN_SINK = """
import json, time
import rankscope as rs
from rankscope.sink import Sink, SinkConfig
sink = Sink(SinkConfig(grpc_port=0, http_port=0, backends={
    "wandb": {"logging_mode": "global_reduce"},
    "jsonl": {"logging_mode": "global_reduce", "path": "JSONL"},
})).start()
rs.init(experiment="no-key", endpoint=sink.endpoint)
for step in range(3):
    rs.record_metric("loss", float(step))
    rs.flush(step)
rs.force_flush(30)
deadline = time.monotonic() + 30
while time.monotonic() < deadline and (sink.status("no-key") or {}).get("last_written_step") != 2:
    time.sleep(0.05)
views = (sink.status("no-key") or {})["views"]
print("views", json.dumps(views, sort_keys=True))
rs.shutdown()
sink.stop()
rows = [json.loads(line) for line in open("JSONL")]
print("loss", [r["value"] for r in rows if r["key"] == "loss"])
print("internal_errors", len(sink.internal_errors))
"""


def _no_wandb_login(home: Path) -> dict[str, str]:
    """A machine where nobody ran ``wandb login``: no key, no netrc, online mode (the test
    removed every ``WANDB_*`` variable from the environment ``run_python`` copies)."""
    return {
        "HOME": str(home),
        "NETRC": str(home / "netrc"),
        "WANDB_CONFIG_DIR": str(home / "wandb-config"),
        "WANDB_DIR": str(home),
        "WANDB_MODE": "online",
    }


def _check_one_clear_error(stderr: str) -> None:
    said = [line for line in stderr.splitlines() if "wandb backend is off" in line]
    assert len(said) == 1, stderr[-3000:]
    assert "WANDB_API_KEY" in said[0] and "WANDB_MODE=offline" in said[0]
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[-3000:]


@pytest.mark.timeout(120)
def test_wandb_without_a_key_turns_off_with_one_error_in_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    result = run_python(IN_PROCESS, _no_wandb_login(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    _check_one_clear_error(result.stderr)
    assert "internal_errors 0" in result.stdout
    assert result.stdout.count("METRICS STEP") == 3  # the other view goes on


@pytest.mark.timeout(120)
def test_wandb_without_a_key_turns_off_with_one_error_in_the_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    result = run_python(IN_SINK.replace("JSONL", str(tmp_path / "view.jsonl")), _no_wandb_login(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    _check_one_clear_error(result.stderr)
    assert "loss [0.0, 1.0, 2.0]" in result.stdout  # the sink and its other view go on
    assert "internal_errors 0" in result.stdout
    views = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("views "))[6:])
    print(views)
    assert views["wandb"]["disabled"] and "WANDB_API_KEY" in views["wandb"]["last_error"]  # the status route says so
    assert not views["jsonl"]["disabled"] and views["jsonl"]["last_written_step"] == 2
