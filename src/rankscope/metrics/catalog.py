"""The standard metrics rankscope's instrumentors and helpers emit: name, unit, reduce, role.

One table, used three ways: the helpers take their names from it, the exporter sends each
metric's UCUM unit on the wire, and ``catalog_markdown()`` is the table in the docs (``docs/instrumentation.md``,
generated when the site is built). ``{op}``, ``{Class}.{endpoint}``, ``{i}`` and ``{group}/{name}``
stand for the operation, actor endpoint, param group and torchelastic metric.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.names import META_PREFIX, STRAGGLER_PREFIX
from .reduce import Reduce


@dataclass(frozen=True)
class MetricSpec:
    """One standard metric."""

    name: str
    unit: str
    """UCUM: ``s``, ``By``, ``1``, ``{token}`` ..."""
    reduce: Reduce
    role: str
    """Which role emits it (``any``: every role that runs the instrumented code)."""
    source: str
    """The instrumentor or helper that records it."""
    description: str


_S, _SUM, _MEAN, _MAX, _DIST = "s", Reduce.SUM, Reduce.MEAN, Reduce.MAX, Reduce.DISTRIBUTION
_OPT, _DL, _COMM = "torch_optimizer", "torch_dataloader", "torch_distributed"
_CKPT, _MEM, _NVML = "torch_checkpoint", "torch_memory", "nvml"
_TP, _RL, _MON, _TE = "rs.throughput", "rs.rl", "monarch", "torchelastic"

CATALOG: tuple[MetricSpec, ...] = (
    # trainer: torch instrumentors
    MetricSpec("optimizer/step_s", _S, _MEAN, "trainer", _OPT, "wall time of optimizer.step(), its closure excluded"),
    MetricSpec("optimizer/closure_s", _S, _MEAN, "trainer", _OPT, "wall time of the closure given to optimizer.step()"),
    MetricSpec("optimizer/step_max_s", _S, _MAX, "trainer", _OPT, "slowest optimizer.step() in the step"),
    MetricSpec("optimizer/steps", "{step}", _SUM, "trainer", _OPT, "optimizer steps taken (policy update frequency)"),
    MetricSpec("optimizer/lr/group_{i}", "1", _MEAN, "trainer", _OPT, "learning rate of param group i"),
    MetricSpec("optimizer/grad_norm", "1", _MAX, "trainer", _OPT, "L2 norm of this rank's gradients (opt-in)"),
    MetricSpec("dataloader/wait_s", _S, _MEAN, "trainer", _DL, "time waiting for the next batch"),
    MetricSpec("dataloader/wait_max_s", _S, _MAX, "trainer", _DL, "longest wait for a batch in the step"),
    MetricSpec("dataloader/batches", "{batch}", _SUM, "trainer", _DL, "batches taken"),
    MetricSpec("comm/{op}/duration_s", _S, _MEAN, "trainer", _COMM, "time to completion (CUDA events on GPU)"),
    MetricSpec("comm/{op}/duration_max_s", _S, _MAX, "trainer", _COMM, "slowest collective of that op in the step"),
    MetricSpec("comm/{op}/bytes", "By", _SUM, "trainer", _COMM, "bytes of the collective's input tensors"),
    MetricSpec("comm/{op}/calls", "{call}", _SUM, "trainer", _COMM, "collectives issued"),
    MetricSpec("checkpoint/save_s", _S, _MAX, "trainer", _CKPT, "torch.save / torch.distributed.checkpoint.save time"),
    MetricSpec("checkpoint/save_bytes", "By", _SUM, "trainer", _CKPT, "bytes written"),
    MetricSpec("checkpoint/load_s", _S, _MAX, "trainer", _CKPT, "torch.load / torch.distributed.checkpoint.load time"),
    MetricSpec("checkpoint/load_bytes", "By", _SUM, "trainer", _CKPT, "bytes read"),
    MetricSpec("gpu/utilization", "%", Reduce.MIN, "any", _NVML, "GPU busy time (NVML), the idlest rank"),
    MetricSpec("gpu/memory_bandwidth_utilization", "%", Reduce.MIN, "any", _NVML, "memory busy time (NVML)"),
    MetricSpec("gpu/power_w", "W", _MAX, "any", _NVML, "board power draw (NVML)"),
    MetricSpec("gpu/temperature_c", "Cel", _MAX, "any", _NVML, "GPU temperature (NVML)"),
    MetricSpec("gpu/sm_clock_mhz", "MHz", Reduce.MIN, "any", _NVML, "SM clock (NVML), the most throttled rank"),
    MetricSpec("gpu/throttled", "1", _MAX, "any", _NVML, "1 when a clock-throttle reason other than idle is on"),
    MetricSpec("gpu/throttle_reasons", "1", _MAX, "any", _NVML, "NVML clock-throttle reason bitmask"),
    MetricSpec("gpu/ecc_errors", "{error}", _MAX, "any", _NVML, "volatile uncorrected ECC errors (NVML)"),
    MetricSpec("gpu/xid_errors", "{error}", _SUM, "any", _NVML, "critical Xid events since the last flush"),
    MetricSpec("cuda/memory_allocated_bytes", "By", _MAX, "any", _MEM, "allocated by tensors, at flush (CUDA)"),
    MetricSpec("cuda/memory_reserved_bytes", "By", _MAX, "any", _MEM, "reserved by the caching allocator (CUDA)"),
    MetricSpec("cuda/memory_peak_bytes", "By", _MAX, "any", _MEM, "high-water mark of allocated memory (CUDA)"),
    MetricSpec("cuda/alloc_retries", "{retry}", _SUM, "any", _MEM, "allocator retries (cache flushes) in the step"),
    MetricSpec("cuda/ooms", "{oom}", _SUM, "any", _MEM, "out-of-memory errors in the step"),
    MetricSpec("host/rss_bytes", "By", _MAX, "any", _MEM, "resident set size (RANKSCOPE_HOST_METRICS)"),
    MetricSpec("host/cpu_utilization", "1", _MEAN, "any", _MEM, "CPU time / wall time (RANKSCOPE_HOST_METRICS)"),
    MetricSpec("throughput/tokens", "{token}", _SUM, "trainer", _TP, "tokens trained on (rs.throughput.record_tokens)"),
    MetricSpec("throughput/tokens_per_s", "{token}/s", _SUM, "trainer", _TP, "tokens/s: each process's rate, summed"),
    MetricSpec("throughput/mfu", "1", _MEAN, "trainer", _TP, "model FLOPs utilization vs the GPU's peak"),
    # coordination
    MetricSpec("policy/version", "1", _MAX, "trainer", _RL, "newest policy version (rs.rl.set_policy_version)"),
    MetricSpec("trainer/weight_push_s", _S, _MAX, "trainer", _RL, "time to push weights to generators"),
    # generator
    MetricSpec("generator/tokens", "{token}", _SUM, "generator", _RL, "tokens generated"),
    MetricSpec("generator/tokens_per_s", "{token}/s", _SUM, "generator", _RL, "each replica's rate, summed"),
    MetricSpec("generator/requests", "{request}", _SUM, "generator", _RL, "requests served (per replica: per-rank)"),
    MetricSpec("generator/request_latency_s", _S, _DIST, "generator", _RL, "request latency (p50/p90/p99/mean)"),
    MetricSpec("generator/sequence_length", "{token}", _DIST, "generator", _RL, "sequence length distribution"),
    MetricSpec("generator/queue_depth", "{request}", _MAX, "generator", _RL, "requests waiting in a replica's queue"),
    MetricSpec("generator/policy_staleness", "1", _MAX, "generator", _RL, "newest policy version - version used"),
    MetricSpec("generator/weight_pull_s", _S, _MAX, "generator", _RL, "time to pull weights from the trainer"),
    MetricSpec(
        "rl/staleness_tokens_weighted",
        "1",
        _MEAN,
        "trainer",
        _RL,
        "policy versions behind of the samples trained on, weighted by their tokens (`rs.rl.consume`)",
    ),
    MetricSpec("rl/lineage_links_dropped", "{link}", _SUM, "trainer", _RL, "span links over the cap, not added"),
    # replay buffer
    MetricSpec("replay_buffer/size", "{sample}", _MAX, "replay_buffer", _RL, "samples held"),
    MetricSpec("replay_buffer/writes", "{sample}", _SUM, "replay_buffer", _RL, "samples written"),
    MetricSpec("replay_buffer/reads", "{sample}", _SUM, "replay_buffer", _RL, "samples read"),
    MetricSpec("replay_buffer/evictions", "{sample}", _SUM, "replay_buffer", _RL, "samples evicted"),
    MetricSpec("replay_buffer/read_latency_s", _S, _MEAN, "replay_buffer", _RL, "time to retrieve a batch"),
    # every Monarch actor
    MetricSpec("endpoint/{Class}.{endpoint}/calls", "{call}", _SUM, "any actor", _MON, "endpoint calls served"),
    MetricSpec("endpoint/{Class}.{endpoint}/latency_s", _S, _MEAN, "any actor", _MON, "endpoint latency in the actor"),
    MetricSpec("endpoint/{Class}.{endpoint}/latency_max_s", _S, _MAX, "any actor", _MON, "slowest call in the step"),
    MetricSpec("endpoint/{Class}.{endpoint}/failures", "{call}", _SUM, "any actor", _MON, "calls that raised"),
    # torchelastic
    MetricSpec("torchelastic/{group}/{name}", "1", _MEAN, "any", _TE, "put_metric / @prof values (counts: SUM)"),
)

BY_NAME = {spec.name: spec for spec in CATALOG}

_INSTRUMENTORS = (_OPT, _DL, _COMM, _CKPT, _MEM, _NVML, _MON, _TE)

INTERNAL_PREFIXES: tuple[str, ...] = (
    META_PREFIX,  # what a sink or a backend adds about the experiment itself (rankscope/...)
    STRAGGLER_PREFIX,  # the sink's straggler views: straggler/{phase}/..., straggler/comm/{op}/...
    "rl/",  # rs.rl's bookkeeping (lineage links dropped, staleness)
    *sorted({s.name.split("/", 1)[0] + "/" for s in CATALOG if s.source in _INSTRUMENTORS}),  # optimizer/, gpu/ ...
)
"""Key prefixes that are rankscope's, not the user's: the sink's own views and what instrumentors
record. A person's view (the compact console) shows the user's keys first and these not at all."""

PHASE_SUFFIXES = (
    "/duration_avg_s",
    "/duration_max_s",
    "/total_duration_avg_s",
    "/total_duration_max_s",
    "/memory_peak_max_gb",
    "/memory_delta_end_start_avg_gb",
)
"""What ``rs.trace``/``Tracer`` record per phase (Forge's names, ``tracing.tracer``): the phases'
durations, which a person's view shows as the step's time and its slowest process."""


def phase_keys(prefix: str, phase: str | None) -> tuple[str, str]:
    """The MEAN and MAX duration keys of ``rs.trace(prefix)``'s phase ``phase`` (None: the whole block)."""
    if phase is None:
        return f"{prefix}/total_duration_avg_s", f"{prefix}/total_duration_max_s"
    return f"{prefix}/{phase}/duration_avg_s", f"{prefix}/{phase}/duration_max_s"


EXTREME_SUFFIXES = ("/argmax_rank", "/argmin_rank")
"""What a sink adds to a MAX (MIN) key: the rank holding the step's extreme."""


def key_kind(key: str) -> str:
    """``user`` (a key the program recorded), ``phase`` (a traced phase's duration or memory) or
    ``internal`` (rankscope's own: ``INTERNAL_PREFIXES``). A sink's ``{key}/argmax_rank`` is of
    its key's kind."""
    for suffix in EXTREME_SUFFIXES:
        if key.endswith(suffix):
            key = key[: -len(suffix)]
            break
    if key.startswith(INTERNAL_PREFIXES):
        return "internal"
    if key.endswith(PHASE_SUFFIXES):
        return "phase"
    return "user"


def unit_of(key: str) -> str:
    """The UCUM unit of a recorded key ("" when it is not a standard metric)."""
    spec = BY_NAME.get(key)
    if spec is not None:
        return spec.unit
    if key.startswith("endpoint/"):
        return "s" if key.endswith(("latency_s", "latency_max_s")) else "{call}"
    if key.startswith("comm/"):
        return {"bytes": "By", "calls": "{call}"}.get(key.rsplit("/", 1)[-1], "s")
    if key.startswith("optimizer/lr/"):
        return "1"
    return ""


def catalog_markdown() -> str:
    """The catalog as the docs' markdown table (``docs/hooks.py`` puts it in the page)."""
    rows = ["| metric | unit | reduce | role | from | what |", "|---|---|---|---|---|---|"]
    for s in CATALOG:
        rows.append(f"| `{s.name}` | `{s.unit}` | {s.reduce.value} | {s.role} | {s.source} | {s.description} |")
    return "\n".join(rows) + "\n"


__all__ = [
    "BY_NAME",
    "CATALOG",
    "EXTREME_SUFFIXES",
    "INTERNAL_PREFIXES",
    "PHASE_SUFFIXES",
    "MetricSpec",
    "catalog_markdown",
    "key_kind",
    "unit_of",
]
