"""The metric catalog, the throughput/MFU helpers and the torchelastic bridge, in process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import rankscope as rs
from rankscope.metrics.catalog import CATALOG, unit_of
from rankscope.throughput import _tokens as throughput_meter


def test_catalog_units_are_ucum_and_names_are_unique() -> None:
    assert len({spec.name for spec in CATALOG}) == len(CATALOG)
    assert {spec.unit for spec in CATALOG} <= {
        "s",
        "By",
        "1",
        "{token}",
        "{token}/s",
        "{step}",
        "{batch}",
        "{call}",
        "{retry}",
        "{oom}",
        "{request}",
        "{sample}",
        "{link}",
        "%",
        "W",
        "Cel",
        "MHz",
        "{error}",
    }
    assert unit_of("comm/all_gather_into_tensor/bytes") == "By"
    assert unit_of("endpoint/Trainer.train_step/latency_s") == "s"
    assert unit_of("my/own/key") == ""


def test_peak_flops_table_knows_the_usual_gpus_and_never_guesses() -> None:
    assert rs.throughput.peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert rs.throughput.peak_flops("NVIDIA H100 PCIe") == 756.5e12
    assert rs.throughput.peak_flops("NVIDIA H200") == 989.4e12
    assert rs.throughput.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert rs.throughput.peak_flops("NVIDIA B200") == 2.25e15
    assert rs.throughput.peak_flops("AMD Instinct MI300X") == 1307.4e12
    assert rs.throughput.peak_flops("NVIDIA H100 80GB HBM3", "fp8") == 1978.9e12
    assert rs.throughput.peak_flops("NVIDIA GeForce GTX 1080") is None
    assert rs.throughput.transformer_flops_per_token(1000, 2, 8, 16) == 6 * 1000 + 12 * 2 * 8 * 16


def _read(path: Path) -> dict[str, float]:
    return {row["key"]: row["value"] for row in map(json.loads, path.read_text().splitlines())}


def test_tokens_per_second_and_mfu_at_each_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seconds = iter([100.0, 100.5])  # the first token at 100 s, the flush half a second later
    monkeypatch.setattr(throughput_meter, "clock", lambda: next(seconds))
    out = tmp_path / "views.jsonl"
    rs.init(experiment="tput", backends={"jsonl": {"logging_mode": "global_reduce", "path": str(out)}})
    rs.throughput.record_tokens(1000, flops_per_token=6e6, peak_flops=1e12)
    rs.throughput.record_tokens(1000)
    rs.flush(0)
    rs.shutdown()
    values = _read(out)
    assert values["throughput/tokens"] == 2000
    assert values["throughput/tokens_per_s"] == 4000.0
    assert values["throughput/mfu"] == pytest.approx(4000.0 * 6e6 / 1e12)


def test_mfu_on_an_unknown_device_says_so_and_records_nothing(tmp_path: Path) -> None:
    from rankscope import throughput

    out = tmp_path / "views.jsonl"
    rs.init(experiment="nomfu", backends={"jsonl": {"logging_mode": "global_reduce", "path": str(out)}})
    throughput._mfu.peak, throughput._mfu.peak_checked = None, False
    throughput.record_tokens(10, flops_per_token=1.0)
    with pytest.warns(RuntimeWarning, match="peak FLOPs unknown"):
        rs.flush(0)
    rs.shutdown()
    assert "throughput/mfu" not in _read(out) and "throughput/tokens_per_s" in _read(out)


def calculate() -> int:
    time.sleep(0.01)
    return 1


def test_torchelastic_put_metric_and_prof_reach_rankscope_with_run_id_and_restart_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed.elastic.metrics as metrics

    from rankscope.instrumentation import RankscopeMetricHandler

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-42")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    out = tmp_path / "views.jsonl"
    resource = rs.init(backends={"jsonl": {"logging_mode": "global_reduce", "path": str(out)}})
    assert resource is not None
    assert resource.attributes["rankscope.run.id"] == "elastic-42"  # the launch; the experiment is the script
    assert resource.attributes["rankscope.experiment.attempt"] == 2
    metrics.configure(RankscopeMetricHandler(), group="my_app")

    profiled = metrics.prof(calculate, group="my_app")
    try:
        profiled()
        profiled()
        metrics.put_metric("calculate_latency", 7, "my_app")
        rs.flush(0)
    finally:
        metrics.configure(metrics.NullMetricHandler(), group="my_app")
    rs.shutdown()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    values = {row["key"]: row["value"] for row in rows}
    assert {row["run"] for row in rows} == {"elastic-42"}
    assert values["torchelastic/my_app/calculate_latency"] == 7
    assert values["torchelastic/my_app/test_catalog_and_helpers.calculate.success"] == 2  # counts: summed
    assert values["torchelastic/my_app/test_catalog_and_helpers.calculate.duration.ms"] >= 10
