"""Run a function once a module has been imported, without importing it: the agent waits for ``torch``.

A finder first on ``sys.meta_path`` answers only for the watched names: it asks the other finders for the
module's spec and wraps its loader so that, once the module's own code has run, the callbacks run with the
module. A module already imported gets its callbacks at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

log = logging.getLogger(__name__)

Callback = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks."""

    def __init__(self, inner: importlib.abc.Loader, callbacks: list[Callback]) -> None:
        self.inner = inner
        self.callbacks = callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        spec = module.__spec__
        if spec is not None:  # the module's spec names its own loader again, as if no one had watched
            spec.loader = self.inner
        for callback in self.callbacks:
            callback(module)


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of the watched modules."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callback]] = {}
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        callbacks = self.callbacks.get(fullname)
        busy: set[str] = getattr(self._busy, "names", set())
        if not callbacks or fullname in busy:
            return None
        self._busy.names = busy | {fullname}
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.names = busy
        if spec is None or spec.loader is None:
            return None
        del self.callbacks[fullname]  # once
        spec.loader = _Loader(spec.loader, callbacks)
        return spec


_watcher = _Watcher()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once the module ``name`` (``torch``, ``accelerate.data_loader``) has been imported
    (at once if it already is).

    An exception in the callback propagates from the ``import`` statement that triggered it: callbacks must not
    raise.
    """
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _watcher.callbacks.setdefault(name, []).append(callback)
    if _watcher not in sys.meta_path:
        sys.meta_path.insert(0, _watcher)


def forget(name: str) -> None:
    """Stop waiting for ``name`` (tests)."""
    _watcher.callbacks.pop(name, None)


