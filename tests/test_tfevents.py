"""impala_jax.cli.tfevents against independent references: protobuf's own serialization of
TensorBoard's messages (tensorboardX's generated classes), tensorboardX's TFRecord writer and
CRC, and TensorBoard's own reader (EventAccumulator), purge on resume included."""

from __future__ import annotations

import os

import numpy as np
import pytest

from impala_jax.cli import loggers, tfevents


def test_crc32c_matches_the_standard_check_value_and_tensorboardx():
    from tensorboardX.crc32c import crc32c as reference
    from tensorboardX.record_writer import masked_crc32c as masked_reference

    assert tfevents.crc32c(b"123456789") == 0xE3069283  # CRC-32C's published check value
    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 8, 255, 4096):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert tfevents.crc32c(data) == reference(data)
        assert tfevents.masked_crc32c(data) == masked_reference(data)


def test_record_framing_is_byte_identical_to_tensorboardx(tmp_path):
    from tensorboardX.record_writer import RecordWriter

    payloads = [b"", b"x", os.urandom(300)]
    writer = RecordWriter(str(tmp_path / "ref"))
    for data in payloads:
        writer.write(data)
    writer.close()
    assert b"".join(tfevents.record(d) for d in payloads) == (tmp_path / "ref").read_bytes()


def test_events_are_byte_identical_to_protobufs_serialization():
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    from tensorboardX.proto.summary_pb2 import Summary

    values = {"env_runners/episode_return_mean": 21.5, "zero": 0.0, "neg": -3.25e-7}
    expected = Event(
        wall_time=1796356139.25,
        step=2**40 + 3,
        summary=Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()]),
    )
    assert tfevents.event(1796356139.25, 2**40 + 3, scalars=values) == (
        expected.SerializeToString()
    )
    version = Event(wall_time=5.0, file_version="brain.Event:2")
    assert tfevents.event(5.0, file_version="brain.Event:2") == version.SerializeToString()
    start = Event(wall_time=5.0, step=201, session_log=SessionLog(status=SessionLog.START))
    assert tfevents.event(5.0, 201, session_start=True) == start.SerializeToString()
    with pytest.raises(ValueError, match="one of"):
        tfevents.event(5.0, 1, scalars={"a": 1.0}, session_start=True)


def _tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_tensorboard_reads_the_logger_and_purges_on_resume(tmp_path, monkeypatch):
    first = loggers.TensorBoardLogger(tmp_path)
    for step in (100, 200, 300):
        first.write(
            {
                "num_env_steps_sampled_lifetime": step,
                "env_runners": {"episode_return_mean": step / 10},
                "learners": {"default_policy": {"total_loss": float("nan")}},  # not finite: out
                "done": False,  # a flag, not a scalar
            }
        )
    first.close()
    # The resumed life, in a newer file (TensorBoard reads a directory's files in name order):
    # what the first logged at steps >= 201 is dropped.
    later = tfevents.time.time() + 10
    monkeypatch.setattr(tfevents.time, "time", lambda: later)
    second = loggers.TensorBoardLogger(tmp_path, purge_step=201)
    second.write({"num_env_steps_sampled_lifetime": 250, "env_runners": {"episode_return_mean": 7}})
    second.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    got = _tensorboard_scalars(tmp_path)
    assert got["env_runners/episode_return_mean"] == [(100, 10.0), (200, 20.0), (250, 7.0)]
    assert not any(tag.startswith("learners/") or tag == "done" for tag in got)


def test_a_record_cut_short_is_skipped_by_tensorboard(tmp_path):
    writer = tfevents.EventFileWriter(tmp_path)
    writer.add_scalars({"a": 1.0}, 1)
    writer.add_scalars({"a": 2.0}, 2)
    writer.close()
    writer.path.write_bytes(writer.path.read_bytes()[:-5])  # killed mid-write
    assert _tensorboard_scalars(tmp_path)["a"] == [(1, 1.0)]
