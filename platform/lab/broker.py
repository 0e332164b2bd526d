"""The embedded broker (`labfs://`): kombu's filesystem transport with messages that appear whole
(written aside, then renamed into place), an undecodable message dropped with a log line instead
of stopping the worker, and the exchange table rewritten under one exclusive lock."""

from __future__ import annotations

import logging
import os
import uuid
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

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

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        """Add `queue` to `exchange`'s table: read, change and write it under one exclusive lock."""
        path = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            with open(path, "a+b", buffering=0) as f:  # created if missing, never truncated unlocked
                filesystem.lock(f, filesystem.LOCK_EX)
                try:
                    f.seek(0)
                    queues = _table(f.read())
                    if entry not in queues:
                        f.truncate(0)
                        f.write(str_to_bytes(dumps([entry, *queues])))  # appended: at 0 now
                finally:
                    filesystem.unlock(f)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot open {path}") from exc

    def get_table(self, exchange):
        """`exchange`'s table; empty while its first binding is being written."""
        try:
            with open(self._exchange_file(exchange), "rb") as f:
                filesystem.lock(f, filesystem.LOCK_SH)
                try:
                    return _table(f.read())
                finally:
                    filesystem.unlock(f)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot open {self._exchange_file(exchange)}") from exc

    def _get(self, queue):
        while True:  # until a readable message, or kombu's Empty
            try:
                return super()._get(queue)
            except ValueError:
                log.warning(
                    "dropped an unreadable message of queue %s; the dispatcher sends its work again", queue
                )


def _table(data: bytes) -> list:
    return [filesystem.exchange_queue_t(*q) for q in loads(bytes_to_str(data))] if data.strip() else []


class Transport(filesystem.Transport):
    Channel = Channel
