"""The Celery app that carries work to workers, configured from Django settings: Redis when
`REDIS_URL` is set, else the embedded filesystem broker (`lab.broker`). One run per worker at a
time (solo pool, prefetch 1), acknowledged after it ends; the tasks register when a worker imports
`workers`. The database decides what runs; the broker only delivers (docs/architecture.md)."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")

from celery import Celery  # noqa: E402
from django.conf import settings  # noqa: E402
from kombu import Queue  # noqa: E402
from kombu.transport import TRANSPORT_ALIASES  # noqa: E402

TRANSPORT_ALIASES["labfs"] = "lab.broker:Transport"  # the embedded broker (settings.CELERY_BROKER_URL)

# Training jobs go to cpu/gpu; the rollout jobs of distributed and async runs to rollout/rollout-gpu.
QUEUES = ("cpu", "gpu", "rollout", "rollout-gpu")

app = Celery("lab", include=["workers.tasks"])


def _transport_options() -> dict:
    if settings.REDIS_URL:
        return {
            # An unacknowledged run must not be handed to a second worker while the first still trains.
            "visibility_timeout": settings.LAB_MAX_RUN_S + 3600,
            # A broker that cannot be reached holds neither a request nor the dispatcher for long;
            # reads wait longer than a worker's 1 s BRPOP poll.
            "socket_connect_timeout": settings.LAB_BROKER_TIMEOUT_S,
            "socket_timeout": 2 * settings.LAB_BROKER_TIMEOUT_S + 1,
        }
    queue_dir = str(settings.BROKER_DIR / "queue")
    return {
        "data_folder_in": queue_dir,
        "data_folder_out": queue_dir,
        "processed_folder": str(settings.BROKER_DIR / "processed"),
        "store_processed": False,
        "control_folder": str(settings.BROKER_DIR / "control"),
        # kombu polls the folder once a second by default; a trainer waiting for a rollout job
        # would wait that long for every batch.
        "polling_interval": 0.01,
    }


app.conf.update(
    broker_url=settings.CELERY_BROKER_URL,
    broker_transport_options=_transport_options(),
    broker_connection_retry_on_startup=True,
    # A worker reconnects to a broker that went away (a Redis restart loses its messages; the
    # dispatcher re-sends them) for as long as it takes, instead of exiting after 100 tries.
    broker_connection_retry=True,
    broker_connection_max_retries=None,
    broker_connection_timeout=settings.LAB_BROKER_TIMEOUT_S,
    # Publishing tries three times within about a second, then raises: the caller logs it, the
    # database keeps the work queued, and the dispatcher sends it once the broker is back.
    task_publish_retry=True,
    task_publish_retry_policy={
        "max_retries": 2,
        "interval_start": 0,
        "interval_step": 0.5,
        "interval_max": 1,
    },
    # The solo pool notices a lost connection only after the run it executes has ended; that run
    # is not cancelled (its row, not the message, says it is done).
    worker_cancel_long_running_tasks_on_connection_loss=False,
    task_queues=[Queue(name) for name in QUEUES],
    task_default_queue="cpu",
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_pool="solo",
    worker_concurrency=1,
    worker_hijack_root_logger=False,
)


def worker_command(queue: str, hostname: str) -> list[str]:
    """The command line of one worker process for `queue` (what `make up` and the tests start).

    Run it from the repository root: `-A workers` is found through the current directory.
    """
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers",
        "worker",
        "-Q",
        queue,
        "--hostname",
        hostname,
        "--loglevel",
        "INFO",
    ]
