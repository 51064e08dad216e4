"""Client-chosen names as file-name components: names never become paths.

Experiment ids, roles, replicas and process labels come from clients (``../../x``, ``/tmp/x``,
NUL, newlines, bidi overrides, 10,000 characters). Every file or directory the SDK or the
sink creates from such a name takes its component from :func:`safe_component`; the data
written keeps the original name. The operator's own settings (a backend's ``path`` template,
``logdir``, ``dir``) are trusted and used as given.

The rule, so that distinct names never share a file:

* A name stays as it is when it is already *plain*: at most ``max_len`` characters of
  ``[a-z0-9._-]``, starting with a letter, digit or ``_``, without ``..``, not ending in
  ``.``, and not ending in ``-`` plus ten hex digits (the shape of a hashed component).
* Any other name becomes ``PREFIX-HASH``: ``HASH`` is ten hex digits of BLAKE2b of the
  original name (UTF-8, lone surrogates passed through), ``PREFIX`` a readable form of it
  (compatibility-decomposed (NFKD), accents dropped, runs of other characters as ``_``,
  runs of dots as one, ``._-`` stripped from both ends, ``_`` if nothing is left), cut so
  the whole is at most ``max_len`` characters.

Plain outputs never have the hashed shape, and hashed outputs differ in their hash, so two
names share a component only if two BLAKE2b hashes agree in 40 bits: never by accident
(a deliberate collision is possible, but a client that can send data can already write
into any experiment). Capitals count as not plain, so names differing only in case also
get different components on case-insensitive file systems (macOS, Windows).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path

_HASH_CHARS = 10
_PLAIN = re.compile(r"[a-z0-9_](?:[a-z0-9_-]|\.(?!\.))*(?<!\.)")
_HASHED_TAIL = re.compile(rf"-[0-9a-f]{{{_HASH_CHARS}}}\Z")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")
_DOTS = re.compile(r"\.{2,}")


def safe_component(name: str, max_len: int = 64) -> str:
    """``name`` as one file-name component: itself when plain, else a readable prefix plus a hash.

    Pure and total: any ``str`` gives a non-empty ASCII string of at most ``max_len``
    characters from ``[A-Za-z0-9._-]`` that is never ``.``/``..``, never contains ``..``
    and never starts with ``.`` or ``-``. Distinct names give distinct components (see the
    module docstring for the rule).
    """
    if max_len < _HASH_CHARS + 2:
        raise ValueError(f"safe_component: max_len must be at least {_HASH_CHARS + 2}, got {max_len}")
    if len(name) <= max_len and _PLAIN.fullmatch(name) and not _HASHED_TAIL.search(name):
        return name
    room = max_len - _HASH_CHARS - 1
    # Decompose a bounded slice only: the prefix is for reading, the hash covers the whole name.
    text = unicodedata.normalize("NFKD", name[: 4 * room])
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = _DOTS.sub(".", _UNSAFE_RUN.sub("_", text)).strip("._-")
    prefix = text[:room].rstrip("._-") or "_"
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=_HASH_CHARS // 2).hexdigest()
    return f"{prefix}-{digest}"


def shown_path(path: str) -> Path:
    """A path as a sink wrote it (absolute), shown from the current directory when it is below it."""
    found = Path(path)
    try:
        return found.resolve().relative_to(Path.cwd().resolve())
    except (OSError, ValueError):
        return found
