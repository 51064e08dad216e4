"""What every rankscope instrumentor shares: the contrib ``BaseInstrumentor`` contract, applied
when the target module is imported (never importing torch or Monarch ourselves)."""

from __future__ import annotations

from collections.abc import Collection
from types import ModuleType
from typing import Any, ClassVar

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from ..core.errors import report_internal_error
from ..core.patching import restore, swap

__all__ = ["ModuleInstrumentor", "restore", "swap"]


class ModuleInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Patches ``target`` when it is imported (at once if it already is); ``uninstrument`` reverts.

    ``instrument()`` under ``opentelemetry-instrument`` runs in every process before the
    program starts, so patching waits for the program's own import of the library: a
    process that never imports torch pays nothing.
    """

    target: ClassVar[str]
    dependencies: ClassVar[tuple[str, ...]] = ("torch >= 2.5",)

    def __init__(self) -> None:
        if not hasattr(self, "_active"):  # BaseInstrumentor is a singleton: __init__ runs again
            self._active = False
            self._applied = False
            self._hook_registered = False
            self.options: dict[str, Any] = {}

    def instrumentation_dependencies(self) -> Collection[str]:
        return self.dependencies

    def _instrument(self, **kwargs: Any) -> None:
        self.options = kwargs
        self._active = True
        if not self._hook_registered:
            self._hook_registered = True
            wrapt.register_post_import_hook(self._on_import, self.target)
        else:
            import sys

            module = sys.modules.get(self.target)
            if module is not None:
                self._on_import(module)

    def _on_import(self, module: ModuleType) -> None:
        if not self._active or self._applied:
            return
        try:
            self._apply(module)
            self._applied = True
        except Exception as exc:
            report_internal_error(f"{type(self).__name__} on {self.target}", exc)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._active = False
        if self._applied:
            self._applied = False
            self._revert()

    def _apply(self, module: ModuleType) -> None:
        raise NotImplementedError

    def _revert(self) -> None:
        raise NotImplementedError
