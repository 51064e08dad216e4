"""In fresh interpreters: importing changes nothing global, third-party backends plug in through
entry points, and the CLI prints the identity and the settings."""

from __future__ import annotations

import json
import textwrap

from ..conftest import run_python


def test_import_changes_nothing_global() -> None:
    code = textwrap.dedent("""
        import json, os, sys, threading
        before_env, before_threads = dict(os.environ), threading.active_count()
        import rankscope
        from opentelemetry import metrics
        from opentelemetry.metrics import _internal as m
        print(json.dumps({
            "env_changed": dict(os.environ) != before_env,
            "threads": threading.active_count() - before_threads,
            "meter_provider_set": m._METER_PROVIDER is not None,
            "torch_imported": "torch" in sys.modules,
        }))
    """)
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "env_changed": False,
        "threads": 0,
        "meter_provider_set": False,
        "torch_imported": False,
    }


def test_third_party_backend_through_entry_point(tmp_path) -> None:
    (tmp_path / "shout_backend.py").write_text(
        textwrap.dedent("""
        import rankscope as rs

        class Shout(rs.LoggerBackend):
            def log_batch(self, metrics, global_step, *args, **kwargs):
                for m in metrics:
                    print(f"SHOUT {m.key.upper()}={m.value} @ {global_step}", flush=True)
    """)
    )
    dist = tmp_path / "shout_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shout-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[rankscope.backends]\nshout = shout_backend:Shout\n")
    code = (
        "import rankscope as rs\n"
        "rs.init(backends={'shout': {'logging_mode': 'per_rank_reduce'}})\n"
        "rs.record_metric('reward', 0.5); rs.flush(2); rs.shutdown()\n"
    )
    result = run_python(code, {"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "SHOUT REWARD=0.5 @ 2" in result.stdout


def test_cli_prints_identity_and_settings() -> None:
    result = run_python("from rankscope.cli import main; main(['identity'])", {"RANKSCOPE_ROLE": "generator"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rankscope.role"] == "generator"
    result = run_python("from rankscope.cli import main; main(['settings'])")
    assert "RANKSCOPE_DISABLE" in result.stdout and "OTEL_SERVICE_NAME" in result.stdout
