"""A long run held flat, short: 2,000 steps of a 64-process experiment through a sink with a
write-ahead log and the JSONL and report views (``benchmarks/bench_soak.py`` runs 100,000).

Flat is what stays the same however long the run: threads and file descriptors equal at every
sample, the report view's data bounded (it compacts), the write-ahead log bounded (segments go
once written), resident memory settled once the bounded caches are full, and every step written
to the JSONL view once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_soak import soak

STEPS, EVERY, PROCESSES, KEYS = 2000, 250, 64, 8


@pytest.mark.timeout(600)
def test_a_long_run_holds_threads_files_memory_and_the_reports_data_flat(tmp_path: Path) -> None:
    samples = soak(STEPS, EVERY, PROCESSES, KEYS, tmp_path, compact_bytes=128 << 10)
    assert [s.step for s in samples] == list(range(EVERY, STEPS + 1, EVERY))
    assert len({s.threads for s in samples}) == 1, samples
    assert len({s.fds for s in samples}) == 1, samples
    later = samples[len(samples) // 2 :]
    assert max(s.report_data_kb for s in samples) < 4 * 1024, samples  # compacts: never the run's 1.6 MB + ...
    assert later[-1].report_data_kb < 2 * max(s.report_data_kb for s in samples[: len(samples) // 2]), samples
    assert max(s.wal_kb for s in samples) < 32 * 1024, samples  # 8 MiB segments, deleted once written
    assert later[-1].rss_mb - later[0].rss_mb < 24, samples  # settled: the digest and window caches are full
    rows = [json.loads(line) for line in (tmp_path / "views" / "global.jsonl").read_text().splitlines()]
    written: dict[int, int] = {}
    for row in rows:
        if row.get("key") == "k000":
            written[row["step"]] = written.get(row["step"], 0) + 1
    assert len(written) == STEPS and set(written.values()) == {1}  # every step, once
