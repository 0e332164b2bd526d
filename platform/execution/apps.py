from django.apps import AppConfig


class ExecutionAppConfig(AppConfig):
    """How work reaches a worker: leases, messages by task name, the worker registry."""

    name = "execution"
    default_auto_field = "django.db.models.BigAutoField"
