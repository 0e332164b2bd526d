"""WSGI entry (`gunicorn lab.wsgi`); puts `platform/` on sys.path for servers started elsewhere."""

import os
import sys
from pathlib import Path

_PLATFORM_DIR = str(Path(__file__).resolve().parents[1])
if _PLATFORM_DIR not in sys.path:
    sys.path.insert(0, _PLATFORM_DIR)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()
