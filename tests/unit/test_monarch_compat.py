"""Monarch's private symbols in one place: only ``integrations/monarch/_compat.py`` touches them
(a source scan).

The patches coming off and the per-call context, in child processes, are ``tests/e2e/test_monarch_compat.py``."""

from __future__ import annotations

from ..conftest import ROOT


def test_only_compat_touches_monarch_internals() -> None:
    package = ROOT / "src" / "rankscope"
    touching = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if "monarch._src" in p.read_text()}
    assert touching == {"integrations/monarch/_compat.py"}
