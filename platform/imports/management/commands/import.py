"""`python manage.py import FILE --tool TOOL --experiment ID --user USERNAME [--preset P]
[--staleness S] [--seed N] [--map source=lab ...] [--run NAME]`: import one run from another tool's file (or
exported folder) into an experiment of USERNAME's team (`imports.service`), read-only, with its
provenance. Prints the run made, or that the file was imported already (nothing changes); on bad
input, `field: rule` naming the file and its line or record, exit status 2, and nothing stored."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from experiments.models import Experiment
from imports import formats, service


class Command(BaseCommand):
    help = "Import a run from another tool's file into an experiment of USERNAME's team."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument("--tool", required=True, help=f"one of {', '.join(formats.TOOLS)}")
        parser.add_argument("--experiment", required=True, type=int, help="the experiment's id")
        parser.add_argument(
            "--user", required=True, help="who imports it (a member of the experiment's team)"
        )
        parser.add_argument("--preset", help="the run's preset (default: the file's config's)")
        parser.add_argument(
            "--staleness",
            help=f"its staleness cell: {service.STALENESS_SYNTAX} (default: the file's config's)",
        )
        parser.add_argument("--seed", type=int, help="its seed (default: the file's config's)")
        parser.add_argument("--run", help="the run to read, in a file that holds several (a Trackio project)")
        parser.add_argument(
            "--map",
            action="append",
            default=[],
            metavar="SOURCE=LAB",
            help="store the file's metric SOURCE as LAB (repeatable); the tool's default mapping otherwise, "
            "and names it does not map go under imported/",
        )

    def handle(self, *args, file: Path, tool: str, experiment: int, user: str, **options):
        person = get_user_model().objects.filter(username=user).first()
        if person is None:
            raise CommandError(f"no user is called {user!r}", returncode=2)
        target = Experiment.visible_to(person).filter(pk=experiment).first()
        if target is None:
            raise CommandError(f"{user} has no experiment {experiment} in their teams", returncode=2)
        try:
            outcome = service.import_file(
                target,
                person,
                tool,
                file,
                service.Placement(options["preset"], options["staleness"], options["seed"]),
                service.parse_mapping(options["map"]),
                run=options["run"],
            )
        except service.ImportRefused as exc:
            raise CommandError(f"{file}: not imported\n  {exc.field}: {exc.message}", returncode=2) from exc
        record = outcome.record
        run = record.run
        if outcome.created:
            self.stdout.write(
                f"imported {record.file_name} ({record.source}) as run {run.pk} of experiment {target.pk}: "
                f"{run.preset}, {run.staleness}, seed {run.seed}, {record.points} points"
            )
        else:
            self.stdout.write(f"{record.file_name} was imported already, as run {run.pk}: nothing changed")
        for source, lab in record.mapping.items():
            if source != lab:
                self.stdout.write(f"  {source} → {lab}")
