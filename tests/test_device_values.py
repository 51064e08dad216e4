"""A step's device tensors are read in one batch at flush: stacked per (device, shape rank, dtype),
detached, converted to float64 and copied at once; each value lands under its own key.

CPU tensors play the device here (the batching is the same torch calls; on CUDA the copy also
goes through pinned memory behind an event: ``tests/test_cuda.py`` on a GPU)."""

from __future__ import annotations

import torch

from rankscope.metrics.recorder import DeviceValues


def test_mixed_shapes_dtypes_and_autograd_tensors_are_read_in_one_batch_each_under_its_key() -> None:
    values = DeviceValues()
    recorded = {
        "loss": torch.tensor(1.5, requires_grad=True) * 2,  # has an autograd node: no_grad at flush
        "tokens": torch.tensor([2]),
        "ok": torch.tensor(True),
        "scale": torch.tensor([[4.25]], dtype=torch.float16),
        "count": torch.tensor(7, dtype=torch.int64),
        "loss2": torch.tensor(0.25),
    }
    for key, tensor in recorded.items():
        values.keys.append(key)
        values.tensors.append(tensor)
        values.times.append(0.0)
    values.start()
    assert values.tensors == []  # the originals are released at flush
    assert dict(zip(values.keys, values.values(), strict=True)) == {
        "loss": 3.0,
        "tokens": 2.0,
        "ok": 1.0,
        "scale": 4.25,
        "count": 7.0,
        "loss2": 0.25,
    }
