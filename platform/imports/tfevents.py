"""TensorBoard's event files, read and written without TensorFlow or TensorBoard: a TFRecord file
(each record `uint64 length, uint32 masked CRC32C of length, data, uint32 masked CRC32C of data`,
little-endian) whose records are `Event` protocol buffers. Only what scalars need is decoded:
`Event.wall_time` (1, double), `step` (2, int64), `summary` (5) → `Summary.value` (1) →
`Value.tag` (1), `simple_value` (2, float), `metadata` (9, its plugin's name) and `tensor` (8, a
`TensorProto` holding one number, as `tf.summary.scalar` and torch's `new_style` scalars write).

`read_events` yields every scalar of a file; `write_scalars` appends points to one, as torch's
`SummaryWriter.add_scalar` writes them (`simple_value`, float32, the "scalars" plugin)."""

from __future__ import annotations

import math
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


class EventFileError(ValueError):
    """A file that is not a well-formed event file: `where` names the record, `rule` what is wrong."""

    def __init__(self, where: str, rule: str):
        self.where = where
        self.rule = rule
        super().__init__(f"{where}: {rule}")


@dataclass(frozen=True)
class Scalar:
    step: int
    tag: str
    value: float
    wall_time: float


# CRC32C (Castagnoli), as TFRecord checksums its records.
def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---- TFRecord framing ----


def records(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(record index, payload) for every record, checksums verified."""
    offset, index = 0, 0
    while offset < len(data):
        where = f"record {index} (byte {offset})"
        if len(data) - offset < 12:
            raise EventFileError(where, "truncated: the file ends inside a record's header")
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        if masked_crc32c(header) != length_crc:
            raise EventFileError(where, "the length's checksum does not match: not an event file, or corrupt")
        start = offset + 12
        if len(data) - start < length + 4:
            raise EventFileError(where, f"truncated: the record says {length} bytes, the file ends sooner")
        payload = data[start : start + length]
        (payload_crc,) = struct.unpack("<I", data[start + length : start + length + 4])
        if masked_crc32c(payload) != payload_crc:
            raise EventFileError(where, "the data's checksum does not match: corrupt record")
        yield index, payload
        offset = start + length + 4
        index += 1


def frame(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


# ---- protocol buffer wire format ----


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if offset >= len(data):
            raise ValueError("a varint runs past the end")
        byte = data[offset]
        result |= (byte & 0x7F) << shift
        offset += 1
        if not byte & 0x80:
            return result, offset
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a message: an int for varints and fixed-width fields
    (their raw bits), bytes for length-delimited ones."""
    offset = 0
    while offset < len(data):
        key, offset = _varint(data, offset)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, offset = _varint(data, offset)
        elif wire == 1:
            if offset + 8 > len(data):
                raise ValueError("a 64-bit field runs past the end")
            (value,) = struct.unpack("<Q", data[offset : offset + 8])
            offset += 8
        elif wire == 2:
            length, offset = _varint(data, offset)
            if offset + length > len(data):
                raise ValueError("a length-delimited field runs past the end")
            value = data[offset : offset + length]
            offset += length
        elif wire == 5:
            if offset + 4 > len(data):
                raise ValueError("a 32-bit field runs past the end")
            (value,) = struct.unpack("<I", data[offset : offset + 4])
            offset += 4
        else:
            raise ValueError(f"wire type {wire} is not one protocol buffers write")
        yield number, wire, value


def _double(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def _float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _encode_varint(len(payload)) + payload


# ---- Event → scalars ----

# TensorProto dtypes that hold one number, and the packed field each may use (DataType enum).
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19
_TENSOR_CONTENT = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q", _DT_HALF: "<e"}


def _tensor_scalar(data: bytes) -> float | None:
    """The one number a TensorProto holds, or None where it holds something else."""
    dtype, dims, values = 0, 0, []
    content = b""
    for number, wire, value in fields(data):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 2 and wire == 2:
            dims = sum(1 for n, _, size in fields(value) if n == 2 and _dim_size(size) != 1)
        elif number == 4 and wire == 2:
            content = value
        elif number in (5, 6, 7, 10, 13):
            values.extend(_packed(number, wire, value))
    if dims or dtype not in _TENSOR_CONTENT:
        return None
    if content:
        fmt = _TENSOR_CONTENT[dtype]
        return float(struct.unpack(fmt, content)[0]) if len(content) == struct.calcsize(fmt) else None
    if dtype == _DT_HALF and len(values) == 1:
        return float(struct.unpack("<e", struct.pack("<H", int(values[0]) & 0xFFFF))[0])
    return float(values[0]) if len(values) == 1 else None


def _dim_size(dim: bytes) -> int:
    return next((_signed64(v) for n, w, v in fields(dim) if n == 1 and w == 0), 0)


def _packed(number: int, wire: int, value: int | bytes) -> list[float]:
    """float_val (5), double_val (6), int_val (7), int64_val (10), half_val (13), packed or not."""
    if wire == 2:
        if number == 5:
            return list(struct.unpack(f"<{len(value) // 4}f", value))
        if number == 6:
            return list(struct.unpack(f"<{len(value) // 8}d", value))
        out, offset = [], 0
        while offset < len(value):
            item, offset = _varint(value, offset)
            out.append(
                _signed64(item)
                if number == 10
                else struct.unpack("<i", struct.pack("<I", item & 0xFFFFFFFF))[0]
            )
        return out
    if number == 5 and wire == 5:
        return [_float(value)]
    if number == 6 and wire == 1:
        return [_double(value)]
    if wire == 0:
        return [_signed64(value)]
    return []


def _plugin_name(metadata: bytes) -> str | None:
    for number, wire, value in fields(metadata):
        if number == 1 and wire == 2:
            for n, w, v in fields(value):
                if n == 1 and w == 2:
                    return v.decode("utf-8", "replace")
    return None


def _event_scalars(payload: bytes, plugins: dict[str, str | None]) -> Iterator[Scalar]:
    wall_time, step, summary = 0.0, 0, None
    for number, wire, value in fields(payload):
        if number == 1 and wire == 1:
            wall_time = _double(value)
        elif number == 2 and wire == 0:
            step = _signed64(value)
        elif number == 5 and wire == 2:
            summary = value
    if summary is None:
        return
    for number, wire, value in fields(summary):
        if number != 1 or wire != 2:
            continue
        tag, simple, tensor, metadata = None, None, None, None
        for n, w, v in fields(value):
            if n == 1 and w == 2:
                tag = v.decode("utf-8")
            elif n == 2 and w == 5:
                simple = _float(v)
            elif n == 8 and w == 2:
                tensor = v
            elif n == 9 and w == 2:
                metadata = v
        if tag is None:
            continue
        if metadata is not None:
            # Writers give a tag's plugin with its first value only; later ones inherit it.
            plugins[tag] = _plugin_name(metadata)
        if simple is not None:
            yield Scalar(step, tag, simple, wall_time)
        elif tensor is not None and plugins.get(tag) == "scalars":
            number_held = _tensor_scalar(tensor)
            if number_held is not None:
                yield Scalar(step, tag, number_held, wall_time)


def read_events(data: bytes) -> Iterator[Scalar]:
    """Every scalar in an event file's bytes, in the order written. Histograms, images, text and
    other plugins' tensors are passed over. Raises EventFileError naming the record."""
    plugins: dict[str, str | None] = {}
    for index, payload in records(data):
        try:
            yield from _event_scalars(payload, plugins)
        except (ValueError, UnicodeDecodeError, struct.error) as error:
            raise EventFileError(f"record {index}", f"not an Event protocol buffer ({error})") from None


# ---- writing ----

_SCALARS_METADATA = _bytes_field(1, _bytes_field(1, b"scalars"))


def _event(
    wall_time: float, step: int | None = None, summary: bytes | None = None, version: str | None = None
) -> bytes:
    out = _key(1, 1) + struct.pack("<d", wall_time)
    if step is not None:
        out += _key(2, 0) + _encode_varint(step)
    if version is not None:
        out += _bytes_field(3, version.encode())
    if summary is not None:
        out += _bytes_field(5, summary)
    return out


def _float32(value: float) -> bytes:
    try:
        return struct.pack("<f", value)
    except OverflowError:  # finite but past float32's range: TensorBoard would show ±inf
        return struct.pack("<f", math.copysign(math.inf, value))


def event_file_name(wall_time: float | None = None) -> str:
    """The name TensorBoard looks for in a log folder: events.out.tfevents.<time>.<host>."""
    return f"events.out.tfevents.{int(wall_time if wall_time is not None else time.time())}.{socket.gethostname()}"


def write_scalars(path: Path, points: Iterable) -> None:
    """Append points (anything with step, name, value and time, e.g. imports.formats.Point) to
    the event file at path as `simple_value` scalars (float32, as TensorBoard shows them), the file
    begun with its version record if new. A point without a time is written at the time of
    writing, as TensorBoard needs one."""
    path = Path(path)
    now = time.time()
    out = bytearray()
    if not path.exists() or path.stat().st_size == 0:
        out += frame(_event(now, version="brain.Event:2"))
    for point in points:
        simple = _float32(float(point.value))
        tag = _bytes_field(1, point.name.encode())
        summary_value = tag + _key(2, 5) + simple + _bytes_field(9, _SCALARS_METADATA)
        wall_time = point.time if point.time is not None else now
        out += frame(_event(wall_time, step=point.step, summary=_bytes_field(1, summary_value)))
    with path.open("ab") as file:
        file.write(out)
