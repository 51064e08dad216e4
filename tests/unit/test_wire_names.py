"""Every wire name once, in ``core/names.py``: no other module of the package spells a
``rankscope.*`` or ``rankscope/*`` string (read with ``ast``, an explicit allow-list for the
names that never cross the network). And the Collector's merge processor (Go) and the Python
package speak one wire format: every name and number the processor copies from
``core/names.py`` and ``otlp/metrics.py`` is read from its source here and held equal, so a
rename on one side fails a test instead of a job."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rankscope.core import names
from rankscope.metrics.reduce import DISTRIBUTION_SCALE
from rankscope.otlp.markers import MAX_SPANS, MAX_WORLD_SIZE
from rankscope.otlp.metrics import MAX_BUCKETS, MAX_SCALE

from ..conftest import ROOT

GO_CONSTANTS = ROOT / "collector" / "rankscopemergeprocessor" / "state.go"
PACKAGE = ROOT / "src" / "rankscope"
NAMES = PACKAGE / "core" / "names.py"
NOT_WIRE_NAMES = {
    "rankscope.backends": "entry-point group (backends/base.py)",
    "rankscope.reducers": "entry-point group (metrics/reduce.py)",
    "rankscope.sink": "logger name",
    "rankscope.sink.http": "logger name of the HTTP server's own messages (sink/edge/connections.py)",
    "rankscope.control": "aiohttp request key, inside the process (sink/edge/control.py)",
    "rankscope.huggingface": "the short name warnings give an adapter (integrations/*.py: SOURCE)",
    "rankscope.lightning": "the short name warnings give an adapter",
    "rankscope.torchtitan": "the short name warnings give an adapter",
    "rankscope.trl": "the short name warnings give an adapter",
    "rankscope.verl": "the short name warnings give an adapter",
    "rankscope.sink.embedded": "module path, for python -m (sink/embedded.py)",
    "rankscope.report": "package whose assets the report page reads (report/page.py)",
    "rankscope.split": "package of the proto built in otlp/raw.py",
    "rankscope.split.ExportMetricsServiceRequest": "a message of that proto",
    "rankscope/split_metrics.proto": "that proto's file name",
}
"""Strings of the form ``rankscope.*``/``rankscope/*`` that are not wire names, and why."""


NAME = re.compile(r"rankscope[./][\w./-]*(\s|$)")
"""A name up to the first blank (``rankscope.rl: ...`` is a message, ``rankscope.step {n}`` a name)."""


def rankscope_literals(path: Path) -> list[tuple[int, str]]:
    """(line, string) of each string literal, or literal part of an f-string, in ``path`` that
    starts with a ``rankscope.`` or ``rankscope/`` name; docstrings and other bare strings are prose."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and NAME.match(node.value)
    )


def test_no_module_but_core_names_spells_a_wire_name() -> None:
    found = [
        (f"{path.relative_to(PACKAGE)}:{line}", value)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != NAMES
        for line, value in rankscope_literals(path)
    ]
    assert len(found) >= len(NOT_WIRE_NAMES)  # the walk reads the package
    assert [(where, value) for where, value in found if value not in NOT_WIRE_NAMES] == []
    assert set(NOT_WIRE_NAMES) - {value for _, value in found} == set()  # no stale allowances


def test_the_wire_name_check_sees_literals_and_f_strings_not_prose(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        '"""Sets ``rankscope.x``."""\n'
        'KEY = "rankscope.sample.new"\n'
        'def f(n):\n    """rankscope.y in prose."""\n    return {f"rankscope/{n}": 1, "other": "rankscope"}\n'
        'def g(n):\n    print(f"rankscope.step {n}", "rankscope.rl: not a name")\n'
    )
    assert rankscope_literals(module) == [(2, "rankscope.sample.new"), (5, "rankscope/"), (7, "rankscope.step ")]


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
        "attrWorldSize": names.WORLD_SIZE,
        "attrRanks": names.RANKS,
        "attrMergePart": names.MERGE_PART,
        "attrFallback": names.ATTEMPT_FALLBACK,
    }
    assert {name: copied.get(name) for name in expected} == expected


def test_the_processors_numbers_are_the_encoders_and_the_sinks() -> None:
    go = go_constants()
    assert int(go["distributionScale"]) == DISTRIBUTION_SCALE
    assert int(go["maxScale"]) == MAX_SCALE
    assert int(go["maxBuckets"]) == MAX_BUCKETS
    assert (int(go["maxWorldSize"]), int(go["maxSpans"])) == (MAX_WORLD_SIZE, MAX_SPANS)
    assert (go["metricFlush"], go["metricRanks"]) == (names.FLUSH_MARKER, names.FLUSH_RANKS)
