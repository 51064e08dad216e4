"""Where a finished step goes: detectors, captures, and every run's views on a bounded pool.

``step`` (``StepView``, what a view is handed), ``anomalies`` (per-step detectors), ``captures``
(profiler requests and files), ``writer`` (``ViewPool``, ``ViewWriter``: every run's backends
on a bounded pool of threads; handed the run log's ``written_view``) and a writer's parts:
``inbox`` (its bounded queue, drops and close), ``viewset`` (its backends from the run's config,
opened, released, finished), ``writes`` (how each kind of data reaches the views), ``calls``
(every call into a backend, guarded) and ``messages`` (what the inbox carries). The lowest stage:
it imports none of the others, only ``sink.checked``.
"""
