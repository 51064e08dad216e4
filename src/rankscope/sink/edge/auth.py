"""Who may talk to the sink, and for which experiments: bearer tokens, checked the same way by both transports.

``Authorization: Bearer <token>`` (the scheme in any case). A sink has the one ``--token``
(every experiment: ``checked.ALL``), scoped tokens (``--tokens FILE``: each may write only the
experiments its scope names or prefixes, ``load_tokens``; no two scopes share an experiment),
both, or neither (then it takes anyone, as one scope). ``Keys.scope_of`` turns a request's
header into the ``checked.Scope`` the transports put on its ``Client``, or None: the gRPC
transport reads the header from the call's metadata, the HTTP one from the request; both
answer None with ``UNAUTHORIZED`` (401 / UNAUTHENTICATED) before they read anything else. A
header that is not UTF-8 (aiohttp hands its bytes over as surrogate escapes, grpcio as Latin-1)
is a wrong token like any other.

A presented token is looked up by its SHA-256 digest, so the time a lookup takes says nothing
about how much of a real token it matched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

from ..checked import ALL, Limits, Scope, clean_text

log = logging.getLogger("rankscope.sink")

UNAUTHORIZED = "missing or wrong bearer token"

MIN_TOKEN_CHARS = 16
"""A scoped token is at least this long: a token is all that tells one team's clients from another's."""
MAX_TOKEN_CHARS = 4096
"""...and at most this long: a client must be able to present it (an HTTP head is at most 8 KiB)."""
_SCOPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TOKEN = re.compile(r"[\x21-\x7e]+")
"""Printable ASCII without spaces: what an HTTP header and gRPC metadata carry as sent."""
SEPARATORS = "-_./"
"""What a prefix of a tokens file ends in before its ``*`` (``grpo-*``, not ``grpo*``): a prefix
without one also takes every id that only begins alike (``team-a*`` takes ``team-ab-x``)."""


def _presented(header: str | bytes | None) -> bytes | None:
    """The token a header carries (``Bearer <token>``, the scheme in any case), as bytes; None if none."""
    if header is None:
        return None
    if isinstance(header, str):
        try:  # aiohttp decodes header bytes that are not UTF-8 as surrogate escapes: back to those bytes
            header = header.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return None
    scheme, _, token = header.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


SAY_REFUSED_EVERY = 60.0
"""Seconds between two log lines about requests refused for their token (each says how many)."""


class Keys:
    """The sink's tokens and the scope each one writes for; the requests refused for their token,
    told to ``on_refused`` (the status route's ``connections`` count them) and logged at most once
    a minute (a job sending with a wrong token is otherwise seen nowhere at the sink)."""

    def __init__(
        self,
        token: str | None = None,
        tokens: Mapping[str, Scope] | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self._on_refused = on_refused
        self._unsaid = 0
        self._said_at = -SAY_REFUSED_EVERY
        self._scopes: dict[bytes, Scope] = {}
        if token:
            self._scopes[_digest(token.encode())] = ALL
        for secret, scope in (tokens or {}).items():
            key = _digest(secret.encode())
            if key in self._scopes:
                raise ValueError(f"the token of {scope.label} is also the sink's --token or another scope's")
            self._scopes[key] = scope
        overlap = overlapping((tokens or {}).values())
        if overlap is not None:
            raise ValueError(overlap)
        self.open = not self._scopes
        """No token at all: everyone is one scope (``ALL``)."""

    def scope_of_headers(self, headers: Sequence[str | bytes]) -> Scope | None:
        """The scope of a request's ``Authorization`` headers (``scope_of``): None unless exactly one
        is given (two would be read differently by different proxies and transports)."""
        if self.open:
            return ALL
        scope = self.scope_of(headers[0]) if len(headers) == 1 else None
        if scope is None:
            self._refused()
        return scope

    def _refused(self) -> None:
        """A request answered ``UNAUTHORIZED`` (on its transport's event loop): counted, said now and then."""
        if self._on_refused is not None:
            self._on_refused()
        self._unsaid += 1
        now = time.monotonic()
        if now - self._said_at >= SAY_REFUSED_EVERY:
            log.warning(
                "rankscope sink: answered %d request(s) with a missing or wrong bearer token "
                "(401 / UNAUTHENTICATED) since the last such line (at most one a minute); the status "
                "route counts them all (connections: unauthorized)",
                self._unsaid,
            )
            self._said_at, self._unsaid = now, 0

    def scope_of(self, header: str | bytes | None) -> Scope | None:
        """The scope of the token ``header`` carries; None: missing or wrong (answered ``UNAUTHORIZED``)."""
        if self.open:
            return ALL
        token = _presented(header)
        return None if token is None else self._scopes.get(_digest(token))


def authorized(expected: str | None, header: str | bytes | None) -> bool:
    """Whether ``header`` carries the sink's one token (``expected``; None: the sink takes anyone)."""
    return Keys(expected).scope_of(header) is not None


def load_tokens(path: Path) -> dict[str, Scope]:
    """Scoped tokens from a file (``rankscope sink --tokens FILE``, ``RANKSCOPE_SINK_TOKENS``): TOML
    when its name ends in ``.toml``, else JSON, of this shape::

        [scopes.rl-team]                       # {"scopes": {"rl-team": {
        tokens = ["<a secret of 16+ chars>"]   #    "tokens": ["..."],
        experiments = ["grpo-*", "eval-qwen"]  #    "experiments": ["grpo-*", "eval-qwen"]}}}

    ``experiments``: exact experiment ids, or prefixes ending in a separator and ``*`` (one of
    ``SEPARATORS``: ``grpo-*``, ``team-a/*``; the lone ``"*"``: all). An experiment is one scope's:
    a file where two scopes can match one id (the same id, an id under another's prefix, a prefix
    under another's prefix, ``"*"`` beside any other scope) is refused (``overlapping``). Raises
    ``ValueError`` naming the file and what is wrong with it (for an overlap: both scopes and the
    pair of entries)."""
    text = path.read_text()
    try:
        found: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text, object_pairs_hook=_unique)
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}") from None
    if path.stat().st_mode & 0o077:
        log.warning("rankscope sink: %s can be read by other users of this machine; chmod 600 it", path)
    scopes = found.get("scopes") if isinstance(found, dict) else None
    if not isinstance(scopes, dict) or not scopes:
        raise ValueError(f"{path}: no scopes (a table 'scopes' of name -> tokens and experiments)")
    tokens: dict[str, Scope] = {}
    for name, entry in scopes.items():
        where = f"{path}: scope {str(name)[:64]!r}"
        scope, secrets = _scope(where, name, entry)
        for secret in secrets:
            if secret in tokens:
                raise ValueError(f"{where}: a token of it is also {tokens[secret].label}'s")
            tokens[secret] = scope
    overlap = overlapping(tokens.values())
    if overlap is not None:
        raise ValueError(f"{path}: {overlap}")
    return tokens


def overlapping(scopes: Iterable[Scope]) -> str | None:
    """Why these scopes cannot serve one sink: two of them can both match one experiment id
    (``Scope.overlap``), so either could read the other's experiment, write its report page, take
    its run ids first or post its views first; None when every experiment is at most one scope's."""
    distinct = list(dict.fromkeys(scopes))
    for i, one in enumerate(distinct):
        for other in distinct[i + 1 :]:
            found = one.overlap(other)
            if found is None:
                continue
            mine, theirs, common = found
            example = f"experiment {common[:64]!r}" if common else "every experiment"
            return (
                f"{one.label} and {other.label} overlap: {mine[:64]!r} and {theirs[:64]!r} both match {example} "
                "(an experiment is one scope's: give each scope ids and prefixes no other scope's can match)"
            )
    return None


def _scope(where: str, name: Any, entry: Any) -> tuple[Scope, list[str]]:
    """One scope of a tokens file, and its tokens; ``ValueError`` naming what is wrong (``where``)."""
    if not isinstance(name, str) or not _SCOPE_NAME.fullmatch(name):
        raise ValueError(f"{where}: a scope's name is 1-64 characters of [A-Za-z0-9._-]")
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: each scope is a table of tokens and experiments")
    if "token" in entry and "tokens" in entry:
        raise ValueError(f"{where}: give 'tokens' (a list) or 'token', not both")
    secrets = entry.get("tokens", [entry["token"]] if "token" in entry else None)
    experiments = entry.get("experiments")
    if not isinstance(secrets, list) or not secrets:
        raise ValueError(f"{where}: 'tokens' must be a non-empty list of strings")
    if not isinstance(experiments, list) or not experiments:
        raise ValueError(f"{where}: 'experiments' must be a non-empty list of experiment ids or prefixes (x*)")
    for e in experiments:
        if not isinstance(e, str) or not e or "*" in e[:-1]:
            raise ValueError(f"{where}: experiment {str(e)[:64]!r}: an id, or a prefix with one '*' at its end")
        _check_entry(where, e)
    for secret in secrets:
        if not isinstance(secret, str) or not MIN_TOKEN_CHARS <= len(secret) <= MAX_TOKEN_CHARS:
            raise ValueError(
                f"{where}: each token is at least {MIN_TOKEN_CHARS} and at most {MAX_TOKEN_CHARS} characters"
            )
        if not _TOKEN.fullmatch(secret):
            raise ValueError(f"{where}: each token is printable ASCII characters, no spaces")
    return Scope(name, tuple(experiments)), secrets


def _check_entry(where: str, entry: str) -> None:
    """An id or prefix of a scope: text an experiment id may hold (``checked.clean_text``, as the
    OTLP edge checks ids), and a prefix ends in a separator before its ``*`` (``SEPARATORS``) unless
    it is the lone ``*``."""
    text = entry.removesuffix("*")
    limit = Limits().max_id_chars
    if text and clean_text(text, limit) is None:
        shown = f"of {len(text)} characters" if len(text) > limit else repr(text[:64])
        raise ValueError(f"{where}: experiment {shown}: over {limit} characters or holds control characters")
    if entry.endswith("*") and text and text[-1] not in SEPARATORS:
        raise ValueError(
            f"{where}: prefix {entry[:64]!r} has no separator before its '*' (one of {' '.join(SEPARATORS)}), "
            f"so it would also take ids that only begin alike ({text[:64] + 'b'!r}...): write {text[:64] + '-*'!r}"
        )


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each named once (a scope named twice is a mistake, not "the last wins")."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"{key[:64]!r} is named twice")
        found[key] = value
    return found
