"""The Django project of Off-Policy Lab: settings from the environment, URLs, WSGI entry, the Celery app."""
