"""Every ``RANKSCOPE_*`` variable the project ships or documents is one rankscope knows: a process
warns about any other as a typo (``unknown_variables``), so a name read only by a Collector config
and missing from ``OTHER_VARIABLES`` made a correct setup print a false warning at every ``init``."""

from __future__ import annotations

import re
from pathlib import Path

from rankscope.core.settings import SETTINGS, unknown_variables

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bRANKSCOPE_[A-Z0-9_]*[A-Z0-9]\b")
SHIPPED = [
    *sorted((ROOT / "collector-config").glob("*.yaml")),
    ROOT / "docker-compose.yml",
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "examples").rglob("*.py")),
]
TYPOS_SHOWN = {"RANKSCOPE_CONSOL"}
"""Misspellings the docs show on purpose (what the warning says of one)."""


def test_every_variable_the_configs_and_docs_name_is_known() -> None:
    named: dict[str, str] = {}
    for path in SHIPPED:
        for name in NAME.findall(path.read_text()):
            named.setdefault(name, str(path.relative_to(ROOT)))
    assert len(named) > len(SETTINGS)  # the scan found the table's names and more
    unknown = unknown_variables({name: "" for name in named if name not in TYPOS_SHOWN})
    assert unknown == [], [f"{entry} in {named[entry.split()[0]]}" for entry in unknown]


def test_a_typo_is_named_with_the_variable_it_is_close_to() -> None:
    assert unknown_variables({"RANKSCOPE_CONSOL": "off", "RANKSCOPE_REMOTE_WRITE_URL": "x", "HOME": "/"}) == [
        "RANKSCOPE_CONSOL (did you mean RANKSCOPE_CONSOLE?)"
    ]


SHARED_WITH_PROCESSES = {"RANKSCOPE_EXPERIMENT", "RANKSCOPE_ROLE"}
"""Settings a Collector config reads too, meaning there what they mean to a process (the experiment
id, the role), so one exported value serves both."""


def test_a_collector_config_reads_no_process_setting_in_another_sense() -> None:
    """``prometheus.yaml`` read the sink's ``host:port`` from ``RANKSCOPE_SINK``, a process setting
    that takes ``auto``, ``embedded`` or ``off``: exported as its docs showed, every rankscope process
    on the machine failed at ``init``."""
    settings = {s.env for s in SETTINGS}
    read = {
        name: path.name
        for path in sorted((ROOT / "collector-config").glob("*.yaml"))
        for name in re.findall(r"\$\{env:(RANKSCOPE_[A-Z0-9_]+)", path.read_text())
    }
    assert read  # the configs were found and read
    assert {name: path for name, path in read.items() if name in settings - SHARED_WITH_PROCESSES} == {}
