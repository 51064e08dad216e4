"""Names never become paths: hostile experiment ids, roles and replicas stay inside the configured directories.

The mapping (``safe_component``) is tested as a pure function, with hypothesis and by
brute force over a small alphabet of troublemakers; then the backends (as the sink's views
call them and as a lone SDK process does) are given such names and every file they create is
checked. W&B run ids and the embedded sink's directory are safe too, and the console escapes
control and bidi characters.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import unicodedata
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rankscope as rs
from rankscope.backends.console import ConsoleBackend, printable
from rankscope.backends.jsonl import JsonlBackend
from rankscope.backends.tensorboard import TensorBoardBackend
from rankscope.backends.wandb import run_id_for
from rankscope.core.paths import safe_component
from rankscope.metrics.reduce import Reduce
from rankscope.sink.testing import announce, discover, runtime_dir, withdraw

from ..hostile_names import assert_contained, hostile_jobs

SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
HOSTILE_CHARS = ["a", "A", "z", "0", ".", "-", "_", "/", "\\", "\0", "\n", "\x1b", "\u202e", "\u2066", "\uff0e",
                 "\u2024", "é", "\u0301", "生", " ", "\ud800", "\U0001f600"]  # fmt: skip
names = st.one_of(st.text(), st.text(st.sampled_from(HOSTILE_CHARS), max_size=80), st.text(min_size=60, max_size=300))


def assert_safe(component: str, max_len: int = 64) -> None:
    assert SAFE.fullmatch(component), component
    assert ".." not in component and not component.endswith(".") and len(component) <= max_len


# -- the mapping, as a pure function ------------------------------------------------------------------


@settings(max_examples=300, deadline=None, database=None)
@given(names, st.integers(min_value=12, max_value=120))
def test_every_name_maps_to_one_bounded_safe_component(name: str, max_len: int) -> None:
    out = safe_component(name, max_len)
    assert_safe(out, max_len)
    assert out == safe_component(name, max_len)  # pure: a restarted sink reopens the same files
    if out != name:  # a changed name is marked by its hash, so it can never equal a kept one
        assert re.search(r"-[0-9a-f]{10}\Z", out)
        assert safe_component(out, max_len) != out


@settings(max_examples=300, deadline=None, database=None)
@given(names, names)
def test_distinct_names_never_share_a_component(a: str, b: str) -> None:
    if a != b:
        assert safe_component(a).lower() != safe_component(b).lower()


def test_distinct_names_never_share_a_component_exhaustively() -> None:
    """Every string of up to three troublemakers, and their mapped forms fed back in."""
    alphabet = [".", "-", "_", "a", "A", "/", "\0", "\u202e", "\uff0e"]
    pool = {"".join(p) for n in range(4) for p in itertools.product(alphabet, repeat=n)}
    pool |= {safe_component(n) for n in pool} | {safe_component(n, 12) for n in pool}
    for max_len in (12, 64):
        seen: dict[str, str] = {}
        for name in pool:
            out = safe_component(name, max_len).lower()  # distinct on case-insensitive file systems too
            assert seen.setdefault(out, name) == name, (name, seen[out], out)


def test_readable_names_stay_readable_and_known_names_keep_their_component() -> None:
    for plain in ("x", "trainer_r0", "global", "generator_1_r3", "20250101-120000-abcdef12", "run.v2"):
        assert safe_component(plain) == plain
    # Fixed: changing the rule would move existing logs (and the sink's write-ahead log) elsewhere.
    assert safe_component("../../../x") == "x-3350a0336f"
    assert safe_component("..") == "_-7c076d0f9d"
    assert safe_component("Qwen3-8B") == "Qwen3-8B-bb8d56de61"
    assert safe_component("café") == "cafe-394e4c194e"
    assert safe_component("run-0123456789").startswith("run-0123456789-")  # looks hashed: hashed again
    assert len(safe_component("a" * 10_000)) == 64
    with pytest.raises(ValueError, match="max_len"):
        safe_component("x", 11)


def test_console_escapes_control_and_bidi_characters(capsys: pytest.CaptureFixture[str]) -> None:
    assert printable("trainer_r0") == "trainer_r0"
    assert printable("a\x1b[31m\u202eb\nc\0") == "a\\x1b[31m\\u202eb\\nc\\x00"
    for form, lines in (("full", 3), ("compact", 1)):
        backend = ConsoleBackend({"logging_mode": "per_rank_reduce", "format": form})
        backend.init("evil\u202e\x1b[2J\r_r0")
        backend.log_batch([rs.Metric("k\x1b]0;title\x07", 1.0, Reduce.MEAN)], 3)
        out = capsys.readouterr().out
        assert out.count("\n") == lines and all(line.isprintable() for line in out.splitlines())
        assert "evil\\u202e\\x1b[2J\\r_r0" in out and "k\\x1b]0;title\\x07" in out


def test_w_and_b_run_ids_and_the_embedded_sink_directory_are_safe(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANKSCOPE_RUNTIME_DIR", str(tmp_path))
    for name in ("../../x", "/tmp/x", "a" * 10_000, "a\0b", "\u202e", "..", "", "\ud800"):
        assert re.fullmatch(r"[A-Za-z0-9_-]{9,57}", run_id_for(name))  # W&B's run directory is named by it
        for directory in (runtime_dir(name), runtime_dir("train", name), runtime_dir(name, name)):
            assert directory.parent.parent == tmp_path and re.fullmatch(r"[0-9a-f]{16}", directory.name)
    assert runtime_dir("train", "run-1") != runtime_dir("train", "run-2") != runtime_dir("train")  # a sink per launch
    assert run_id_for("rl") == "rl-" + hashlib.sha1(b"rl").hexdigest()[:8]  # W&B resumes runs of older sinks


@pytest.mark.timeout(60)
def test_backends_map_every_name_they_are_given(tmp_path: Path, monkeypatch) -> None:
    """What the sink's edge lets through is its own business: the views alone must stay contained."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before_parent = set(os.listdir(tmp_path.parent))
    tag = uuid.uuid4().hex
    jobs = [*hostile_jobs(tag), ("surrogate\ud800", "\udcff", "\ud800")]  # an SDK's env may hold those
    metric = rs.Metric("loss", 1.0, Reduce.MEAN)
    for experiment, role, replica in jobs:
        label = f"{role}{'' if replica is None else f'_{replica}'}_r0"
        who = {"role": role, "replica": replica, "rank": 0, "world_size": 1}
        for cls, options in ((JsonlBackend, {}), (TensorBoardBackend, {"logdir": str(tmp_path / "tb")})):
            at_sink = cls({"logging_mode": "per_rank_reduce", **options})  # as the sink's views call it
            at_sink.init("global", experiment=experiment, role="sink")
            at_sink.log_batch([metric], 0, process_name=label, **who)
            at_sink.finish()
            in_process = cls({"logging_mode": "per_rank_reduce", **options})  # as a lone SDK process does
            in_process.init(label, experiment=experiment, **who)
            in_process.log_batch([metric], 0)
            in_process.finish()
    for name in (f"/tmp/abs-{tag}", f"/tmp/escape-{tag}", f"/tmp/abs-role-{tag}"):
        assert not Path(name).exists()
    created = assert_contained(tmp_path, [cwd / "rankscope_logs", tmp_path / "tb"], before_parent)
    files = [p for p in created if p.suffix == ".jsonl"]
    rows = [json.loads(line) for p in files for line in p.read_text().splitlines()]
    assert {(r["experiment"], r["role"], r.get("replica")) for r in rows} == set(jobs)  # the original names
    assert len(files) == 2 * len(jobs)  # one per experiment at the sink, one per process: none shared
    tb_runs = {p.parent for p in created if p.name.startswith("events.out.tfevents")}
    assert len(tb_runs) == len(jobs)  # {experiment}/{process}: the sink's per-rank view and the process's own


@pytest.mark.timeout(120)
def test_a_lone_process_with_hostile_names_writes_only_under_its_configured_directories(
    tmp_path: Path, monkeypatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before_parent = set(os.listdir(tmp_path.parent))
    tag = uuid.uuid4().hex
    views = {
        "jsonl": {"logging_mode": "per_rank_reduce"},
        "tensorboard": {"logging_mode": "per_rank_reduce", "logdir": str(tmp_path / "tb")},
    }
    jobs = [
        ("../../../x", "../../../../r", "a/../b"),
        (f"/tmp/abs-{tag}", "\u202e" + "r" * 3000, "\n"),
        ("..", ".", ".."),
    ]
    for experiment, role, replica in jobs:
        rs.init(experiment=experiment, role=role, replica=replica, backends=views, endpoint=None)
        rs.record_metric("loss", 2.0)
        rs.flush(0)
        rs.shutdown()
    assert not Path(f"/tmp/abs-{tag}").exists()
    created = assert_contained(tmp_path, [cwd / "rankscope_logs", tmp_path / "tb"], before_parent)
    rows = [json.loads(line) for p in created if p.suffix == ".jsonl" for line in p.read_text().splitlines()]
    assert {(r["experiment"], r["role"], r["replica"]) for r in rows} == set(jobs)
    assert len([p for p in created if p.suffix == ".jsonl"]) == 3
    assert len({p.parent for p in created if p.name.startswith("events.out.tfevents")}) == 3


def test_nfkc_lookalikes_of_dot_dot_are_not_dot_dot() -> None:
    for name in ("\uff0e\uff0e", "\u2024\u2024", "\ufe52\ufe52", "\u2025"):
        assert unicodedata.normalize("NFKC", name) == ".."
        assert_safe(safe_component(name))


def test_a_sink_announces_itself_in_a_file_named_by_its_pid_and_a_dead_one_is_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``rankscope top`` and ``rankscope report`` find without ``--sink``: live sinks only, newest first."""
    monkeypatch.setenv("RANKSCOPE_RUNTIME_DIR", str(tmp_path))
    assert discover() == []  # nothing announced yet, not even the directory
    path = announce("127.0.0.1:4317", "http://127.0.0.1:4318", ["torchrun", "../../train.py"])
    assert path == tmp_path / f"rankscope-{os.getuid()}" / f"run-{os.getpid()}.json"
    assert [f["control"] for f in discover()] == ["http://127.0.0.1:4318"]
    assert not list(path.parent.glob("*.tmp"))  # written atomically: no temporary file left
    dead = path.parent / "run-999999999.json"  # a sink killed before it could remove its file
    dead.write_text(json.dumps({"pid": 999_999_999, "control": "http://127.0.0.1:9", "started": 9e9}))
    (path.parent / "run-1x.json").write_text("{not json")
    assert [f["control"] for f in discover()] == ["http://127.0.0.1:4318"]
    withdraw(path)
    assert not path.exists() and discover() == []
