"""The ``otlp`` view: the global view's merged values sent on as OTLP gauges, for any OTel backend.

Its parts: ``gauges`` (a step's values as one OTLP metrics request), ``sender`` (the bounded
buffer and its thread, one attempt per request over gRPC or HTTP) and ``view`` (the
``LoggerBackend``). Through the Collector's ``prometheusremotewrite`` exporter
(``collector-config/remote-write.yaml``) the series land in Prometheus, Mimir or VictoriaMetrics.
"""

from .view import OtlpBackend

__all__ = ["OtlpBackend"]
