"""The error that stops a run when user code raises (a callback, a custom evaluation function).

runtime raises and catches it (a runner does not rebuild its envs for it, the group does not
restart the runner); rllib/callbacks.py raises it for a callback."""

from __future__ import annotations

import traceback


class UserCodeError(RuntimeError):
    """User code (a callback, a custom evaluation function) raised: the run stops, not retried.

    The message names the code and the error, with the original traceback in it; the original
    exception is ``__cause__``."""

    def __init__(self, what: str, error: BaseException):
        trace = "".join(traceback.format_exception(error)).rstrip()
        super().__init__(
            f"{what} raised {type(error).__name__}: {error}\n"
            f"original traceback:\n{trace}\n"
            "training stopped (threads ended, checkpoints already written are intact)."
        )
        self.error = error


def describe(fn) -> str:
    """``module.qualname`` of a callable (a bound method names its class)."""
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, type):
        cls = type(owner)
        return f"{cls.__module__}.{cls.__qualname__}.{getattr(fn, '__name__', fn)}"
    name = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else name
