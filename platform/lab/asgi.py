"""ASGI entry (`gunicorn lab.asgi -k asgi`: what `manage.py up` and docker-compose serve);
puts `platform/` on sys.path for servers started elsewhere.

Under ASGI Django runs each request's (synchronous) views in a thread of its own, so a
database connection kept open for reuse would stay behind in a thread that has ended: the web
server closes its connections after each request (Django's advice for ASGI). Whitenoise serves
static files from a synchronous iterator, which Django reads in a thread; its warning about
that is expected and silenced.
"""

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
