"""Framework keys as metric names (``as_metric_name``) and a framework's step as rankscope's
(``StepFollower``): what the torchtitan and verl integrations stand on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rankscope as rs
from rankscope.integrations.stepping import StepFollower
from rankscope.metrics.recording import record_logged
from rankscope.metrics.values import as_metric_name, check_key


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("loss", "loss"),
        ("throughput(tps)", "throughput_tps"),
        ("mfu(%)", "mfu_pct"),
        ("memory/max_reserved(GiB)", "memory/max_reserved_GiB"),
        ("time_metrics/data_loading(%)", "time_metrics/data_loading_pct"),
        ("val-core/gsm8k/reward/mean@4", "val-core/gsm8k/reward/mean_at4"),
        ("a b", "a_b"),
        ("mfu (%)", "mfu_pct"),
        ("loss @ 4", "loss_at_4"),
        ("1st", None),
        ("", None),
        ("(%)", "pct"),
    ],
)
def test_framework_keys_become_valid_names(key: str, name: str | None) -> None:
    assert as_metric_name(key) == name


@given(st.text(max_size=300))
def test_a_name_is_valid_or_none_and_valid_keys_stay(key: str) -> None:
    name = as_metric_name(key)
    if name is not None:
        assert check_key(name) == name
    try:
        check_key(key)
    except (TypeError, ValueError):
        return
    assert name == key


def test_the_follower_closes_a_step_when_a_later_one_shows_up() -> None:
    rs.init(experiment="follow", role="trainer", backends={"console": {"logging_mode": "global_reduce"}})
    follower = StepFollower()
    for seen in (None, "3", True, -1):  # not a step: ignored
        follower.follow(seen)
    assert rs.current_step() is None
    follower.follow(5)
    assert rs.current_step() == 5
    rs.record_metric("x", 1.0)
    follower.follow(5)  # the same step again (a second log of it): still open
    follower.follow(4)  # an earlier one: ignored
    assert rs.current_step() == 5
    follower.follow(7)  # a later one: 5 is closed, 7 in progress
    assert rs.current_step() == 7
    follower.close()
    assert rs.current_step() == 8  # nothing in progress: the one after the last closed
    rs.shutdown()


def test_a_logged_number_is_recorded_renamed_or_skipped_never_raised(capsys: pytest.CaptureFixture[str]) -> None:
    """What a framework logs goes through ``record_logged``: renamed when OTel would refuse the
    key, skipped with a warning when it cannot be recorded, never raised into the framework's loop."""
    rs.init(
        experiment="logged", role="trainer", backends={"console": {"logging_mode": "global_reduce", "format": "full"}}
    )
    record_logged("throughput(tps)", 1200, source="test")
    record_logged("note", "not a number", source="test")  # for other backends: skipped
    record_logged("flag", True, source="test")
    record_logged("loss", 2.0, rs.Reduce.MEAN, source="test")
    with pytest.warns(RuntimeWarning, match="'loss' not recorded"):
        record_logged("loss", 4.0, rs.Reduce.MAX, source="test")  # two reduce types: that key's trouble
    with pytest.warns(RuntimeWarning, match="no valid metric name"):
        record_logged("1st", 1.0, source="test")
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "throughput_tps: 1200.0" in out and "loss: 2.0" in out
    assert "note" not in out and "flag" not in out and "1st" not in out
