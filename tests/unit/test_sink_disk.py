"""Disk as a budgeted resource (``sink.runs.disk``): each client's runs' views charged by what they
wrote, a reservation per open run, and a floor of free space."""

from __future__ import annotations

import collections
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rankscope.backends.report import ReportBackend
from rankscope.report.page import plotly_js
from rankscope.sink import DiskLimits
from rankscope.sink.testing import Claim, DiskBudget, size_of

MiB = 1 << 20


def claims() -> Callable[[str], Claim]:
    """A run's opening by name: the same claim for the same name (a new name, a new opening)."""
    return collections.defaultdict(Claim).__getitem__


def budget(tmp_path: Path, per_client: int = 10 * MiB, floor: int = 1) -> DiskBudget:
    return DiskBudget(DiskLimits(per_client_bytes=per_client, min_free_bytes=floor, where=tmp_path))


def page(tmp_path: Path, name: str, size: int) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return str(path)


def test_a_clients_runs_are_refused_once_what_they_wrote_and_reserved_reaches_its_budget(tmp_path: Path) -> None:
    claim = claims()
    disk = budget(tmp_path)
    assert disk.admit(claim("r0"), "flood", estimate=3 * MiB) is None
    assert disk.admit(claim("r1"), "flood", estimate=3 * MiB) is None
    assert disk.admit(claim("r2"), "flood", estimate=3 * MiB) is None
    refused = disk.admit(claim("r3"), "flood", estimate=3 * MiB)  # 9 reserved + 3 > 10
    assert refused is not None and "disk budget of 10 MiB (limit per client)" in refused
    assert disk.admit(claim("v"), "victim", estimate=3 * MiB) is None  # another client's share is its own
    # r0 closes having written 1 MiB: 1 + 6 reserved + 3 <= 10, so one more fits
    assert disk.settle(claim("r0"), "flood", [page(tmp_path, "e/r0/report.html", MiB)]) == MiB
    assert disk.admit(claim("r3"), "flood", estimate=3 * MiB) is None
    assert disk.status()["refused_runs"] == {"client": 1, "floor": 0}


def test_a_run_reserves_the_most_a_run_of_its_client_wrote_so_far(tmp_path: Path) -> None:
    claim = claims()
    disk = budget(tmp_path)
    assert disk.admit(claim("r0"), "c", estimate=0) is None
    disk.settle(claim("r0"), "c", [page(tmp_path, "r0.html", 4 * MiB)])
    assert disk.admit(claim("r1"), "c", estimate=0) is None  # reserves 4: 4 + 4 = 8
    assert disk.admit(claim("r2"), "c", estimate=0) is not None  # 8 + 4 > 10


def test_a_location_is_counted_once_for_the_client_whose_run_last_grew_it(tmp_path: Path) -> None:
    claim = claims()
    disk = budget(tmp_path)
    shared = page(tmp_path, "views/e.jsonl", MiB)
    disk.admit(claim("r0"), "a", 0)
    assert disk.settle(claim("r0"), "a", [shared]) == MiB
    Path(shared).write_bytes(b"x" * (3 * MiB // 2))
    disk.admit(claim("r0 again"), "a", 0)  # reopened, closed again: what the file grew
    assert disk.settle(claim("r0 again"), "a", [shared]) == MiB // 2
    assert disk.settle(claim("r1"), "b", [shared]) == 0  # b's run did not grow it: still a's
    assert disk.status()["most_used_bytes"] == 3 * MiB // 2 and disk.status()["clients"] == 1
    Path(shared).write_bytes(b"x" * (2 * MiB))
    assert disk.settle(claim("r1"), "b", [shared]) == MiB // 2  # b's run grew it: b's now, whole
    assert disk.status()["most_used_bytes"] == 2 * MiB


def test_files_deleted_give_a_client_at_its_budget_its_bytes_back(tmp_path: Path) -> None:
    """Counted is what is on disk, not what was ever written: a client at its budget has its
    locations measured again, and an operator's clean-up lets its runs open again."""
    claim = claims()
    now = [0.0]
    disk = DiskBudget(DiskLimits(per_client_bytes=10 * MiB, min_free_bytes=1, where=tmp_path), clock=lambda: now[0])
    pages = [page(tmp_path, f"e/r{i}/report.html", 4 * MiB) for i in range(2)]
    for i, where in enumerate(pages):
        disk.admit(claim(f"r{i}"), "c", 0)
        disk.settle(claim(f"r{i}"), "c", [where])
    assert disk.admit(claim("r2"), "c", 0) is not None  # 8 + 4 > 10
    Path(pages[0]).unlink()
    assert disk.admit(claim("r2"), "c", 0) is not None  # measured again at most every 10 s
    now[0] = 11.0
    assert disk.admit(claim("r2"), "c", 0) is None  # 4 on disk + 4 reserved


def test_a_directory_is_measured_by_its_files_up_to_a_bound(tmp_path: Path) -> None:
    for i in range(3):
        page(tmp_path, f"tb/run/{i}/events", 1000)
    assert size_of(tmp_path / "tb") == 3000
    assert size_of(tmp_path / "gone") == 0


def test_under_the_floor_of_free_space_every_new_run_is_refused(tmp_path: Path) -> None:
    claim = claims()
    free = shutil.disk_usage(tmp_path).free
    disk = DiskBudget(DiskLimits(per_client_bytes=10 * MiB, min_free_bytes=free + (1 << 40), where=tmp_path))
    refused = disk.admit(claim("r"), "anyone", 0)
    assert refused is not None and "under its floor" in refused
    assert disk.below_floor() is not None
    assert disk.status()["refused_runs"]["floor"] == 1


def test_defaults_are_derived_from_the_file_system(tmp_path: Path) -> None:
    limits = DiskLimits(where=tmp_path).resolved()
    usage = shutil.disk_usage(tmp_path)
    assert limits.per_client_bytes == max(1 << 30, usage.free // 8)
    assert 1 << 30 <= limits.min_free_bytes <= 50 << 30
    with pytest.raises(ValueError, match="must be >= 0"):
        DiskLimits(per_client_bytes=-1)


def test_a_report_view_reserves_at_least_its_page() -> None:
    assert ReportBackend.run_bytes >= len(plotly_js()) + 64 * 1024


def test_runs_that_reserve_nothing_close_in_any_order(tmp_path: Path) -> None:
    disk = budget(tmp_path)
    for run in ("a", "b", "c"):
        assert disk.admit(("e", run), "c", estimate=0) is None
    for run in ("b", "a", "c"):
        assert disk.settle(("e", run), "c", []) == 0
    assert disk.status()["reserved_bytes"] == 0


def test_runs_appending_to_one_file_each_reserve_their_part_not_the_file(tmp_path: Path) -> None:
    """10,000 runs of one client wrote into one JSONL file: each new run had reserved the whole
    file (6 MiB near the end), and 580 runs open at once filled a 3.4 GiB budget."""
    claim = claims()
    disk = budget(tmp_path)
    shared = tmp_path / "views" / "e.jsonl"
    for i in range(8):
        assert disk.admit(claim(f"r{i}"), "c", estimate=0) is None
        page(tmp_path, "views/e.jsonl", (i + 1) * MiB)  # each run appends 1 MiB
        assert disk.settle(claim(f"r{i}"), "c", [str(shared)]) == MiB
    assert disk.admit(claim("r8"), "c", estimate=0) is None  # 8 on disk + 1 reserved, not 8
    assert disk.status()["reserved_bytes"] == MiB


def test_a_run_reopened_while_its_closed_views_write_holds_a_reservation_of_its_own(tmp_path: Path) -> None:
    """Reservations were keyed by the run: its reopening shared the closed opening's, and when
    those views were charged the open run held nothing, so its client's next runs got past its budget."""
    claim, disk = claims(), budget(tmp_path)
    assert disk.admit(claim("closed"), "c", estimate=4 * MiB) is None
    assert disk.admit(claim("reopened"), "c", estimate=4 * MiB) is None  # the same run, its own reservation
    assert disk.settle(claim("closed"), "c", [page(tmp_path, "e/r/page.html", 3 * MiB)]) == 3 * MiB
    assert disk.status()["reserved_bytes"] == 4 * MiB  # the reopened one's: still held
    assert disk.admit(claim("next"), "c", estimate=4 * MiB) is not None  # 3 + 4 + 4 > 10 (3 + 4 fit before)
