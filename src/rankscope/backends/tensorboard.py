"""TensorBoard backend: scalars in event files, one directory per view.

Config: ``logdir`` (default ``rankscope_logs/tensorboard``). The global view writes to
``{logdir}/{experiment}/{run}/global``, per-process views to ``{logdir}/{experiment}/{run}/{process}``,
so TensorBoard overlays processes and runs. A rewound run (``rewind``) writes TensorBoard's
purge marker (what ``SummaryWriter(purge_step=N)`` writes): TensorBoard drops the events
from step N that came before it. The experiment id and the process label are the
client's, so each directory is named by their ``safe_component`` (``logdir`` is the
operator's, used as given). Uses the ``tensorboard`` package's own event writer
(``pip install 'rankscope[tensorboard]'``); torch is not needed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..core.paths import safe_component
from .base import LoggerBackend, Metric


class TensorBoardBackend(LoggerBackend):
    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        try:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as exc:
            raise ImportError(
                "the tensorboard backend needs tensorboard: pip install 'rankscope[tensorboard]'"
            ) from exc
        self._event, self._summary, self._writer_class = Event, Summary, EventFileWriter
        self._session_log = SessionLog
        experiment = str(kwargs.get("experiment") or "rankscope")
        logdir = Path(self.logger_backend_config.get("logdir", "rankscope_logs/tensorboard"))
        self.root = logdir / safe_component(experiment)
        if kwargs.get("run"):
            self.root = self.root / safe_component(str(kwargs["run"]))
        self.location = str(self.root.resolve())
        self._default = process_name or "global"
        self._writers: dict[str, Any] = {}
        self._purge_step: int | None = None

    def _writer(self, name: str) -> Any:
        writer = self._writers.get(name)
        if writer is None:
            path = self.root / safe_component(name)
            path.mkdir(parents=True, exist_ok=True)
            writer = self._writers[name] = self._writer_class(str(path))
            if self._purge_step is not None:  # its directory may hold events from before the rewind
                self._purge(writer, self._purge_step)
        return writer

    def _purge(self, writer: Any, step: int) -> None:
        start = self._session_log(status=self._session_log.START)
        writer.add_event(self._event(wall_time=time.time(), step=step, session_log=start))
        writer.flush()

    def _write(self, name: str, metrics: list[Metric], step: int | None) -> None:
        values = [self._summary.Value(tag=m.key, simple_value=m.value) for m in metrics]
        event = self._event(wall_time=time.time(), step=step or 0, summary=self._summary(value=values))
        self._writer(name).add_event(event)

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        self._write(kwargs.get("process_name") or self._default, metrics, global_step)
        for writer in self._writers.values():
            writer.flush()

    def log_stream(self, metric: Metric, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        self._write(kwargs.get("process_name") or self._default, [metric], global_step)

    def rewind(self, step: int) -> None:
        """TensorBoard's purge marker in every directory of this view, open or opened later (a view
        reopened after an eviction or a sink restart has none open yet)."""
        for writer in self._writers.values():
            self._purge(writer, step)
        self._purge_step = step
        self._writer(self._default)  # opened (with the marker) if it was not

    def finish(self) -> None:
        for writer in self._writers.values():
            writer.close()
