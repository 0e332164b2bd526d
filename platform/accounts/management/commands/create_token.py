"""`python manage.py create_token USERNAME`: print a new API token for that user."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts.models import ApiToken, TooManyTokens


class Command(BaseCommand):
    help = "Create an API bearer token for USERNAME and print it (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="command line", help="what the token is for")

    def handle(self, *args, username: str, name: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user is called {username!r}; create one with `manage.py createsuperuser`")
        try:
            self.stdout.write(ApiToken.issue(user, name))
        except TooManyTokens as exc:
            raise CommandError(str(exc)) from exc
