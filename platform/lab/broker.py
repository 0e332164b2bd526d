"""The embedded broker: kombu's filesystem transport, with messages that appear whole.

kombu's filesystem channel creates a message file empty, then locks and writes it. A worker
listing the queue folder in that instant takes the empty file, cannot decode it, and stops
("Unrecoverable error: JSONDecodeError"), which left runs without a rollout worker on the
embedded defaults. Here a message is written under a name no consumer reads and renamed into
place (atomic on one filesystem). A message that still cannot be decoded is dropped with a log
line instead of stopping the worker: the database decides what is queued, and a dispatcher
sends that work again (`experiments.dispatch`).

Registered as the `labfs://` transport by `lab.celery`.
"""

from __future__ import annotations

import logging
import os
import uuid
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Write the message beside the queue under a name `_get` skips, then rename it in."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        target = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f"partial-{uuid.uuid4()}")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, target)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {target!r} to directory") from exc

    def _get(self, queue):
        while True:  # until a readable message, or kombu's Empty
            try:
                return super()._get(queue)
            except ValueError:
                log.warning(
                    "dropped an unreadable message of queue %s; the dispatcher sends its work again", queue
                )


class Transport(filesystem.Transport):
    Channel = Channel
