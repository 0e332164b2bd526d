"""`python manage.py worker QUEUE`: one Celery worker for QUEUE, exactly as `manage.py up` starts
each of its workers (`lab.celery.worker_command`, with `up.worker_env`'s thread counts), in place of
this process, so it keeps this process's PID (the sbatch scripts of `deploy/slurm/` run this)."""

from __future__ import annotations

import os
import re

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from lab.celery import QUEUES, worker_command
from lab.management.commands.up import worker_env


class Command(BaseCommand):
    help = "Run one worker for QUEUE (cpu, gpu, rollout, rollout-gpu) in the foreground, in place of this process."

    def add_arguments(self, parser):
        parser.add_argument("queue", choices=QUEUES, help="the queue the worker takes work from")
        parser.add_argument(
            "--name",
            default="",
            help="the worker's Celery node name before @host (default: QUEUE-PID); unique per host",
        )

    def handle(self, *args, queue: str, name: str, **options):
        if name and not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise CommandError(f"--name: letters, digits, '.', '_' and '-' only, not {name!r}")
        command = worker_command(queue, f"{name or f'{queue}-{os.getpid()}'}@%h")
        os.chdir(settings.REPO_DIR)
        os.execve(command[0], command, worker_env())
