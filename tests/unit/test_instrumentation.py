"""The distro and the instrumentors in process: entry points, instrument/uninstrument, the
collectives wrapped once by the instrumentor and ``init`` together, a closure passed to
``optimizer.step``, and the RL helpers' call-site errors."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

import rankscope as rs
from rankscope.core import runtime as rs_slot
from rankscope.instrumentation import INSTRUMENTORS
from rankscope.integrations.monarch import propagation
from rankscope.tracing import collectives as wrappers


def test_entry_points_register_the_distro_configurator_and_every_instrumentor() -> None:
    assert [e.value for e in entry_points(group="opentelemetry_distro", name="rankscope")] == [
        "rankscope.instrumentation.distro:RankscopeDistro"
    ]
    assert [e.value for e in entry_points(group="opentelemetry_configurator", name="rankscope")] == [
        "rankscope.instrumentation.distro:RankscopeConfigurator"
    ]
    ours = [e for e in entry_points(group="opentelemetry_instrumentor") if e.dist and e.dist.name == "rankscope"]
    registered = {e.name: e.load() for e in ours}
    assert registered == INSTRUMENTORS


def _train_once(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1)))
    for x, y in loader:
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        break
    torch.save(model.state_dict(), tmp_path / "m.pt")


def _recorded() -> set[str]:
    recorder = rs_slot.recorder
    return set() if recorder is None else set(recorder.recorded())


def test_torch_instrumentors_instrument_and_uninstrument_in_process(tmp_path: Path) -> None:
    import torch.distributed as dist
    import torch.distributed.elastic.metrics.api as elastic
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    handler = elastic._default_metrics_handler
    _unwrap_collectives()  # an earlier test's rs.init wrapped them
    originals = (_BaseDataLoaderIter.__next__, torch.save, torch.load, dist.all_reduce, handler)
    rs.init(experiment="instr")  # a program that flushes itself: no automatic steps
    assert dist.all_reduce is not originals[3]  # init instruments the collectives itself
    instrumentors = [cls() for cls in INSTRUMENTORS.values()]
    for instrumentor in instrumentors:
        instrumentor.instrument(force=True)  # force: torchelastic's handler outside torchrun too
    try:
        _train_once(tmp_path)
        elastic.put_metric("restarts.count", 1, "agent")
        recorded = _recorded()
        assert {"optimizer/step_s", "optimizer/steps", "optimizer/lr/group_0"} <= recorded
        assert {"dataloader/wait_s", "dataloader/batches", "checkpoint/save_s", "checkpoint/save_bytes"} <= recorded
        assert "torchelastic/agent/restarts.count" in recorded
        assert propagation.server_spans is True or "monarch._src.actor.actor_mesh" not in sys.modules
        assert _BaseDataLoaderIter.__next__ is not originals[0] and torch.save is not originals[1]
    finally:
        for instrumentor in instrumentors:
            instrumentor.uninstrument()
    assert (_BaseDataLoaderIter.__next__, torch.save, torch.load, dist.all_reduce) == originals[:4]
    assert elastic._default_metrics_handler is originals[4]
    optimizer_module = sys.modules["torch.optim.optimizer"]
    assert not optimizer_module._global_optimizer_pre_hooks
    assert not optimizer_module._global_optimizer_post_hooks
    rs.flush(0)
    _train_once(tmp_path)
    assert _recorded() == set()  # nothing instrumented any more
    for instrumentor in instrumentors:  # and it comes back
        instrumentor.instrument(force=True)
    try:
        _train_once(tmp_path)
        assert "optimizer/steps" in _recorded()
    finally:
        for instrumentor in instrumentors:
            instrumentor.uninstrument()


def _unwrap_collectives() -> None:
    collectives = INSTRUMENTORS["torch_distributed"]()
    if collectives.is_instrumented_by_opentelemetry:
        collectives.uninstrument()
    wrappers.uninstall()


@pytest.mark.parametrize("init_first", [True, False])
def test_the_instrumentor_and_init_wrap_each_collective_once_in_either_order(init_first: bool) -> None:
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    _unwrap_collectives()
    originals = {op: getattr(c10d, op) for op in wrappers.OPS if hasattr(c10d, op)}
    assert originals and not any(hasattr(f, "_rankscope_collective") for f in originals.values())
    instrumentor = INSTRUMENTORS["torch_distributed"]()
    try:
        if init_first:
            rs.init(experiment="once")
        instrumentor.instrument()
        if not init_first:
            rs.init(experiment="once")
        assert wrappers.installed() and instrumentor.is_instrumented_by_opentelemetry
        for op, original in originals.items():
            wrapper = getattr(c10d, op)
            assert wrapper is not original and wrapper.__wrapped__ is original, op  # one wrapper, not two
            if getattr(dist, op, None) is not None:
                assert getattr(dist, op) is wrapper, op
        assert wrappers.install(dist) is False  # a third try wraps nothing either
    finally:
        instrumentor.uninstrument()  # the originals back, whichever path wrapped them
    assert not wrappers.installed()
    assert {op: getattr(c10d, op) for op in originals} == originals
    assert dist.all_reduce is originals["all_reduce"]


def test_rl_helpers_reject_bad_input_at_the_call_site() -> None:
    with pytest.raises(TypeError, match="tokens"):
        rs.rl.generation(tokens=-1)
    with pytest.raises(ValueError, match="direction"):
        rs.rl.weight_sync("sideways")
    with pytest.raises(TypeError, match="version"):
        rs.rl.set_policy_version(1.5)  # type: ignore[arg-type]


def test_a_closure_passed_to_optimizer_step_is_timed_apart() -> None:
    """Lightning runs forward, backward and the loss all-reduce inside ``optimizer.step(closure)``:
    ``optimizer/closure_s`` is that part, ``optimizer/step_s`` the optimizer's own."""
    import time as _time

    from rankscope.instrumentation.optimizer import OptimizerInstrumentor

    rs.init(experiment="closure")
    instrumentor = OptimizerInstrumentor()
    instrumentor.instrument(auto_step=False)  # both steps' values in one rankscope step
    try:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(torch.ones(1, 4)).sum()
            loss.backward()
            _time.sleep(0.05)
            return loss

        returned = optimizer.step(closure=closure)
        assert isinstance(returned, torch.Tensor)  # the closure's value comes back through the wrapper
        optimizer.step(closure)  # positional too
        recorder = rs_slot.recorder
        assert recorder is not None
        closure_s, step_s = recorder.accs["optimizer/closure_s"], recorder.accs["optimizer/step_s"]
        assert closure_s.count == 2 and closure_s.sum >= 0.1
        assert step_s.count == 2 and step_s.sum < 0.05  # the sleep is the closure's, not the step's
    finally:
        instrumentor.uninstrument()
