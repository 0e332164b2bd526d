from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Who sees what: teams, memberships, invitations, API tokens, login and its rate limits."""

    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"
