"""Throughput and MFU: tokens/s from the token counts you record, MFU against the GPU's peak.

    rs.throughput.record_tokens(batch.numel(), flops_per_token=6 * n_params)

records ``throughput/tokens`` (SUM) and, at every flush, ``throughput/tokens_per_s`` (this
process's rate; SUM across processes = the job's rate) and ``throughput/mfu`` (achieved
FLOP/s over the device's dense peak from ``PEAK_FLOPS``). A device missing from the table
gets no MFU and one warning saying so: rankscope does not guess a peak.
"""

from __future__ import annotations

import sys

from .core.errors import warn
from .metrics.rates import RateMeter
from .metrics.recording import record_metric
from .metrics.reduce import Reduce

PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # (substring of torch.cuda.get_device_name(), dense peak FLOP/s per dtype); first match wins.
    ("GB200", {"bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5.0e15}),
    ("B200", {"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15}),
    ("B100", {"bf16": 1.75e15, "fp16": 1.75e15, "fp8": 3.5e15}),
    ("H200", {"bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12}),
    ("H100 NVL", {"bf16": 835.5e12, "fp16": 835.5e12, "fp8": 1671e12}),
    ("H100 PCIe", {"bf16": 756.5e12, "fp16": 756.5e12, "fp8": 1513e12}),
    ("H100", {"bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12}),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H800", {"bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12}),
    ("A800", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12}),
    ("L40S", {"bf16": 362.05e12, "fp16": 362.05e12, "fp8": 733e12}),
    ("MI355X", {"bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5.0e15}),
    ("MI325X", {"bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12}),
    ("MI300X", {"bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12}),
    ("MI250X", {"bf16": 383e12, "fp16": 383e12}),
)

_SUM, _MEAN = Reduce.SUM, Reduce.MEAN


def peak_flops(device_name: str | None = None, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of a GPU (default: the current CUDA device), or None when unknown."""
    if device_name is None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    for pattern, peaks in PEAK_FLOPS:
        if pattern in device_name:
            return peaks.get(dtype)
    return None


def transformer_flops_per_token(num_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Training FLOPs per token of a dense transformer: 6·N for the matmuls plus 12·L·H·S for
    attention scores (forward + backward), as torchtitan and the PaLM paper count them."""
    return 6.0 * num_params + 12.0 * num_layers * hidden_size * seq_len


class _Mfu:
    def __init__(self) -> None:
        self.flops_per_token: float | None = None
        self.peak: float | None = None
        self.peak_checked = False

    def at_rate(self, tokens_per_s: float) -> None:
        if self.flops_per_token is None:
            return
        if not self.peak_checked:
            self.peak_checked = True
            if self.peak is None:
                self.peak = peak_flops()
            if self.peak is None:
                torch = sys.modules.get("torch")
                cuda = torch is not None and torch.cuda.is_available()
                device = torch.cuda.get_device_name() if cuda else "no CUDA device"  # type: ignore[union-attr]
                warn(
                    f"rankscope: peak FLOPs unknown for {device!r}; throughput/mfu is not recorded "
                    "(pass peak_flops= to record_tokens)",
                )
        if self.peak:
            record_metric("throughput/mfu", tokens_per_s * self.flops_per_token / self.peak, _MEAN)


_mfu = _Mfu()
_tokens = RateMeter("throughput/tokens_per_s", on_rate=_mfu.at_rate)


def record_tokens(count: int, *, flops_per_token: float | None = None, peak_flops: float | None = None) -> None:
    """Count ``count`` tokens trained on in this step (cheap: call it every micro-batch).

    Args:
        count: tokens processed by this process.
        flops_per_token: training FLOPs per token (see ``transformer_flops_per_token``);
            enables ``throughput/mfu``.
        peak_flops: override the device's peak FLOP/s (default: ``PEAK_FLOPS`` for the
            current CUDA device, bf16).
    """
    if flops_per_token is not None:
        _mfu.flops_per_token = float(flops_per_token)
    if peak_flops is not None:
        _mfu.peak, _mfu.peak_checked = float(peak_flops), False
    record_metric("throughput/tokens", count, _SUM)
    _tokens.add(count)


__all__ = ["PEAK_FLOPS", "peak_flops", "record_tokens", "transformer_flops_per_token"]
