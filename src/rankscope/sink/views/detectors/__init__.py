"""The sink's detectors, one module each over the interface they share (``base``); the list that
registers them is ``views.anomalies.DETECTORS``."""
