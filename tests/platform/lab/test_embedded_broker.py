"""The embedded broker (`lab.broker`, kombu's filesystem transport with whole messages): a
consumer polling while producers write never sees a partial message, and a file that cannot be
decoded is dropped instead of stopping the worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kombu import Connection

import lab


@pytest.fixture
def connection(tmp_path):
    import lab.celery  # noqa: F401  (registers labfs://)

    folders = {
        "data_folder_in": str(tmp_path),
        "data_folder_out": str(tmp_path),
        "store_processed": False,
        "control_folder": str(tmp_path / "control"),
    }
    with Connection("labfs://", transport_options={**folders, "polling_interval": 0}) as conn:
        yield conn, tmp_path


PRODUCER = """
import sys
sys.path[:0] = sys.argv[1:3]
import lab.celery  # registers labfs://
from kombu import Connection
folder = sys.argv[3]
options = {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False,
           "control_folder": folder + "/control"}
with Connection("labfs://", transport_options=options) as conn, conn.SimpleQueue("q") as queue:
    for i in range(int(sys.argv[5])):
        queue.put({"who": int(sys.argv[4]), "i": i, "body": "x" * 1000})
"""


def start_script(script: str, folder: Path, *args: object) -> subprocess.Popen:
    """`script` in a Python process of its own, given the source roots, `folder` and `args`."""
    platform = str(Path(lab.__file__).resolve().parents[1])
    return subprocess.Popen(
        [sys.executable, "-c", script, str(Path(platform).parent), platform, str(folder), *map(str, args)],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "lab.settings"},
    )


def test_a_consumer_polling_while_producers_write_gets_every_message_whole(connection):
    """Producer processes write while the consumer polls without pause (kombu's own filesystem
    transport fails this at once: its consumer reads a message file created but not yet written)."""
    conn, folder = connection
    n_producers, per_producer = 3, 300
    producers = [start_script(PRODUCER, folder, who, per_producer) for who in range(n_producers)]
    received = []
    try:
        with conn.SimpleQueue("q") as queue:
            while len(received) < n_producers * per_producer:
                message = queue.get(timeout=60)  # a partial message would raise JSONDecodeError here
                received.append((message.payload["who"], message.payload["i"], len(message.payload["body"])))
                message.ack()
    finally:
        for p in producers:
            p.wait(timeout=60)
    assert [p.returncode for p in producers] == [0] * n_producers
    assert sorted(received) == [(w, i, 1000) for w in range(n_producers) for i in range(per_producer)]


def test_an_unreadable_message_is_dropped_and_the_next_one_delivered(connection):
    conn, folder = connection
    with conn.SimpleQueue("unreadable") as queue:
        # What kombu's own transport could leave for a consumer to read: an empty message file. Its
        # name sorts before any real message's (those start with the clock in ms, never with 0), so
        # the consumer meets it first.
        (folder / "0_broken.unreadable.msg").write_bytes(b"")
        queue.put({"ok": 1})
        message = queue.get(timeout=10)
        assert message.payload == {"ok": 1}
        message.ack()
    assert not (folder / "0_broken.unreadable.msg").exists()


BINDER = """
import sys, time
sys.path[:0] = sys.argv[1:3]
import lab.celery  # registers labfs://
from kombu import Connection
folder, queue, start = sys.argv[3], sys.argv[4], float(sys.argv[5])
options = {"data_folder_in": folder, "data_folder_out": folder, "control_folder": folder + "/control"}
with Connection("labfs://", transport_options=options) as conn:
    channel = conn.channel()
    while time.time() < start:
        pass
    channel._queue_bind("celery", queue, None, queue)
"""


def test_workers_binding_their_queues_at_once_leave_a_whole_table_with_every_queue(tmp_path):
    """Workers that start together each add their queue to the exchange's table (kombu's own
    transport, whose first writer truncates the file before it locks it, left a table cut short or
    with a stale tail in 9 of 10 such rounds here: no sender could decode it)."""
    queues = ["cpu", "rollout", "gpu-trainer-queue", "rollout-gpu-queue-name"]  # of unequal lengths
    for round_ in range(5):
        folder = tmp_path / f"round-{round_}"
        folder.mkdir()
        start = time.time() + 1.0  # every binder is ready by then, and they bind in the same instant
        binders = [start_script(BINDER, folder, queue, start) for queue in queues]
        assert [b.wait(timeout=60) for b in binders] == [0] * len(queues)
        table = json.loads((folder / "control" / "celery.exchange").read_text())
        assert sorted(q for _, _, q in table) == sorted(queues), round_
