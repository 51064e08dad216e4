"""Replacing a library's attribute and putting the original back: what every patch of a library
(an instrumentor's, the collectives' wrappers) uses."""

from __future__ import annotations

from typing import Any


def swap(owner: Any, name: str, replacement: Any, saved: dict[tuple[Any, str], Any]) -> None:
    """Replace ``owner.name``, remembering the original in ``saved`` for ``restore``."""
    saved.setdefault((owner, name), getattr(owner, name))
    setattr(owner, name, replacement)


def restore(saved: dict[tuple[Any, str], Any]) -> None:
    """Put back every original ``swap`` saved in ``saved``, and forget them."""
    for (owner, name), original in saved.items():
        setattr(owner, name, original)
    saved.clear()
