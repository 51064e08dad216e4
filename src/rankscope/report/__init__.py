"""The experiment report: a bounded summary of what the ``report`` view saw (``summary``) and
the one static HTML page made from it (``page``)."""
