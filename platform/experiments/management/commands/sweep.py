"""`python manage.py sweep FILE --user USERNAME`: submit a sweep from a YAML or JSON file holding the
API's fields (name, team, description, config, presets, staleness, seeds, axes, serial), checked
as the API and the form check it. Prints the experiment and its runs; on bad input, every problem
as `field: rule`, exit status 2, and nothing queued."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from pydantic import ValidationError

from experiments import sweeps
from experiments.schemas import SweepIn
from rlcore.config import error_list


class Command(BaseCommand):
    help = "Submit a sweep (the API's POST /api/sweeps body, as YAML or JSON) as USERNAME."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument("--user", required=True, help="who submits it (a member of its team)")

    def handle(self, *args, file: Path, user: str, **options):
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"no user is called {user!r}", returncode=2)
        try:
            text = file.read_text()
            data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise CommandError(f"{file}: cannot be read as a sweep: {exc}", returncode=2) from exc
        if not isinstance(data, dict):
            raise CommandError(
                f"{file}: expected a mapping of the sweep's fields at the top level", returncode=2
            )
        try:
            sweep = SweepIn.model_validate(data)
        except ValidationError as exc:
            self._refuse(file, error_list(exc))
        try:
            experiment = sweeps.submit(owner, sweep)
        except sweeps.SweepError as exc:
            self._refuse(file, exc.errors)
        runs = experiment.runs.count()
        self.stdout.write(
            f"experiment {experiment.pk} ({experiment.name}): {runs} run{'s' if runs != 1 else ''} queued"
        )

    @staticmethod
    def _refuse(file: Path, errors: list[tuple[str, str]]):
        lines = "\n".join(f"  {field}: {message}" for field, message in errors)
        raise CommandError(f"{file}: the sweep was not queued\n{lines}", returncode=2)
