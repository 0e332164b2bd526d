"""ASGI entry (`gunicorn lab.asgi`: what `manage.py up` and docker-compose serve); puts `platform/`
on sys.path, closes database connections after each request (views run in threads that end), and
warms the app up before the first request."""

import os
import sys
import warnings
from pathlib import Path

_PLATFORM_DIR = str(Path(__file__).resolve().parents[1])
if _PLATFORM_DIR not in sys.path:
    sys.path.insert(0, _PLATFORM_DIR)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")

from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

for _database in settings.DATABASES.values():
    _database["CONN_MAX_AGE"] = 0
warnings.filterwarnings("ignore", message="StreamingHttpResponse must consume synchronous iterators")

application = get_asgi_application()

# Import the URL map and everything behind it (views, the API and its schemas) now, while the
# worker boots, rather than in its first request: that one would take a second or more on a
# loaded machine, and the server is announced only once every worker answers at once.
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns  # noqa: B018
