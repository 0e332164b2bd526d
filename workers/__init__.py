"""The worker side: Celery tasks that execute runs (`workers.tasks`) and the sink they report through.

Start a worker from the repository root with `celery -A workers worker -Q cpu` (or `-Q gpu`).
The Celery app itself lives in the web tier's `lab.celery`, configured from Django settings;
importing this package puts `platform/` (a source root, not a package) on `sys.path`, points
Django at `lab.settings` and re-exports that app as `workers.app`, which is where `-A workers`
looks for it. The web tier never imports this package: it sends tasks by name.
"""

import os
import sys
from pathlib import Path

_PLATFORM_DIR = str(Path(__file__).resolve().parents[1] / "platform")
if _PLATFORM_DIR not in sys.path:
    sys.path.insert(0, _PLATFORM_DIR)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")

from lab.celery import app  # noqa: E402

__all__ = ["app"]
