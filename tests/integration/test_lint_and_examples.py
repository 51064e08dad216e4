"""The project's own hygiene (ruff, mypy, import-linter) and the quickstart example, run as tests
so CI keeps them true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT, mypy_result, run_python


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_clean() -> None:
    result = _run("ruff", "check", "src", "tests", "benchmarks", "examples", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_clean(request: pytest.FixtureRequest) -> None:
    status, output = mypy_result(request.config)  # started with the session, at the lowest priority
    assert status == 0, output


def test_import_layers_hold() -> None:
    """The import-linter contracts in pyproject.toml: stages import only the stages below them."""
    lint_imports = Path(sys.executable).parent / "lint-imports"  # installed with the test extra
    result = subprocess.run(
        [str(lint_imports)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_quickstart_example_prints_three_global_steps() -> None:
    result = run_python((ROOT / "examples" / "quickstart.py").read_text())
    assert result.returncode == 0, result.stderr
    for step in range(3):
        assert f"=== [GlobalReduce] - METRICS STEP {step} ===" in result.stdout
    assert "samples: 64.0" in result.stdout and "latency_s/p99: " in result.stdout
