"""The comparison's JSON, kept per process for as long as what it was computed from stands: a
dashboard is polled every few seconds, and a comparison of finished runs asks for the same answer
each time. The key is the query and the state of every run it reads (`state`): a run that logs a
point beats its heartbeat in the same transaction, so any new point, retry, archiving or rename
changes the key and the comparison is computed again. A panel whose inputs change less often than
the runs' state (the statistics of final values) is kept in the same store under its own key
(`kept`): one store, one budget, one lock."""

from __future__ import annotations

import json
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Max, QuerySet, Sum

from experiments.models import MetricSummary, Run

MAX_BYTES = 64 * 2**20  # of JSON kept per process; the least recently used goes first
_kept: OrderedDict[tuple, bytes] = OrderedDict()
_size = 0
_lock = threading.Lock()  # an ASGI process serves its views in several threads
T = TypeVar("T")


def state(runs: QuerySet[Run]) -> tuple:
    """What can change in what the comparison of `runs` reads, in two queries: each run's creation
    (a key used again is another run), status, attempt, archiving, heartbeat, end, provenance and
    its experiment's name, and how many points it logged up to which step."""
    fields = (
        "pk",
        "created",  # a primary key used again (SQLite after the newest rows' deletion) is another run
        "status",
        "attempt",
        "archived",
        "heartbeat",
        "finished",
        "experiment__name",
        "provenance",
    )
    rows = tuple(
        (*row[:-1], json.dumps(row[-1], sort_keys=True)) for row in runs.order_by("pk").values_list(*fields)
    )
    logged = tuple(
        MetricSummary.objects.filter(run__in=runs.values("pk"))
        .values("run_id")
        .annotate(points=Sum("count"), last=Max("last_step"))
        .order_by("run_id")
        .values_list("run_id", "points", "last")
    )
    return rows, logged


def json_bytes(payload: Any) -> bytes:
    """`payload` as compact JSON (orjson: a comparison's ~200,000 numbers in a tenth of the time
    `json` takes; numpy numbers as numbers, other keys as strings, anything else as Django's
    encoder writes it). What orjson cannot write (a whole number beyond 64 bits in a config
    value) goes through `json`, as before."""
    try:
        return orjson.dumps(
            payload,
            option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
            default=DjangoJSONEncoder().default,
        )
    except orjson.JSONEncodeError:
        return json.dumps(payload, cls=DjangoJSONEncoder).encode()


def cached(key: tuple, compute: Callable[[], bytes]) -> bytes:
    """`compute()`'s bytes for `key`, computed once while the key stands (requests in other
    threads of the process may compute it at the same time: the last one is kept)."""
    global _size
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    content = compute()
    with _lock:
        _size += len(content) - len(_kept.get(key, b""))
        _kept[key] = content
        while _size > MAX_BYTES and len(_kept) > 1:
            _, dropped = _kept.popitem(last=False)
            _size -= len(dropped)
    return content


def kept(key: tuple, compute: Callable[[], T]) -> T:
    """`compute()`'s value for `key`, kept in the store of `cached` as pickled bytes (counted in
    its budget), so each caller gets its own copy to change. Keys of values start with a name
    (`("statistics", …)`), never a payload key's query table."""
    return pickle.loads(cached(key, lambda: pickle.dumps(compute(), protocol=pickle.HIGHEST_PROTOCOL)))


def forget() -> None:
    """Drop everything kept (tests that change runs behind the models' back; a benchmark timing
    the comparison computed whole)."""
    global _size
    with _lock:
        _kept.clear()
        _size = 0
