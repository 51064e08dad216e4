"""The Collector's merge processor (Go) and the Python package speak one wire format: every name
and number the processor copies from ``core/names.py`` and ``otlp/metrics.py`` is read from its
source here and held equal, so a rename on one side fails a test instead of a job."""

from __future__ import annotations

import re

from rankscope.core import names
from rankscope.metrics.reduce import DISTRIBUTION_SCALE
from rankscope.otlp.metrics import MAX_BUCKETS, MAX_SCALE

from ..conftest import ROOT

GO_CONSTANTS = ROOT / "collector" / "rankscopemergeprocessor" / "state.go"


def go_constants() -> dict[str, str]:
    block = re.search(r"const \((.*?)\n\)", GO_CONSTANTS.read_text(), re.S)
    assert block, f"no const block in {GO_CONSTANTS}"
    found = dict(re.findall(r"^\s*(\w+)\s*=\s*(\"[^\"]*\"|[0-9_]+)", block.group(1), re.M))
    return {
        name: value.strip('"').replace("_", "") if value[0] != '"' else value.strip('"')
        for name, value in found.items()
    }


def test_every_wire_name_of_the_go_processor_is_the_python_packages() -> None:
    go = go_constants()
    python = {value for key, value in vars(names).items() if key.isupper() and isinstance(value, str)}
    copied = {name: value for name, value in go.items() if name.startswith("attr")}
    assert len(copied) >= 16  # the processor's attribute names, all of them
    assert {name: value for name, value in copied.items() if value not in python} == {}
    expected = {
        "attrExperiment": names.EXPERIMENT_ID,
        "attrAttempt": names.EXPERIMENT_ATTEMPT,
        "attrRun": names.RUN_ID,
        "attrResume": names.RUN_RESUME,
        "attrReduce": names.REDUCE,
        "attrStep": names.STEP,
        "attrSumSq": names.SUM_SQ,
        "attrMerged": names.MERGED,
        "attrWindow": names.MERGE_WINDOW,
        "attrInstanceID": names.SERVICE_INSTANCE_ID,
    }
    assert {name: copied.get(name) for name in expected} == expected


def test_the_processors_numbers_are_the_encoders_and_the_sinks() -> None:
    go = go_constants()
    assert int(go["distributionScale"]) == DISTRIBUTION_SCALE
    assert int(go["maxScale"]) == MAX_SCALE
    assert int(go["maxBuckets"]) == MAX_BUCKETS
