"""TensorBoard event files written by torch's own SummaryWriter, read by the lab's reader (no
TensorFlow, no TensorBoard import), and the lab's writer (imports.tfevents.write_scalars) read
back by TensorBoard's own EventAccumulator."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from imports import tfevents
from imports.formats import DEFAULT_MAPPINGS, ImportFormatError, Point, map_points, read

torch.set_num_threads(1)


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def write_with_torch(logdir):
    writer = SummaryWriter(str(logdir))
    for step in range(3):
        writer.add_scalar("actor/pg_clipfrac", 0.1 * (step + 1), step, walltime=1764800000.5 + step)
        writer.add_scalar(
            "critic/score/mean", 0.3 + step, step, new_style=True, walltime=1764800100.25 + step
        )
    writer.add_scalar("actor/ppo_kl", float("nan"), 3, walltime=1764800200.0)
    writer.add_scalar("actor/grad_norm", float("inf"), 3, walltime=1764800200.0)
    writer.add_scalars("split", {"train": 1.5, "eval": 2.5}, 4, walltime=1764800300.0)
    writer.add_histogram("weights", torch.arange(10.0), 0, walltime=1764800000.0)
    writer.add_text("note", "not a scalar", 0, walltime=1764800000.0)
    writer.close()


def test_torch_summary_writer_scalars_are_read_point_by_point(tmp_path):
    write_with_torch(tmp_path)
    run = read("tensorboard", tmp_path)
    expected = [Point(s, "actor/pg_clipfrac", f32(0.1 * (s + 1)), 1764800000.5 + s) for s in range(3)]
    expected += [Point(s, "critic/score/mean", f32(0.3 + s), 1764800100.25 + s) for s in range(3)]
    expected += [
        Point(4, "split_train/split", 1.5, 1764800300.0),
        Point(4, "split_eval/split", 2.5, 1764800300.0),
        Point(3, "actor/grad_norm", math.inf, 1764800200.0),
    ]
    by_key = {(p.step, p.name): p for p in run.points}
    nan = by_key.pop((3, "actor/ppo_kl"))
    assert math.isnan(nan.value) and nan.time == 1764800200.0
    assert sorted(by_key.values(), key=repr) == sorted(expected, key=repr)
    mapped = {p.name for p in map_points(run.points, DEFAULT_MAPPINGS["tensorboard"])}
    assert {"clip_frac", "reward/mean", "kl/behavior", "grad_norm", "imported/split_train/split"} <= mapped


def test_one_event_file_reads_alone(tmp_path):
    write_with_torch(tmp_path)
    (file,) = tmp_path.glob("events.out.tfevents.*")
    names = {p.name for p in read("tensorboard", file).points}
    assert names == {"actor/pg_clipfrac", "critic/score/mean", "actor/ppo_kl", "actor/grad_norm"}


def test_the_labs_writer_is_read_back_by_tensorboard_itself(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = [Point(s, "reward/mean", 0.25 * s, 1764800000.0 + 10 * s) for s in range(4)]
    points += [Point(0, "kl/init", float("nan"), 1764800000.0), Point(2, "loss", 1e40, 1764800020.0)]
    path = tmp_path / tfevents.event_file_name(1764800000.0)
    tfevents.write_scalars(path, points[:3])
    tfevents.write_scalars(path, points[3:])  # appended: one file, one version record
    accumulator = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    accumulator.Reload()
    assert sorted(accumulator.Tags()["scalars"]) == ["kl/init", "loss", "reward/mean"]
    seen = [(e.step, e.value, e.wall_time) for e in accumulator.Scalars("reward/mean")]
    assert seen == [(s, 0.25 * s, 1764800000.0 + 10 * s) for s in range(4)]
    assert math.isnan(accumulator.Scalars("kl/init")[0].value)
    assert accumulator.Scalars("loss")[0].value == math.inf  # past float32: shown as inf
    ours = read("tensorboard", path).points
    assert ours[:4] == points[:4] and ours[5] == Point(2, "loss", math.inf, 1764800020.0)


def test_writer_without_a_time_uses_the_time_of_writing(tmp_path):
    import time

    path = tmp_path / "events.out.tfevents.1.host"
    before = time.time()
    tfevents.write_scalars(path, [Point(7, "lr", 0.5, None)])
    (point,) = read("tensorboard", path).points
    assert point.step == 7 and point.value == 0.5 and before <= point.time <= time.time()


def event_file(tmp_path):
    write_with_torch(tmp_path / "logs")
    (file,) = (tmp_path / "logs").glob("events.out.tfevents.*")
    return file


def test_a_truncated_file_is_refused_naming_the_record(tmp_path):
    file = event_file(tmp_path)
    data = file.read_bytes()
    file.write_bytes(data[:-7])
    with pytest.raises(ImportFormatError) as error:
        read("tensorboard", file)
    assert error.value.where.startswith("record ") and "truncated" in error.value.rule


def test_a_corrupt_record_is_refused_by_its_checksum(tmp_path):
    file = event_file(tmp_path)
    data = bytearray(file.read_bytes())
    data[-10] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(ImportFormatError, match="data's checksum does not match"):
        read("tensorboard", file)


def test_a_file_that_is_not_an_event_file_is_refused(tmp_path):
    file = tmp_path / "events.out.tfevents.1.host"
    file.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n')
    with pytest.raises(ImportFormatError) as error:
        read("tensorboard", file)
    assert error.value.where == "record 0 (byte 0)" and "length's checksum does not match" in error.value.rule


def test_a_record_that_is_not_an_event_is_refused(tmp_path):
    file = tmp_path / "events.out.tfevents.1.host"
    file.write_bytes(tfevents.frame(b"\x0f\xff\xff"))
    with pytest.raises(ImportFormatError, match="record 0: not an Event protocol buffer"):
        read("tensorboard", file)


def test_a_folder_without_event_files_and_one_over_the_cap_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("no events")
    with pytest.raises(ImportFormatError, match="no TensorBoard event files"):
        read("tensorboard", tmp_path)
    file = event_file(tmp_path)
    with pytest.raises(ImportFormatError, match="an import reads at most 100 bytes"):
        read("tensorboard", file.parent, max_bytes=100)


def test_tensor_scalars_as_tensorflow_writes_them_are_read(tmp_path):
    """tf.summary.scalar's records, built with TensorBoard's own protos and file writer: the value
    in tensor_content, the "scalars" plugin named on a tag's first value only; a text tensor and a
    tensor of two numbers are not scalars."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    def value(tag, tensor, plugin=None):
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin)
        )
        return summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata if plugin else None)

    def event(step, *values):
        return event_pb2.Event(
            wall_time=1764800000.0 + step, step=step, summary=summary_pb2.Summary(value=values)
        )

    double = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, tensor_content=struct.pack("<d", 0.1))
    float_later = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_content=struct.pack("<f", 0.5))
    int64 = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64, int64_val=[-3])
    text = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"hello"])
    pair = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT,
        float_val=[1.0, 2.0],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=2)]),
    )
    writer = EventFileWriter(str(tmp_path))
    writer.add_event(
        event(0, value("kl", double, "scalars"), value("n", int64, "scalars"), value("t", text, "text"))
    )
    writer.add_event(event(1, value("kl", float_later), value("pair", pair, "scalars")))
    writer.close()
    assert read("tensorboard", tmp_path).points == [
        Point(0, "kl", 0.1, 1764800000.0),
        Point(0, "n", -3.0, 1764800000.0),
        Point(1, "kl", 0.5, 1764800001.0),
    ]
