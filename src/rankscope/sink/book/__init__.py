"""The step book: which run data belongs to, and each run's steps from first data to finalized.

``runs`` (a launch is a run; a resuming launch continues its run), ``experiment`` (the step
book: open, done and late steps) and its parts: ``roster`` (who a step waits for), ``windows``
(steps for step-less data), ``admission`` (``ExperimentLimits``), ``streams`` (plain OTel
streams into step rows), ``merge`` (running states), ``tables`` (sample tables), ``traces``
(the span store) and ``finalize`` (a finished step into its ``StepView``).

``finalize`` is here, not in ``views``: it reduces the book's running states (``merge``), names
the roster's processes and reads the trace store's phases and stragglers, so it sits where its
imports are. Its product, ``views.step.StepView``, is the views' own type: the views import
nothing of the book.
"""
