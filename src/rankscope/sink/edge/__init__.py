"""The sink's edge, where a request arrives: bytes in, checked values and answers out.

The transports (``grpc_server``, ``http_server``), the control routes (``control``), the bearer
token (``auth``), request bodies (``bodies``), the in-flight ``gate``, what a request may cost
before it is decoded (``cost``), the checks of every point (``validate``) and the ports the
transports talk through (``ports``: ``Ingest``, ``Control``, the frozen ``Transport`` config).
Nothing here imports the coordinator that starts it. What the checks produce (``ResourceBatch``,
``Refusals``, ...) lives below every stage, in ``sink.checked``: the book, the log and the views
take it without importing the edge.
"""
