"""A run's life at the sink, one part per job: which run a launch is (``runbook``), the open runs
(``registry``, each a ``tenant``), opening and reopening them (``opening``), who may open another
(``quotas``), their views (``view_configs``), the finalizer's rounds over them (``upkeep``), a run's
status (``status``), and closing them (``closing``, with what a closed run leaves: ``closed``)."""
