"""TensorBoard event files written directly: scalars only, no protobuf or tensorboardX import.

An event file is a sequence of TFRecords, each ``uint64 length``, ``uint32 masked CRC-32C of
the length``, ``length`` bytes of a serialized ``tensorflow.Event``, ``uint32 masked CRC-32C of
those bytes`` (little-endian). The first event names the format (``file_version``); each
iteration then writes one event whose ``Summary`` holds one ``simple_value`` per tag.

Importing tensorboardX for this was a large share of the CLI's start-up, almost all of it
protobuf's Python runtime (benchmarks/README.md, "Start-up and exit"); the few messages a
scalar log needs are encoded here by hand, field numbers as in TensorFlow's ``event.proto`` and
``summary.proto``.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

# CRC-32C (Castagnoli), reflected polynomial, as TFRecord uses.
_CASTAGNOLI = 0x82F63B78


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CASTAGNOLI if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits, plus a constant (mod 2^32)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord around ``data``."""
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


# Protocol buffer wire format: a key is (field number << 3) | wire type.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 fields: two's complement, ten bytes
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _bytes_field(field: int, payload: bytes) -> bytes:
    return _key(field, _BYTES) + _varint(len(payload)) + payload


def event(
    wall_time: float,
    step: int = 0,
    *,
    file_version: str | None = None,
    scalars: dict[str, float] | None = None,
    session_start: bool = False,
) -> bytes:
    """A serialized ``Event``: wall_time (1, double), step (2, int64), and one of file_version
    (3), summary (5: ``Summary.value`` (1) entries of tag (1) and simple_value (2, float)) or
    session_log (7: status (1) = START, 1); the three are a ``oneof``, so give one."""
    if (file_version is not None) + bool(scalars) + session_start > 1:
        raise ValueError("an Event holds one of file_version, scalars and session_start")
    out = _key(1, _FIXED64) + struct.pack("<d", wall_time)
    if step:
        out += _key(2, _VARINT) + _varint(int(step))
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _bytes_field(
                1,
                _bytes_field(1, tag.encode()) + _key(2, _FIXED32) + struct.pack("<f", value),
            )
            for tag, value in scalars.items()
        )
        out += _bytes_field(5, summary)
    if session_start:
        out += _bytes_field(7, _key(1, _VARINT) + _varint(1))
    return out


class EventFileWriter:
    """A new event file in ``directory`` (``events.out.tfevents.<time>.<host>.<pid>``).

    ``purge_step`` (on resume) writes a SessionLog START at that step first: TensorBoard then
    hides what earlier files of the directory logged at that step or later, as tensorboardX's
    ``purge_step`` does.
    """

    FILE_VERSION = "brain.Event:2"

    def __init__(self, directory: str | Path, purge_step: int | None = None):
        now = time.time()
        name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}"
        self.path = Path(directory) / name
        self._file = open(self.path, "ab")  # noqa: SIM115 (closed by close())
        self._file.write(record(event(now, file_version=self.FILE_VERSION)))
        if purge_step is not None:
            self._file.write(record(event(now, purge_step, session_start=True)))
        self._file.flush()

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        """One event holding every scalar of ``scalars`` at ``step``, flushed to the file."""
        self._file.write(record(event(time.time(), step, scalars=scalars)))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
