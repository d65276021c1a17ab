"""The CLI's one kind of error: a usage or config problem, reported as one line."""

from __future__ import annotations


class RunError(Exception):
    """A usage or config problem: reported as one line, exit status 2."""


def one_line(err: BaseException | str) -> str:
    """A multi-line message (config validation lists every bad field) on one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} " + "; ".join(lines[1:])
    return "; ".join(lines)
