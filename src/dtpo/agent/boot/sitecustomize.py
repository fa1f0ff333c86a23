"""The in-process agent's entry point: ``dtpo launch`` puts this folder first on its workers' ``PYTHONPATH``.

Python imports ``sitecustomize`` at start-up; this one wakes the agent (:mod:`dtpo.agent.activation`), which is
inert unless ``dtpo launch`` asked for it, then runs the ``sitecustomize`` that this one hides, if any, as Python
would have (an error in it is reported in one line as the user's own, and the script goes on, as Python does).
"""

import importlib.machinery
import importlib.util
import logging
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
AGENT_ENV = "DTPO_AGENT"  # dtpo.core.launch_contract.AGENT_ENV, read here without importing dtpo
FRAMEWORK_ENV = "DTPO_FRAMEWORK"  # dtpo.core.launch_contract.FRAMEWORK_ENV
_log = logging.getLogger("dtpo.agent.boot")  # dtpo's format once the agent is awake, else the bare message


def _wake_agent() -> None:
    if not os.environ.get(AGENT_ENV) and not os.environ.get(FRAMEWORK_ENV):  # the script's own children: no dtpo
        return
    try:
        from dtpo.agent.activation import start
    except Exception as exc:  # noqa: BLE001 - a broken dtpo must not stop the script
        _log.warning("dtpo agent: not started (%s: %s)", type(exc).__name__, exc)
        return
    start()


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, the one this file hides."""
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - Python itself goes on after a failing sitecustomize
        _log.warning("your sitecustomize %s raised %s: %s (not dtpo's error; the script runs without the rest of "
                     "it, as Python does)", spec.origin, type(exc).__name__, exc)


_wake_agent()
_chain()
