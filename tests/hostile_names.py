"""Names a hostile or careless client may send, and the check that the files they caused stay
contained (``tests/*/test_paths.py``)."""

from __future__ import annotations

import os
from pathlib import Path


def hostile_jobs(tag: str) -> list[tuple[str, str, str | None]]:
    """(experiment id, role, replica): escapes, absolute paths, NUL, controls, bidi, huge and empty-ish names."""
    experiments = [
        "../../../x",
        f"/tmp/abs-{tag}",
        "../" * 30 + f"tmp/escape-{tag}",
        "a" * 10_000,
        "nul\0id",
        "new\nline",
        "rtl\u202egpj.exe",
        "..",
        ".",
        "",
        " ",
        "\uff0e\uff0e",
        "\u2024\u2024/\u2024\u2024",
        "Exp",
        "exp-case",
        "EXP-CASE",
    ]
    roles = ["../../../../r", f"/tmp/abs-role-{tag}", "r" * 5000, "ro\0le", "\u202etrainer", "trainer/../..", "."]
    replicas: list[str | None] = ["a/b/../c", "../..", None, "\n", "/", "0"]
    return [(e, roles[i % len(roles)], replicas[i % len(replicas)]) for i, e in enumerate(experiments)]


def tree(root: Path) -> set[Path]:
    return set(root.rglob("*")) if root.exists() else set()


def assert_contained(tmp_path: Path, allowed: list[Path], before_parent: set[str]) -> list[Path]:
    """Every entry under tmp_path is under an allowed root with safe, bounded names; nothing leaked."""
    assert set(os.listdir(tmp_path.parent)) == before_parent, "an entry appeared next to tmp_path"
    created = sorted(tree(tmp_path))
    for path in created:
        if any(path == root or root in path.parents for root in allowed):
            continue
        assert any(path in root.parents for root in allowed), f"{path} is outside the configured directories"
    for path in created:
        for part in path.relative_to(tmp_path).parts:
            assert ".." not in part and part.isascii() and part.isprintable(), repr(part)
            assert len(part.encode()) <= 160, part
    return created
