"""The Collector component's own Go tests (``collector/rankscopemergeprocessor``), run by CI.

``gofmt``, ``go vet``, ``staticcheck`` and ``go test`` (the unit tests and the fuzz target's seed
corpus) with the module proxy, as ``scripts/build_pipeline.py`` builds it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ..conftest import ROOT

MODULE = ROOT / "collector" / "rankscopemergeprocessor"
# Pinned, run with ``go run`` rather than listed as a tool in go.mod: the module's requirements are
# what the Collector build links in, and a linter's do not belong there.
STATICCHECK = "honnef.co/go/tools/cmd/staticcheck@v0.8.2"


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (the pipeline tests need it too)")
def test_gofmt_go_vet_staticcheck_and_go_test_of_the_merge_processor() -> None:
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOSUMDB": os.environ.get("GOSUMDB", "off")}
    gofmt = subprocess.run(["gofmt", "-l", "."], cwd=MODULE, capture_output=True, text=True, timeout=60, check=False)
    assert gofmt.returncode == 0 and gofmt.stdout == "", f"gofmt -l (files to format):\n{gofmt.stdout}{gofmt.stderr}"
    checks = (["go", "vet", "./..."], ["go", "run", STATICCHECK, "./..."], ["go", "test", "-count=1", "-race", "./..."])
    for command in checks:
        result = subprocess.run(command, cwd=MODULE, env=env, capture_output=True, text=True, timeout=900, check=False)
        assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert "ok" in result.stdout
