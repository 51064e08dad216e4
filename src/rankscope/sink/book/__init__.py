"""The step book: each run's steps from first data to finalized (which run data belongs to is
``sink.runs``).

``step_book`` (``StepBook``: the step book of one run, built from a ``config.BookConfig``) and its parts, one
job each: ``steps`` (the open, done and late steps, and where a part of step N goes), ``step``
(what one step holds), ``late`` (late updates and when they are due), ``readiness`` (when an open
step is final), ``counts`` (what the run counted), ``roster`` (who a step waits for), ``windows``
(steps for step-less data), ``admission`` (``ExperimentLimits``), ``streams`` (plain OTel streams
into step rows), ``merge`` (running states), ``tables`` (sample tables), ``traces`` (the span
store) and ``finalize`` (a finished step into its ``StepView``).

``finalize`` is here, not in ``views``: it reduces the book's running states (``merge``), names
the roster's processes and reads the trace store's phases and stragglers, so it sits where its
imports are. Its product, ``views.step.StepView``, is the views' own type: the views import
nothing of the book.
"""
