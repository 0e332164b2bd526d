"""Tags, notes and saved views, for the pages and the API alike: many runs tagged at once (a
selection, or every run a query matches), a note on a run or an experiment, a team's named query.
Every refusal is a `TaggingError` naming the field and the rule."""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from accounts.models import Team
from experiments import runquery
from experiments.models import Experiment, ExperimentTag, Note, Run, RunTag, SavedView, check_tag
from lab.errors import FieldError

MAX_TAGS = 20
MAX_TAGGED_RUNS = 10_000
MAX_NOTE = 10_000


class TaggingError(FieldError):
    """A tag, note, view or runs query that breaks a rule."""


def tag_names(names: Iterable[str], field: str) -> list[str]:
    names = list(names)
    if len(names) > MAX_TAGS:
        raise TaggingError(field, f"at most {MAX_TAGS} tags at once (got {len(names)})")
    for i, name in enumerate(names):
        try:
            check_tag(name)
        except ValidationError as exc:
            raise TaggingError(f"{field}.{i}", exc.messages[0]) from exc
    return list(dict.fromkeys(names))


def matching(user, q: str, runs: QuerySet[Run] | None = None) -> QuerySet[Run]:
    """The user's runs that query `q` matches (a TaggingError pointing at a mistake in it)."""
    visible = Run.visible_to(user) if runs is None else runs
    try:
        return runquery.parse(q).apply(visible)
    except runquery.QuerySyntaxError as exc:
        raise TaggingError("q", exc.message, exc.position) from exc


def tag_runs(runs: QuerySet[Run], add: list[str], remove: list[str]) -> dict[str, int]:
    """Add and remove tags on every run of `runs` at once; how many runs, tags added and removed."""
    add, remove = tag_names(add, "add"), tag_names(remove, "remove")
    if not add and not remove:
        raise TaggingError("add", "name at least one tag to add or remove")
    ids = list(runs.order_by().values_list("pk", flat=True).distinct()[: MAX_TAGGED_RUNS + 1])
    if len(ids) > MAX_TAGGED_RUNS:
        raise TaggingError("runs", f"at most {MAX_TAGGED_RUNS} runs are tagged at once")
    with transaction.atomic():
        removed = RunTag.objects.filter(run_id__in=ids, name__in=remove).delete()[0] if remove else 0
        had = RunTag.objects.filter(run_id__in=ids, name__in=add).count()
        rows = [RunTag(run_id=i, name=name) for i in ids for name in add]
        RunTag.objects.bulk_create(rows, ignore_conflicts=True, batch_size=2000)
        added = RunTag.objects.filter(run_id__in=ids, name__in=add).count() - had
    return {"runs": len(ids), "added": added, "removed": removed}


def tag_experiment(experiment: Experiment, add: list[str], remove: list[str]) -> list[str]:
    add, remove = tag_names(add, "add"), tag_names(remove, "remove")
    with transaction.atomic():
        ExperimentTag.objects.filter(experiment=experiment, name__in=remove).delete()
        ExperimentTag.objects.bulk_create(
            [ExperimentTag(experiment=experiment, name=name) for name in add], ignore_conflicts=True
        )
    return list(experiment.tags.values_list("name", flat=True))


def add_note(user, text: str, run: Run | None = None, experiment: Experiment | None = None) -> Note:
    """A person's note on `run` or `experiment`, while it holds fewer than `LAB_MAX_NOTES`."""
    text = (text or "").strip()
    if not text or len(text) > MAX_NOTE or "\x00" in text:
        raise TaggingError("text", f"a note is 1 to {MAX_NOTE} characters of text, without NUL")
    on = run if run is not None else experiment
    with transaction.atomic():
        # Under the row's lock: notes added at once cannot count past the cap together.
        type(on).objects.select_for_update().filter(pk=on.pk).values_list("pk", flat=True).first()
        held = on.user_notes.count()
        if held >= settings.LAB_MAX_NOTES:
            raise TaggingError(
                "text",
                f"{on._meta.verbose_name} {on.pk} holds {held} notes, the most one may "
                f"(LAB_MAX_NOTES={settings.LAB_MAX_NOTES}): delete one before adding another",
            )
        return Note.objects.create(author=user, text=text, run=run, experiment=experiment)


def delete_note(user, note: Note) -> None:
    """Delete `note` if `user` wrote it or is an admin of its team (else `PermissionDenied`)."""
    if not note.deletable_by(user):
        raise PermissionDenied(f"only its author or an admin of team {note.team} can delete note {note.pk}")
    note.delete()


def save_view(user, team: Team, name: str, query: str) -> SavedView:
    """Save `query` (checked first) as the team's view `name`, replacing one of that name."""
    name = (name or "").strip()
    if not 1 <= len(name) <= 100 or "\x00" in name:
        raise TaggingError("name", "a view's name is 1 to 100 characters, without NUL")
    try:
        matching(user, query)  # a query that cannot run is not saved
    except TaggingError as exc:
        raise TaggingError("query", exc.message, exc.position) from exc
    if not team.memberships.filter(user=user).exists():
        raise TaggingError("team", "you can save views only in your own teams")
    try:
        view, _ = SavedView.objects.update_or_create(
            team=team, name=name, defaults={"query": query, "author": user}
        )
    except IntegrityError as exc:  # two saves of one name at once: the other won
        raise TaggingError("name", f"the view {name!r} was just saved by someone else") from exc
    return view
