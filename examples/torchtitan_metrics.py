"""torchtitan's metrics and traced phases in one rankscope experiment (CPU, gloo, two ranks).

    TITAN_STRUCT_LOGGER_HANDLERS=rankscope.torchtitan.register_handler \\
      torchrun --nproc_per_node=2 examples/torchtitan_metrics.py

In a real torchtitan job the two lines that matter are a trainer config's
``metrics=RankscopeMetricsProcessor.Config(...)`` and the environment variable above; the job runs
as usual. torchtitan 0.3's ``Trainer`` needs CUDA (its ``MetricsProcessor`` reads the device's memory
when it is built), so on CPU this script runs torchtitan's step the way ``Trainer.train_step`` does,
around a tiny model: torchtitan's structured logger (``set_step``, ``log_trace_span``,
``log_trace_scalar``), its loss reductions (``dist_sum``/``dist_max`` over a device mesh) and
``RankscopeMetricsProcessor`` built from its ``Config``, with a CPU stand-in for the memory monitor.
The embedded sink prints each step's global view (rankscope's console backend); each rank its loss.
"""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torchtitan.components import metrics as titan_metrics
from torchtitan.distributed import ParallelDims
from torchtitan.distributed import utils as dist_utils
from torchtitan.observability import structured_logger as sl

from rankscope.torchtitan import RankscopeMetricsProcessor

SEQ_LEN, BATCH, VOCAB = 16, 4, 64


class CpuMemoryMonitor:
    """torchtitan's ``DeviceMemoryMonitor`` reads CUDA's allocator; on CPU: this process's peak RSS."""

    device_name = "cpu"

    def get_peak_stats(self) -> Any:
        import resource

        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return titan_metrics.DeviceMemStats(peak_gib, 0.0, peak_gib, 0.0, 0, 0)

    def reset_peak_stats(self) -> None:
        pass


def build(out: str, log_freq: int = 1) -> RankscopeMetricsProcessor:
    """The processor as torchtitan's ``Trainer`` builds it (``config.metrics.build``)."""
    titan_metrics.build_device_memory_monitor = CpuMemoryMonitor  # the CUDA-only part, stood in
    world = dist.get_world_size()
    parallel_dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=1, world_size=world)
    # torchtitan logs tokens/s per device; the job's tokens/s is their sum over ranks
    config = RankscopeMetricsProcessor.Config(log_freq=log_freq, rankscope_reduces={"throughput(tps)": "sum"})
    processor: RankscopeMetricsProcessor = config.build(parallel_dims=parallel_dims, dump_folder=out)
    return processor


def train(steps: int, out: str) -> list[dict[str, float]]:
    """``steps`` torchtitan-shaped steps; returns what this rank's metrics processor logged, per step."""
    rank = dist.get_rank()
    sl.init_structured_logger(source="trainer", output_dir=out, rank=rank)
    processor = build(out)
    logged: list[dict[str, float]] = []
    processor.logger.add_logger(_Keep(logged))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("batch",))
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    processor.num_flops_per_token = 6 * sum(p.numel() for p in model.parameters())
    ntokens_seen = 0
    for step in range(1, steps + 1):
        sl.set_step(step)
        with sl.log_trace_span("step"):
            optimizer.zero_grad()
            with sl.log_trace_span("fetching_batch"):
                start = time.perf_counter()
                tokens = torch.randint(0, VOCAB, (BATCH, SEQ_LEN + 1))
                processor.ntokens_since_last_log += BATCH * SEQ_LEN
                processor.data_loading_times.append(time.perf_counter() - start)
            local_tokens = BATCH * SEQ_LEN * (rank + 1)  # ranks see different token counts
            sl.log_trace_scalar({"local_valid_tokens": local_tokens})
            ntokens_seen += local_tokens
            with sl.log_trace_span("fwd_bwd"):
                logits = model(tokens[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                loss.backward()
            with sl.log_trace_span("optim"):
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            with sl.log_trace_span("collect_dist_metrics"):
                local = loss.detach()
                global_avg = dist_utils.dist_sum(local / dist.get_world_size(), mesh)
                global_max = dist_utils.dist_max(local, mesh)
                seen = dist_utils.dist_sum(torch.tensor(ntokens_seen), mesh)
            processor.log(step, global_avg, global_max, float(grad_norm), extra_metrics={"n_tokens_seen": seen})
    processor.close()
    return logged


class _Keep(titan_metrics.BaseLogger):  # type: ignore[misc]
    """A logger beside rankscope's in torchtitan's container: what this rank logged, for the printout."""

    def __init__(self, into: list[dict[str, float]]) -> None:
        self.into = into

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.into.append({"step": step, **metrics})


if __name__ == "__main__":
    import rankscope

    rankscope.init(
        experiment="torchtitan-example", role="trainer", backends={"console": {"logging_mode": "global_reduce"}}
    )
    dist.init_process_group("gloo")
    with tempfile.TemporaryDirectory() as tmp:
        for entry in train(int(sys.argv[1]) if len(sys.argv) > 1 else 3, tmp):
            print(f"rank {dist.get_rank()} step {entry['step']}: loss {entry['loss_metrics/global_avg_loss']:.4f}")
    dist.destroy_process_group()
    rankscope.shutdown()
