"""Only ``export._otel_sdk`` touches the OpenTelemetry SDK's private names (a source scan)."""

from __future__ import annotations

import re

from ..conftest import ROOT

_PRIVATE = re.compile(r"opentelemetry(\.\w+)*\._\w|from opentelemetry[\w.]* import[^\n]*\b_[A-Za-z]|_RUNTIME_CONTEXT")


def test_nothing_else_touches_opentelemetry_private_names() -> None:
    package = ROOT / "src" / "rankscope"
    touching = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if _PRIVATE.search(p.read_text())}
    assert touching == {"export/_otel_sdk.py"}
