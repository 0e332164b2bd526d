"""What the readers share: reading a file as text within the size cap, parsing one JSON value with
the place it came from, and turning the source's values into points (numbers kept as logged,
NaN and ±inf included; null a gap; nested objects flattened with "/")."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

from .base import ImportFormatError, Point

# The most bytes one import reads (a file, or all the files of an exported folder). A run's metrics
# are small next to this; a file past it is refused whole rather than read in part.
MAX_BYTES = 256 * 1024 * 1024


def check_size(path: Path, files: list[Path], max_bytes: int) -> None:
    """Refuse files larger than max_bytes together (path names them in the error)."""
    size = sum(file.stat().st_size for file in files)
    if size > max_bytes:
        raise ImportFormatError(path, None, f"is {size} bytes; an import reads at most {max_bytes} bytes")


def data(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, within the cap."""
    if not path.is_file():
        raise ImportFormatError(path, None, "not a file" if path.exists() else "no such file")
    check_size(path, [path], max_bytes)
    return path.read_bytes()


def text(path: Path, max_bytes: int) -> str:
    """The file as UTF-8 text, within the cap; a binary file (NUL bytes, or bytes that are not
    UTF-8) is refused with the line it goes wrong on."""
    return decode(path, data(path, max_bytes))


def decode(path: Path, raw: bytes) -> str:
    """raw as UTF-8 text, refused as binary as `text` says."""
    bad = raw.find(b"\0")
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = error.start if bad < 0 else min(bad, error.start)
    if bad >= 0:
        line = raw.count(b"\n", 0, bad) + 1
        raise ImportFormatError(path, f"line {line}", "binary data; expected UTF-8 text")
    return decoded


def lines(path: Path, max_bytes: int) -> Iterator[tuple[int, str]]:
    """(line number, line) for every line that is not blank."""
    for number, line in enumerate(text(path, max_bytes).splitlines(), start=1):
        if line.strip():
            yield number, line


def json_value(path: Path, where: str | None, source: str):
    """One JSON value (NaN and Infinity accepted, as Python's json writes them)."""
    try:
        return json.loads(source)
    except json.JSONDecodeError as error:
        raise ImportFormatError(path, where, f"not JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise ImportFormatError(path, where, "JSON nested too deeply") from None


def json_object(path: Path, where: str | None, source: str) -> dict:
    value = json_value(path, where, source)
    if not isinstance(value, dict):
        raise ImportFormatError(path, where, f"expected a JSON object, got {type(value).__name__}")
    return value


def step(path: Path, where: str | None, value, field: str = "step") -> int:
    """A step: a non-negative integer (an integral float such as 3.0 is taken as 3)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImportFormatError(path, where, f"{field} must be a non-negative integer (got {value!r})")
    return value


def timestamp(
    path: Path, where: str | None, value, field: str = "time", unit: str = "seconds"
) -> float | None:
    """A wall-clock time since the Unix epoch (in `unit`, as the file keeps it), or None where
    absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ImportFormatError(path, where, f"{field} must be a Unix time in {unit} (got {value!r})")
    return float(value)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numbers(values: dict, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(name, value) for every number in values, nested objects flattened with "/". A null is a
    gap and text, lists and booleans are not metrics: none of them gives a point."""
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from numbers(value, f"{name}/")
        elif is_number(value):
            yield name, float(value)


def unique(path: Path, points: list[Point]) -> list[Point]:
    """The points with one per (step, name): a resumed run logs some steps again, and the value
    written later wins, as the source's own dashboards show it. No points at all is an error."""
    if not points:
        raise ImportFormatError(path, None, "holds no metric values")
    latest: dict[tuple[int, str], Point] = {}
    for point in points:
        latest.pop((point.step, point.name), None)
        latest[(point.step, point.name)] = point
    return list(latest.values())
