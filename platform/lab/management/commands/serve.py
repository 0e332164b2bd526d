"""`python manage.py serve`: the web server alone, exactly as `manage.py up` starts it
(docker-compose's `web` service runs this behind its nginx)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from lab.management.commands.up import web_command


class Command(BaseCommand):
    help = "Run the web server (gunicorn's ASGI worker) in the foreground, in place of this process."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))

    def handle(self, *args, host: str, port: int, **options):
        command = web_command(host, port)
        os.chdir(settings.REPO_DIR)
        os.execv(command[0], command)
