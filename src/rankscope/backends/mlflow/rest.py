"""MLflow's REST API (``/api/2.0/mlflow/...``), one attempt per call: the view's sender retries.

``MlflowClient`` retries each call itself, for about four minutes with the server down
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, read from the process's environment by every MLflow caller
in it), which a sender that must notice a restarted server and drain within a finish's deadline
cannot use. So the runs' metrics, params and tags go through MLflow's own request helper with
``max_retries=0`` and the view's timeout, with the same credentials as MLflow's client
(``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``, TLS settings). Every MLflow
name this needs that is not the documented client is here, in one module; the artifacts go
through ``MlflowClient``.
"""

from __future__ import annotations

import re
from typing import Any

from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.rest_utils import http_request

API = "/api/2.0/mlflow"


class UnreachableError(Exception):
    """The server did not answer, or answered that it cannot now (429, 5xx): try again later."""


class RefusedError(Exception):
    """The server answered no to this request (4xx): sending it again gets the same answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}"[:500])
        self.code = code


_CAUSES = re.compile(r"\[Errno -?\d+\][^'\")\]]*|Read timed out|Connection reset[^'\")]*|timed out")


def cause(exc: BaseException) -> str:
    """What went wrong, in a line: the innermost reason of MLflow's wrapped urllib3 error
    (``[Errno 111] Connection refused``), not its 400 characters of pool and object names."""
    text = " ".join(str(exc).split())
    found = _CAUSES.findall(text)
    return found[-1].strip().rstrip(".") if found else f"{type(exc).__name__}: {text[:160]}"


class Rest:
    """Calls to one tracking server (``uri``: ``http://`` or ``https://``), each one attempt of at
    most ``timeout`` seconds."""

    def __init__(self, uri: str, timeout: float) -> None:
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        self._creds = get_default_host_creds(self.uri)  # type: ignore[no-untyped-call]

    def call(self, method: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"params": body} if method == "GET" else {"json": body}
        try:
            response = http_request(  # type: ignore[no-untyped-call]
                self._creds,
                f"{API}/{endpoint}",
                method,
                max_retries=0,
                backoff_factor=0,
                timeout=max(1, round(self.timeout)),
                raise_on_status=False,
                **kwargs,
            )
        except Exception as exc:  # a refused connection, a timeout, a reset: MLflow wraps them all
            raise UnreachableError(cause(exc)) from None
        status = int(response.status_code)
        page = self._web_page(response)
        wrong = f"a web page, not MLflow's API: is {self.uri} the tracking server's address?"
        if status == 200:
            if page:  # a login page, an app answering every path: what was sent was not taken
                raise RefusedError("HTTP 200", wrong)
            try:
                found = response.json()
            except ValueError:
                return {}
            return found if isinstance(found, dict) else {}
        if status == 429 or status >= 500:  # a proxy's page while MLflow restarts is an outage, not a wrong address
            raise UnreachableError(f"HTTP {status}: " + ("a web page (a proxy's?)" if page else self._text(response)))
        text = wrong if page else self._text(response)
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        raise RefusedError(str(answer.get("error_code") or f"HTTP {status}"), str(answer.get("message") or text))

    @staticmethod
    def _web_page(response: Any) -> bool:
        """Whether an answer is a web page (a proxy's, a login's, another server's), not MLflow's
        JSON: named in a line, never printed."""
        kind = str(response.headers.get("Content-Type") or "").lower()
        return "html" in kind or str(response.text or "").lstrip()[:1] == "<"

    @staticmethod
    def _text(response: Any) -> str:
        return " ".join(str(response.text or "").split())[:200]
