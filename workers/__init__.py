"""The worker side. Start a worker from the repository root with `celery -A workers worker -Q cpu`:
importing this package puts `platform/` on `sys.path`, points Django at `lab.settings` and
re-exports the Celery app of `lab.celery` as `workers.app`. The web tier never imports it."""

import os
import sys
from pathlib import Path

_PLATFORM_DIR = str(Path(__file__).resolve().parents[1] / "platform")
if _PLATFORM_DIR not in sys.path:
    sys.path.insert(0, _PLATFORM_DIR)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")

from lab.celery import app  # noqa: E402

__all__ = ["app"]
