"""Writing a file whole or not at all, the one way every file of a run is replaced.

It imports nothing beyond the standard library: the learning curve's drawing process
(cli/curve.py) loads it without NumPy or JAX.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Writes ``path`` whole or not at all: a reader, or a process killed mid-write, sees the
    old file or the new one, never part of it (a temporary sibling is renamed over it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(bytes(data))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
