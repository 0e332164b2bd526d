from django.apps import AppConfig


class LabConfig(AppConfig):
    """The project: settings and wiring (no models), and the launcher's commands `manage.py up`
    and `manage.py serve`."""

    name = "lab"
