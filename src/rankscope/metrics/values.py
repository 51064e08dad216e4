"""Value and key checks for ``record_metric``: raise at the call site, naming the key."""

from __future__ import annotations

import re
import sys
from numbers import Real
from typing import Any

# OpenTelemetry instrument-name syntax; names are case-insensitive in OTel.
_KEY_RE = re.compile(r"[a-zA-Z][-_./a-zA-Z0-9]{0,254}")


def check_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"record_metric: key must be a str, got {type(key).__name__} ({key!r})")
    if not key:
        raise ValueError("record_metric: key must not be empty")
    if _KEY_RE.fullmatch(key) is None:
        raise ValueError(
            f"record_metric: key {key!r} is not a valid metric name: start with a letter, then up to "
            "254 of [a-zA-Z0-9_.-/] (OpenTelemetry instrument-name rules)"
        )
    return key


_UNIT_RE = re.compile(r"\(([^()]*)\)")
_INVALID_RE = re.compile(r"[^-_./a-zA-Z0-9]+")
_UNDERSCORES_RE = re.compile(r"__+")


def as_metric_name(key: str) -> str | None:
    """A framework's log key as a metric name, or None when none is left of it.

    Frameworks log keys OTel does not take (``throughput(tps)``, ``mfu(%)``, ``reward/mean@4``):
    a unit in parentheses becomes a suffix (``throughput_tps``, ``mfu_pct``), ``@`` reads ``_at``,
    any other run of invalid characters one ``_`` (never two in a row). Valid keys are returned
    unchanged.
    """
    if _KEY_RE.fullmatch(key) is not None:
        return key
    name = _UNIT_RE.sub(lambda unit: "_" + unit.group(1), key.replace("(%)", "(pct)").replace("@", "_at"))
    name = _UNDERSCORES_RE.sub("_", _INVALID_RE.sub("_", name)).strip("_")
    return name if _KEY_RE.fullmatch(name) is not None else None


def to_number(key: str, value: Any) -> Any:
    """Return a float, or a 1-element device tensor to be read at flush (no sync now).

    Accepts int, float, bool, numpy scalars / 1-element arrays, and 0-d or 1-element torch
    tensors. Anything else raises ``TypeError``; a multi-element tensor ``ValueError``.
    """
    if isinstance(value, (bool, int, float)):
        return float(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"record_metric({key!r}): expected a 0-d or 1-element tensor, got shape {tuple(value.shape)}; "
                "reduce it first (e.g. .mean()) or record elements one by one"
            )
        if value.is_complex() or not (value.dtype.is_floating_point or value.dtype in _INT_DTYPES(torch)):
            raise TypeError(f"record_metric({key!r}): unsupported tensor dtype {value.dtype}")
        if value.device.type == "cpu" or value.device.type == "meta":
            if value.device.type == "meta":
                raise ValueError(f"record_metric({key!r}): a meta tensor has no value")
            return float(value.item())
        # Keep it on its device as it is: stacked, detached and copied to the host in one batch
        # at flush (``DeviceValues.start``), off the hot path.
        return value
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, (np.generic, np.ndarray)):
        if isinstance(value, np.ndarray):
            if value.size != 1:
                raise ValueError(f"record_metric({key!r}): expected a 1-element array, got shape {value.shape}")
            value = value.reshape(()).item()
        if isinstance(value, (np.bool_, np.number)) and not isinstance(value, np.complexfloating):
            return float(value)
        if isinstance(value, (bool, int, float)):
            return float(value)
    if isinstance(value, Real):
        return float(value)
    raise TypeError(
        f"record_metric({key!r}): value must be a number (int, float, bool, numpy scalar, or 1-element "
        f"tensor), got {type(value).__name__}"
    )


def _INT_DTYPES(torch: Any) -> frozenset[Any]:  # noqa: N802 - reads like a constant at the call site
    return frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
