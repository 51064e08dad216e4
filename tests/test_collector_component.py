"""The Collector component's own Go tests (``collector/rankscopemergeprocessor``), run by CI.

``go vet`` and ``go test`` (the unit tests and the fuzz target's seed corpus) with the module
proxy, as ``scripts/build_pipeline.py`` builds it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from .conftest import ROOT

MODULE = ROOT / "collector" / "rankscopemergeprocessor"


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (the pipeline tests need it too)")
def test_go_vet_and_go_test_of_the_merge_processor() -> None:
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOSUMDB": os.environ.get("GOSUMDB", "off")}
    for command in (["go", "vet", "./..."], ["go", "test", "-count=1", "-race", "./..."]):
        result = subprocess.run(command, cwd=MODULE, env=env, capture_output=True, text=True, timeout=900, check=False)
        assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert "ok" in result.stdout
