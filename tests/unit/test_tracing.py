"""``trace``/``Tracer`` in a lone process with no sink: metrics only, no spans to send.

The rest, against a real sink, is ``tests/integration/test_tracing.py``."""

from __future__ import annotations

import rankscope as rs


def test_a_lone_process_without_a_sink_records_metrics_only(capsys) -> None:
    rs.init(experiment="alone", backends={"console": {"logging_mode": "global_reduce"}})
    with rs.trace("solo") as t:
        t.step("x")
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "solo/x/duration_avg_s" in out and "solo/total_duration_max_s" in out
