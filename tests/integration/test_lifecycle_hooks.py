"""In fresh interpreters: importing rankscope registers no at-fork hook and no atexit callback;
the first ``init`` registers both, once per process (a forked child inherits them)."""

from __future__ import annotations

import json
import textwrap

from ..conftest import run_python

HOOKS_JOB = textwrap.dedent("""
    import atexit, json, os, sys

    calls = []  # (kind, modules of the callables) for every registration, recorded before rankscope loads
    _register_at_fork, _atexit_register = os.register_at_fork, atexit.register

    def register_at_fork(**hooks):
        calls.append(("at-fork", sorted({getattr(h, "__module__", "") or "" for h in hooks.values()})))
        return _register_at_fork(**hooks)

    def atexit_register(func, *args, **kwargs):
        calls.append(("atexit", [getattr(func, "__module__", "") or ""]))
        return _atexit_register(func, *args, **kwargs)

    os.register_at_fork, atexit.register = register_at_fork, atexit_register

    def ours():
        return sorted(kind for kind, modules in calls if any(m.startswith("rankscope") for m in modules))

    import rankscope, rankscope.api, rankscope.lifecycle, rankscope.instrumentation
    from rankscope.core import runtime
    seen = {"import": ours(), "runtime_after_import": runtime.current is not None}

    rankscope.init(experiment="hooks", role="trainer")  # no endpoint, no sink: a lone process
    seen["init"] = ours()
    rankscope.init(experiment="hooks", role="trainer")  # again: reconfigures, registers nothing more
    rankscope.shutdown()
    rankscope.init(experiment="hooks", role="trainer")  # after shutdown: the hooks are still there
    seen["again"] = ours()

    pid = os.fork()
    if pid == 0:  # the child inherited both registrations: its own init adds none
        before = len(ours())
        rankscope.init(experiment="hooks", role="trainer")
        rankscope.shutdown()
        os._exit(10 + len(ours()) - before)
    _, status = os.waitpid(pid, 0)
    seen["child_registered"] = os.waitstatus_to_exitcode(status) - 10
    rankscope.shutdown()
    print(json.dumps(seen))
""")


def test_import_registers_no_process_hooks_and_init_registers_them_once() -> None:
    result = run_python(HOOKS_JOB, timeout=120)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {
        "import": [],
        "runtime_after_import": False,
        "init": ["at-fork", "at-fork", "atexit"],  # the fork relay's, SIGTERM's (``lifecycle.stopping``)
        "again": ["at-fork", "at-fork", "atexit"],
        "child_registered": 0,
    }, result.stderr


EXIT_ORDER_JOB = textwrap.dedent("""
    import atexit, rankscope

    def late():  # registered before rs.init, so it runs after rankscope's exit-time shutdown
        rankscope.record_metric("after_exit", 1.0)
        rankscope.flush(1)
        print("late handler ran; runtime:", rankscope.get_resource() is not None, flush=True)

    atexit.register(late)
    rankscope.init(experiment="exit-order", role="trainer")
    rankscope.record_metric("loss", 1.0)
    rankscope.flush(0)
""")


def test_a_call_from_an_exit_handler_after_the_exit_time_shutdown_warns_and_starts_nothing() -> None:
    """The exit hook is registered by ``init``, not at import, so a handler registered earlier runs
    after rankscope's shutdown: its calls are not recorded, it is said once, and no runtime that
    nothing would shut down is started."""
    result = run_python(EXIT_ORDER_JOB, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "late handler ran; runtime: False" in result.stdout
    assert result.stderr.count("called after its exit-time shutdown") == 1, result.stderr
