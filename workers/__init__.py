"""The Celery app that executes runs: `celery -A workers worker -Q cpu` (or `-Q gpu`).

Importing it puts `platform/` on `sys.path` and points Django at `lab.settings`, so the
worker shares the web tier's models and configuration. The broker is Redis when
`REDIS_URL` is set, else kombu's filesystem transport under `var/broker/`. One worker
executes one run at a time (solo pool, prefetch 1); messages are acknowledged only after
the run ends, and the run's own row in the database, not the message, decides whether
it executes.
"""

import os
import sys
from pathlib import Path

_PLATFORM_DIR = str(Path(__file__).resolve().parents[1] / "platform")
if _PLATFORM_DIR not in sys.path:
    sys.path.insert(0, _PLATFORM_DIR)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")

from celery import Celery  # noqa: E402
from django.conf import settings  # noqa: E402
from kombu import Queue  # noqa: E402

QUEUES = ("cpu", "gpu")

app = Celery("workers", include=["workers.tasks"])


def _transport_options() -> dict:
    if settings.REDIS_URL:
        # An unacknowledged run must not be handed to a second worker while the first still trains.
        return {"visibility_timeout": settings.LAB_MAX_RUN_S + 3600}
    queue_dir = str(settings.BROKER_DIR / "queue")
    return {
        "data_folder_in": queue_dir,
        "data_folder_out": queue_dir,
        "processed_folder": str(settings.BROKER_DIR / "processed"),
        "store_processed": False,
        "control_folder": str(settings.BROKER_DIR / "control"),
    }


app.conf.update(
    broker_url=settings.CELERY_BROKER_URL,
    broker_transport_options=_transport_options(),
    broker_connection_retry_on_startup=True,
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
    """The command line of one worker process for `queue` (what `make up` and the tests start)."""
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
