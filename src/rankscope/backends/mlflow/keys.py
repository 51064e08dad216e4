"""rankscope's keys as MLflow metric, param and tag keys: a documented mapping, collision-free.

MLflow takes a key of at most 250 characters of letters, digits, ``_ - . : /`` and space
(``mlflow.utils.validation``: ``MAX_ENTITY_KEY_LENGTH``, ``validate_param_and_metric_name``)
that is its own normalized path (no ``//``, no ``/./`` or ``..`` segment, no leading or trailing
``/``, not starting with ``..``). The rule, the same as ``core.paths.safe_component``'s:

* A key stays as it is when MLflow takes it (ASCII only here, whatever the server's ``\\w``
  allows) and it does not end in ``-`` plus ten hex digits (the shape of a mapped key).
* Any other key becomes ``PREFIX-HASH``: ``HASH`` is ten hex digits of BLAKE2b of the whole
  key (UTF-8), ``PREFIX`` a readable form of it (every other character as ``_``, each empty,
  ``.`` or ``..`` path segment as ``_``, a leading ``..`` as ``_.``), cut so that the whole
  is at most 250 characters.

Kept keys never have the mapped shape, and mapped keys differ in their hash, so two keys share
an MLflow key only if two BLAKE2b hashes agree in 40 bits. The view records what it mapped
(``KeyMap.mapped``: the artifact ``rankscope/keys.json``).
"""

from __future__ import annotations

import hashlib
import re

MAX_KEY = 250
"""MLflow's ``MAX_ENTITY_KEY_LENGTH``: a metric's, param's or tag's key."""

_HASH_CHARS = 10
_ALLOWED = re.compile(r"[A-Za-z0-9_\-.:/ ]*")
_OTHER = re.compile(r"[^A-Za-z0-9_\-.:/ ]")
_MAPPED_TAIL = re.compile(rf"-[0-9a-f]{{{_HASH_CHARS}}}\Z")


def taken_as_is(key: str) -> bool:
    """Whether MLflow takes ``key`` unchanged and it cannot be mistaken for a mapped key."""
    if not key or len(key) > MAX_KEY or not _ALLOWED.fullmatch(key) or _MAPPED_TAIL.search(key):
        return False
    return not key.startswith("..") and all(part not in ("", ".", "..") for part in key.split("/"))


def mlflow_key(key: str) -> str:
    """``key`` as MLflow takes it: itself when it can be, else ``PREFIX-HASH`` (module docstring)."""
    if taken_as_is(key):
        return key
    room = MAX_KEY - _HASH_CHARS - 1
    text = _OTHER.sub("_", key[: 4 * room])
    parts = ["_" if part in ("", ".", "..") else part for part in text.split("/")]
    prefix = "/".join(parts)[:room]
    if prefix.endswith("/"):  # the cut ended on a segment boundary: the hash is not a segment of its own
        prefix += "_"
    if prefix.startswith(".."):
        prefix = "_" + prefix[1:]
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=_HASH_CHARS // 2).hexdigest()
    return f"{prefix}-{digest}"


class KeyMap:
    """The MLflow key of each rankscope key, cached; ``mapped``: the keys that changed (MLflow key
    → rankscope key), at most ``max_recorded`` of them recorded (``overflow`` counts the rest)."""

    def __init__(self, max_recorded: int = 100_000) -> None:
        self._cache: dict[str, str] = {}
        self.mapped: dict[str, str] = {}
        self.max_recorded = max_recorded
        self.overflow = 0
        self.changed = False
        """A key was mapped since the record was last taken (``taken``)."""

    def __call__(self, key: str) -> str:
        found = self._cache.get(key)
        if found is None:
            found = mlflow_key(key)
            if len(self._cache) < 4 * self.max_recorded:
                self._cache[key] = found
            if found != key and found not in self.mapped:
                if len(self.mapped) < self.max_recorded:
                    self.mapped[found] = key
                    self.changed = True
                else:
                    self.overflow += 1
        return found

    def taken(self) -> dict[str, str]:
        """The record to upload now (a copy); ``changed`` is reset."""
        self.changed = False
        return dict(self.mapped)
