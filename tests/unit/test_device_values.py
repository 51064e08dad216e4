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
        values.items.append((key, tensor))
        values.times.append(0.0)
    values.start()
    assert values.items == []  # the originals are released at flush
    assert dict(zip(values.keys, values.values(), strict=True)) == {
        "loss": 3.0,
        "tokens": 2.0,
        "ok": 1.0,
        "scale": 4.25,
        "count": 7.0,
        "loss2": 0.25,
    }


def test_each_dtype_group_is_widened_to_float64_before_the_groups_are_joined() -> None:
    """An int64 count next to a bf16/fp16 value in one step: joining first would round it."""
    values = DeviceValues()
    for key, tensor in {
        "count": torch.tensor(123456789, dtype=torch.int64),
        "half": torch.tensor(0.5, dtype=torch.float16),
        "bf16": torch.tensor(1.5, dtype=torch.bfloat16),
        "big": torch.tensor(2**24 + 1, dtype=torch.int64),
        "f32": torch.tensor(0.25, dtype=torch.float32),
    }.items():
        values.items.append((key, tensor))
        values.times.append(0.0)
    values.start()
    got = dict(zip(values.keys, values.values(), strict=True))
    assert got == {"count": 123456789.0, "half": 0.5, "bf16": 1.5, "big": float(2**24 + 1), "f32": 0.25}


def test_a_device_value_whose_accumulator_went_to_the_next_step_still_counts() -> None:
    """A take on another thread between ``record_metric``'s two steps (keep the tensor, make the
    key's accumulator) leaves the value in one step and its accumulator in the next: the export
    thread makes one for it instead of failing the whole step."""
    from rankscope.metrics.recorder import Recorder, StepBatch
    from rankscope.metrics.reduce import Reduce

    recorder = Recorder(streams=[])
    recorder.record("device_sum", 1.0, Reduce.SUM)  # the key is known, with its reduce
    batch = StepBatch(0, 0, 1, {}, DeviceValues(items=[("device_sum", torch.tensor(2.5))]))
    assert batch.device is not None
    batch.device.start()
    recorder.stream_device_values(batch, batch.device.values())
    assert batch.accs["device_sum"].get_state() == {"reduction_type": "sum", "sum": 2.5}
