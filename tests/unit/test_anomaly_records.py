"""Anomaly records are types (``core.anomalies``), dicts only where they leave: every kind round-trips
through its serialized form, a hostile one reads back as nothing, every view draws every kind, and
the detectors are parts registered in one list."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from rankscope.backends.console import describe
from rankscope.core.anomalies import (
    KINDS,
    Anomaly,
    Capture,
    Corrected,
    Interrupted,
    Missing,
    NonFinite,
    Outlier,
    Partial,
    SlowStep,
    Straggler,
    from_json,
)
from rankscope.sink.testing import DETECTORS, StepFacts, Thresholds, Watch

SAMPLES: list[Anomaly] = [
    NonFinite(
        step=3, key="loss", process="trainer_r1", role="trainer", rank=1, count=2, keys=("loss", "x"), first=True
    ),
    Straggler(step=4, first_step=4, last_step=6, steps=3, process="trainer_r2", phase="train/forward", ratio=3.5),
    Outlier(step=5, first_step=5, last_step=7, steps=3, process="trainer_r13", key="loss", value=1.8, others_mean=1.0),
    SlowStep(step=5, seconds=2.0, median_s=0.5, factor=4.0),
    Missing(step=6, processes=("trainer_r3",), count=1),
    Interrupted(step=7, processes=("trainer_r0", "trainer_r1"), count=2),
    Corrected(step=8, processes=("trainer_r4",), count=1, missing=1),
    Partial(step=9, processes=("trainer_r5",), count=1, points=12),
    Capture(capture="c1", process="trainer_r2", path="/tmp/x.json", bytes=10, steps=2, reason="asked"),
]


def test_every_kind_has_a_sample_and_a_unique_type() -> None:
    assert {type(r) for r in SAMPLES} == set(KINDS.values())
    assert len(KINDS) == len({k.KIND for k in KINDS.values()})


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: r.KIND)
def test_a_record_round_trips_through_json(record: Anomaly) -> None:
    wire = json.loads(json.dumps(record.to_json()))
    assert wire["type"] == record.KIND
    assert from_json(wire) == record
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.step = 99  # type: ignore[misc]


def test_fields_left_at_their_default_keep_the_older_wire_shape() -> None:
    assert "first" not in NonFinite(step=1, key="k").to_json()
    assert "capture" not in Straggler(step=1).to_json()
    assert Straggler(step=1, capture="c9").to_json()["capture"] == "c9"


@pytest.mark.parametrize(
    "hostile",
    [
        {"type": "nope", "step": 1},
        {"type": "missing", "processes": "not a list"},
        {"type": "missing", "processes": [1, 2]},
        {"type": "straggler", "first_step": "3"},
        {"type": "slow_step", "seconds": [1]},
        {"type": "nonfinite", "first": "yes"},
        {"type": "capture", "bytes": {"a": 1}},
        {"step": 3},
        {"type": "missing", "processes": ["p"] * 65},
        {"type": "straggler", "phase": "x" * 5000},
        {"type": "slow_step", "seconds": True},
        {"type": "straggler", "steps": 2.5},
    ],
)
def test_a_hostile_serialized_record_reads_back_as_nothing(hostile: dict) -> None:
    assert from_json(hostile) is None


def test_an_older_sinks_straggler_record_of_one_step_is_its_own_streak() -> None:
    read = from_json({"type": "straggler", "step": 7, "process": "trainer_r1", "phase": "x", "ratio": 2})
    assert isinstance(read, Straggler) and (read.first_step, read.last_step, read.steps) == (7, 7, 1)


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: r.KIND)
def test_the_console_draws_every_kind_in_words(record: Anomaly) -> None:
    text = describe(record)
    assert not text.startswith("{") and record.KIND[:4] in text.replace("-", "").replace(" ", "_")


def test_the_detectors_are_parts_in_one_list_and_each_judges_its_kind() -> None:
    """Each registered detector sees the same facts and returns only records; their order is the
    order a step's records are said."""
    watch = Watch(Thresholds(warmup_steps=0, straggler_steps=1, slow_step_history=1, slow_step_min_s=0.0))
    assert len(watch.detectors) == len(DETECTORS)
    said = watch.step(StepFacts(0, duration=1.0))
    said += watch.step(StepFacts(1, duration=10.0, missing=["trainer_r3"], nonfinite=[("loss", None)]))
    assert [type(r) for r in said] == [NonFinite, SlowStep, Missing]
    assert said[0].first and said[0].process is None
    status = watch.status()
    assert status["anomaly_counts"] == {"nonfinite": 1, "slow_step": 1, "missing": 1}
    assert status["first_nonfinite"] == {"step": 1, "key": "loss", "process": None, "rank": None}
    assert [a["type"] for a in status["anomalies"]] == ["nonfinite", "slow_step", "missing"]
    assert math.isclose(status["anomalies"][1]["factor"], 10.0)
