"""rankscope's OpenTelemetry instrumentors, one module per target; each follows the contrib
``BaseInstrumentor`` contract and is registered under the ``opentelemetry_instrumentor``
entry point group (the name in parentheses), so ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``
turns it off:

- ``OptimizerInstrumentor`` (``torch_optimizer``): optimizer-step spans, lr, grad norm, steps
- ``DataLoaderInstrumentor`` (``torch_dataloader``): data-loading wait
- ``CollectivesInstrumentor`` (``torch_distributed``): collective duration, bytes, op, group size
- ``CheckpointInstrumentor`` (``torch_checkpoint``): torch.save/load and DCP spans with bytes
- ``MemoryInstrumentor`` (``torch_memory``): CUDA memory (and host RSS/CPU) at each flush
- ``GpuHealthInstrumentor`` (``nvml``): NVML utilization, power, temperature, clocks, throttling, errors
- ``MonarchInstrumentor`` (``monarch``): server spans and per-endpoint metrics for actors
- ``TorchElasticInstrumentor`` (``torchelastic``): torchelastic metrics into rankscope
"""

from .checkpoint import CheckpointInstrumentor
from .dataloader import DataLoaderInstrumentor
from .distributed import CollectivesInstrumentor
from .gpu_health import GpuHealthInstrumentor
from .memory import MemoryInstrumentor
from .monarch import MonarchInstrumentor
from .optimizer import OptimizerInstrumentor
from .torchelastic import RankscopeMetricHandler, TorchElasticInstrumentor

INSTRUMENTORS = {
    "torch_optimizer": OptimizerInstrumentor,
    "torch_dataloader": DataLoaderInstrumentor,
    "torch_distributed": CollectivesInstrumentor,
    "torch_checkpoint": CheckpointInstrumentor,
    "torch_memory": MemoryInstrumentor,
    "monarch": MonarchInstrumentor,
    "torchelastic": TorchElasticInstrumentor,
    "nvml": GpuHealthInstrumentor,
}
"""Entry-point name -> instrumentor class (the same names as in pyproject.toml)."""

__all__ = [
    "INSTRUMENTORS",
    "CheckpointInstrumentor",
    "CollectivesInstrumentor",
    "DataLoaderInstrumentor",
    "GpuHealthInstrumentor",
    "MemoryInstrumentor",
    "MonarchInstrumentor",
    "OptimizerInstrumentor",
    "RankscopeMetricHandler",
    "TorchElasticInstrumentor",
]
