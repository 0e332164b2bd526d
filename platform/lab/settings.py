"""Settings from the environment with safe defaults for one machine: SQLite under `LAB_VAR_DIR` and
the filesystem broker unless `DATABASE_URL` / `REDIS_URL` are set; the folders runs may read
(`LAB_DATA_ROOTS`, `LAB_MODEL_ROOTS`); each worker's torch threads and memory ceiling, by default
an equal share of the machine among the workers `make up` starts."""

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

REPO_DIR = Path(__file__).resolve().parents[2]
VAR_DIR = Path(os.environ.get("LAB_VAR_DIR", REPO_DIR / "var")).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated once and kept under var/."""
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity where the OS reports one."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_memory_mb() -> int:
    """Physical memory in MiB, or the container's memory limit (cgroup v2) when that is smaller."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = ""
    if limit.isdigit():
        total = min(total, int(limit))
    return total // 2**20


def default_torch_threads(cores: int, workers: int) -> int:
    """Torch threads per worker when `workers` workers share `cores` cores: an equal share, at least 1."""
    return max(1, cores // workers)


def _paths(name: str, default: Path) -> list[str]:
    value = os.environ.get(name)
    return [str(Path(p).resolve()) for p in value.split(":") if p] if value else [str(default)]


def _number(name: str, kind: type, default: float, minimum: float):
    """Setting `name` from the environment as an int or float, at least `minimum`."""
    try:
        value = kind(os.environ.get(name) or default)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, not {os.environ.get(name)!r}") from exc
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    return value


SECRET_KEY = _secret_key()
DEBUG = os.environ.get("DEBUG", "") in ("1", "true", "yes")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Only for its templates and static files: /api/docs loads Swagger UI from our own static
    # files, not from a CDN, so the API docs work offline.
    "ninja",
    "accounts",
    "execution",
    "experiments",
    "dashboards",
    "imports",
    "alerts",
    "lab",  # no models: the launcher's commands, `manage.py up` and `serve`
]

MIDDLEWARE = [
    "lab.middleware.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "lab.middleware.DeletedMeanwhileMiddleware",
]

# Every response's Content-Security-Policy: scripts only from our own static files (no inline
# scripts or event handlers anywhere, the admin's and the API docs' included), nothing loaded
# from other hosts, no framing. Styles may be inline: Plotly injects a stylesheet and sets style
# attributes on the charts it draws. SecurityMiddleware adds nosniff, Referrer-Policy and
# Cross-Origin-Opener-Policy; XFrameOptionsMiddleware X-Frame-Options: DENY.
CONTENT_SECURITY_POLICY = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'", "'unsafe-inline'"],
    "img-src": ["'self'", "data:", "blob:"],
    "font-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}

ROOT_URLCONF = "lab.urls"
WSGI_APPLICATION = "lab.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [REPO_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_sqlite_path = VAR_DIR / "db.sqlite3"
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{_sqlite_path}", conn_max_age=60
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL and immediate transactions let the web server and a worker write without "database is locked".
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Username and password checks, refused past the login rate limits (accounts.throttle).
AUTHENTICATION_BACKENDS = ["accounts.throttle.ThrottledModelBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "experiment-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
# Serve app static files straight from their packages, so no collectstatic step is needed locally.
WHITENOISE_USE_FINDERS = True
# Plotly.js's cartesian bundle (every trace our pages draw, a third of the full bundle's size),
# vendored from npm's plotly.js-cartesian-dist-min at the version of the plotly package, with its
# gzip beside it (`gzip -9 -n`), which whitenoise serves to browsers that take it: pages work offline.
STATICFILES_DIRS = [("plotly", REPO_DIR / "platform" / "lab" / "plotly")]

# Celery: Redis when REDIS_URL is set, else kombu's filesystem transport under var/.
REDIS_URL = os.environ.get("REDIS_URL", "")
BROKER_DIR = VAR_DIR / "broker"
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
else:
    CELERY_BROKER_URL = "labfs://"  # kombu's filesystem transport, fixed (lab.broker)
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)

# Rate limits on guessing (accounts.throttle): failed logins per username and client address,
# unknown API tokens per client address, each count kept LAB_RATE_WINDOW_S seconds; the header a
# trusted reverse proxy puts the client's address in (empty: the peer's address).
LAB_LOGIN_FAILURE_LIMIT = int(os.environ.get("LAB_LOGIN_FAILURE_LIMIT", 10))
LAB_TOKEN_FAILURE_LIMIT = int(os.environ.get("LAB_TOKEN_FAILURE_LIMIT", 20))
LAB_RATE_WINDOW_S = int(os.environ.get("LAB_RATE_WINDOW_S", 900))
LAB_CLIENT_IP_HEADER = os.environ.get("LAB_CLIENT_IP_HEADER", "")
LAB_MAX_TOKENS_PER_USER = _number("LAB_MAX_TOKENS_PER_USER", int, 20, minimum=1)
for _name in ("LAB_LOGIN_FAILURE_LIMIT", "LAB_TOKEN_FAILURE_LIMIT", "LAB_RATE_WINDOW_S"):
    if globals()[_name] < 1:
        raise ImproperlyConfigured(f"{_name} must be at least 1, not {globals()[_name]}")

# Django's cache holds the rate limits' counts: Redis when REDIS_URL is set (every web process
# sees the same counts; short timeouts, as the limits fail open when it is down), else files.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "lab",
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": VAR_DIR / "django-cache",
            "TIMEOUT": LAB_RATE_WINDOW_S,
            "OPTIONS": {"MAX_ENTRIES": 10_000},
        }
    }

# Run bookkeeping; durations in seconds.
LAB_DATA_ROOTS = _paths("LAB_DATA_ROOTS", VAR_DIR / "data")
LAB_MODEL_ROOTS = _paths("LAB_MODEL_ROOTS", VAR_DIR / "models")
LAB_RUNS_DIR = VAR_DIR / "runs"
LAB_CACHE_DIR = Path(os.environ.get("LAB_CACHE_DIR", VAR_DIR / "cache")).resolve()
LAB_MAX_RUN_S = int(os.environ.get("LAB_MAX_RUN_S", 7 * 24 * 3600))
LAB_HEARTBEAT_TIMEOUT_S = float(os.environ.get("LAB_HEARTBEAT_TIMEOUT_S", 60))
LAB_REAP_INTERVAL_S = float(os.environ.get("LAB_REAP_INTERVAL_S", 15))
LAB_MAX_ATTEMPTS = int(os.environ.get("LAB_MAX_ATTEMPTS", 3))
# A rollout job may lose its worker (killed, out of memory) this many times before it is given up;
# its own failures count against LAB_MAX_ATTEMPTS.
LAB_MAX_JOB_LOSSES = _number("LAB_MAX_JOB_LOSSES", int, 10, minimum=1)
LAB_MAX_SWEEP_RUNS = int(os.environ.get("LAB_MAX_SWEEP_RUNS", 512))
# People's notes a run or an experiment holds at most (a note over it is refused until one is
# deleted); the notes workers leave on a run are not counted.
LAB_MAX_NOTES = _number("LAB_MAX_NOTES", int, 100, minimum=1)
# How long a worker keeps retrying a running attempt's database writes and reads while the
# database is unreachable (workers/db_outage.py) before the attempt fails.
LAB_DB_OUTAGE_S = float(os.environ.get("LAB_DB_OUTAGE_S", 120))
if LAB_DB_OUTAGE_S < 0:
    raise ImproperlyConfigured(f"LAB_DB_OUTAGE_S must be at least 0 seconds, not {LAB_DB_OUTAGE_S}")
# Fair sharing: per team, at most this many runs queued (a submission or retry over it is refused)
# and running (workers pass over a team at its cap); 0 means no cap.
LAB_TEAM_MAX_QUEUED = _number("LAB_TEAM_MAX_QUEUED", int, 1024, minimum=0)
LAB_TEAM_MAX_RUNNING = _number("LAB_TEAM_MAX_RUNNING", int, 0, minimum=0)
# A run's trainer processes (`execution.train_processes`) at most: more is refused at submission,
# as is more than the cores (CPU) or GPUs a live worker of the run's queue reports.
LAB_MAX_TRAIN_PROCESSES = _number("LAB_MAX_TRAIN_PROCESSES", int, 8, minimum=1)
# A run attempt during which other processes on its training worker's machine used more than
# this many cores on average (workers.measure) ran contended: its throughput is flagged and left
# out of throughput comparisons and speed-ups by default.
LAB_CONTENDED_CORES = _number("LAB_CONTENDED_CORES", float, 0.5, minimum=0)
# The broker only delivers: sending a message is best-effort and gives up after about
# LAB_BROKER_TIMEOUT_S per connection attempt; every worker's dispatcher checks every
# LAB_DISPATCH_INTERVAL_S for queued work whose message may be missing (never sent, or lost with
# a broker restart) once it has waited LAB_DISPATCH_GRACE_S, and sends it again.
LAB_BROKER_TIMEOUT_S = _number("LAB_BROKER_TIMEOUT_S", float, 2, minimum=0.1)
LAB_DISPATCH_INTERVAL_S = _number("LAB_DISPATCH_INTERVAL_S", float, 5, minimum=0.1)
LAB_DISPATCH_GRACE_S = _number("LAB_DISPATCH_GRACE_S", float, 10, minimum=0)

# Alerts (docs/alerts.md): every worker delivers the due ones every LAB_ALERTS_INTERVAL_S; a
# delivery is tried at most LAB_ALERTS_MAX_ATTEMPTS times, LAB_ALERTS_BACKOFF_S after the first
# failure, doubling up to LAB_ALERTS_BACKOFF_MAX_S; a webhook answers within LAB_ALERTS_TIMEOUT_S.
# Webhooks go only to public addresses unless LAB_ALERTS_ALLOW_PRIVATE=1 (a lab whose receivers
# are on its own network). LAB_BASE_URL (https://lab.example.org) makes the links in alerts
# absolute; emails go through Django's email backend (EMAIL_HOST, EMAIL_PORT, … from the environment).
# LAB_ALERTS_DELIVER=0: this worker delivers none (a compute node that cannot reach the receivers).
LAB_ALERTS_DELIVER = os.environ.get("LAB_ALERTS_DELIVER", "1") not in ("0", "false", "no")
LAB_ALERTS_INTERVAL_S = _number("LAB_ALERTS_INTERVAL_S", float, 2, minimum=0.05)
LAB_ALERTS_MAX_ATTEMPTS = _number("LAB_ALERTS_MAX_ATTEMPTS", int, 8, minimum=1)
LAB_ALERTS_BACKOFF_S = _number("LAB_ALERTS_BACKOFF_S", float, 30, minimum=0)
LAB_ALERTS_BACKOFF_MAX_S = _number("LAB_ALERTS_BACKOFF_MAX_S", float, 3600, minimum=0)
LAB_ALERTS_TIMEOUT_S = _number("LAB_ALERTS_TIMEOUT_S", float, 10, minimum=0.1)
LAB_ALERTS_ALLOW_PRIVATE = os.environ.get("LAB_ALERTS_ALLOW_PRIVATE", "") in ("1", "true", "yes")
# Events (with their deliveries and log) older than this go, once nothing is delivering them.
LAB_ALERTS_KEEP_DAYS = _number("LAB_ALERTS_KEEP_DAYS", float, 30, minimum=1)
LAB_BASE_URL = os.environ.get("LAB_BASE_URL", "")
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = _number("EMAIL_PORT", int, 25, minimum=1)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = os.environ.get("EMAIL_USE_TLS", "") in ("1", "true", "yes")
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "lab@localhost")

# The queues of the Celery workers `manage.py up` (`make up`) starts on this machine, one worker
# each: a training worker and a rollout worker, so simulated, distributed and async runs all run.
UP_WORKER_QUEUES = ("cpu", "rollout")
# Torch (and OpenMP/MKL) threads of each worker process; a share of the cores each, so that the
# workers `make up` starts never run more busy threads than the machine has cores.
LAB_TORCH_THREADS = int(
    os.environ.get("LAB_TORCH_THREADS") or default_torch_threads(usable_cores(), len(UP_WORKER_QUEUES))
)
if LAB_TORCH_THREADS < 1:
    raise ImproperlyConfigured(f"LAB_TORCH_THREADS must be at least 1, not {LAB_TORCH_THREADS}")


def default_run_memory_mb(machine_mb: int, workers: int) -> int:
    """The memory ceiling of a run when `workers` workers share `machine_mb` MiB: an equal share."""
    return max(1, machine_mb // workers)


# What one run may add to its training worker's resident memory, in MiB (workers.memory); a run
# over it ends `failed` with the reason and is not re-queued. 0: no ceiling.
_run_memory = os.environ.get("LAB_RUN_MEMORY_MB", "")
if _run_memory:
    try:
        LAB_RUN_MEMORY_MB = int(_run_memory)
    except ValueError:
        raise ImproperlyConfigured(
            f"LAB_RUN_MEMORY_MB must be a whole number of MiB (0: off), not {_run_memory!r}"
        ) from None
else:
    LAB_RUN_MEMORY_MB = default_run_memory_mb(machine_memory_mb(), len(UP_WORKER_QUEUES))
if LAB_RUN_MEMORY_MB < 0:
    raise ImproperlyConfigured(f"LAB_RUN_MEMORY_MB must be 0 (off) or more, not {LAB_RUN_MEMORY_MB}")

# Imports of runs from other tools' files (imports): an upload (or a file given to `manage.py
# import`) is at most this many bytes; uploads stream to disk under LAB_VAR_DIR, never to memory.
LAB_IMPORT_MAX_BYTES = _number("LAB_IMPORT_MAX_BYTES", int, 256 * 2**20, minimum=1)
LAB_IMPORTS_DIR = VAR_DIR / "imports"
FILE_UPLOAD_TEMP_DIR = LAB_IMPORTS_DIR / "uploads"
FILE_UPLOAD_TEMP_DIR.mkdir(parents=True, exist_ok=True)
FILE_UPLOAD_HANDLERS = [
    "imports.uploads.SizeCap",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
