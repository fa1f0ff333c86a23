"""Why a Ray Train worker failed, in one line: what the engine and the controller's callback both report."""

from __future__ import annotations


def describe_worker_failures(failures: dict[int, BaseException]) -> str:
    """``rank N: Type: first line`` of the lowest rank that failed (and how many others did)."""
    rank = min(failures)
    exc = failures[rank]
    cause = getattr(exc, "cause", None) or exc
    words = _last_line(str(cause))
    if type(cause).__module__.startswith("ray."):  # Ray's own errors go on for a paragraph: the first sentence
        words = words.split(". ", 1)[0].rstrip(".")
    text = f"rank {rank}: {type(cause).__name__}: {words}"
    others = len(failures) - 1
    if others:
        text += f" (and {others} other rank{'s' if others > 1 else ''})"
    return text


def _last_line(text: str) -> str:
    """Ray wraps a worker's exception in its traceback: the exception's own line is the last one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
