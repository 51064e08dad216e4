"""The MLflow view (``pip install 'rankscope[mlflow]'``): one MLflow run per rankscope run.

Its parts: ``keys`` (rankscope's keys as MLflow's), ``batches`` (requests within MLflow's
limits), ``rest`` (one attempt per call), ``runs`` (which MLflow experiment and runs),
``sender`` (the bounded buffer and its thread) and ``view`` (the ``LoggerBackend``). Importing
this package does not import MLflow: the view does when it opens.
"""

from .view import MlflowBackend

__all__ = ["MlflowBackend"]
