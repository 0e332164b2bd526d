"""Migrations that move models between apps change Django's state only (no SQL at all):
`makemigrations --check` finds nothing to do, and `migrate` works from an empty database and from one at the last
migration before the move (0010) holding data, on SQLite and (when `DATABASE_URL` names one) on
PostgreSQL, with every row, relation and content type intact. Each case runs in a subprocess on a
database of its own, never the test database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
from support import REPO

from lab.moves import MOVED_FROM_EXPERIMENTS

BEFORE_THE_MOVE = ("experiments", "0010_checkpoints_notes_job_losses_token_names_templates")
MOVED = MOVED_FROM_EXPERIMENTS

# Runs in a fresh process: migrate to 0010, fill it through the models as they were then (the
# migration state's historical models, not today's code), migrate to the end, read it back
# through today's models, and print what it found as JSON.
SCENARIO = f"""
import hashlib, json, os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")
django.setup()
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

before = {BEFORE_THE_MOVE!r}
call_command("migrate", *before, verbosity=0)
old = MigrationExecutor(connection).loader.project_state(before).apps
model = lambda name: old.get_model("experiments", name)
now = timezone.now()
User = old.get_model("auth", "User")
alice, bob = User.objects.create(username="alice"), User.objects.create(username="bob")
team = model("Team").objects.create(name="red", last_claimed=now)
model("Membership").objects.create(team=team, user=alice, is_admin=True)
model("Invitation").objects.create(team=team, user=bob, invited_by=alice)
digest = hashlib.sha256(b"the-token").hexdigest()
model("ApiToken").objects.create(user=alice, digest=digest, name="laptop")
model("Worker").objects.create(identity="host:1", queues=["cpu", "rollout"], last_seen=now)
experiment = model("Experiment").objects.create(team=team, owner=alice, name="sweep", spec={{"seeds": [0]}})
run = model("Run").objects.create(
    experiment=experiment, config={{"steps": 3}}, preset="grpo", staleness="on-policy", seed=0
)
model("MetricPoint").objects.create(run=run, name="reward/mean", step=1, value=0.5, wall_time=now)
model("SweepTemplate").objects.create(team=team, name="base", spec={{"presets": ["grpo"]}})
ContentType = old.get_model("contenttypes", "ContentType")
types = {{ct.model: ct.pk for ct in ContentType.objects.filter(app_label="experiments")}}

call_command("migrate", verbosity=0)

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from accounts.models import ApiToken, Invitation, Membership, Team
from execution.models import Worker
from experiments import series
from experiments.models import Experiment, Run, SweepTemplate

team = Team.objects.get(name="red")
run = Run.objects.select_related("experiment__team").get()
print(json.dumps({{
    "members": [(m.user.username, m.is_admin) for m in Membership.objects.filter(team=team)],
    "team_members": sorted(team.members.values_list("username", flat=True)),
    "invited": [(i.user.username, i.invited_by.username) for i in Invitation.objects.filter(team=team)],
    "token_user": ApiToken.user_for("the-token").username,
    "worker": list(Worker.objects.values_list("identity", "queues")),
    "run_team": run.experiment.team.name,
    "experiments": list(Experiment.objects.filter(team=team).values_list("name", flat=True)),
    "points": [(n, s, v) for n, (steps, values, _) in series.points_of(run.pk) for s, v in zip(steps.tolist(), values.tolist())],
    "templates": list(SweepTemplate.objects.filter(team=team).values_list("name", flat=True)),
    "types_before": types,
    "types_after": {{ct.model: [ct.app_label, ct.pk] for ct in ContentType.objects.filter(model__in={list(MOVED)!r})}},
    "permissions": sorted(
        p.codename for p in Permission.objects.filter(content_type__app_label__in=["accounts", "execution"])
    ),
    "left_in_experiments": sorted(
        ContentType.objects.filter(app_label="experiments", model__in={list(MOVED)!r}).values_list("model", flat=True)
    ),
}}))
"""

EMPTY = """
import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
call_command("makemigrations", "--check", "--dry-run", verbosity=0)
import io
for app, name in (("accounts", "0001"), ("execution", "0001"), ("experiments", "0011")):
    out = io.StringIO()
    call_command("sqlmigrate", app, name, stdout=out)
    sql = [line for line in out.getvalue().splitlines() if line.strip() and not line.startswith("--")]
    assert set(sql) <= {"BEGIN;", "COMMIT;"}, (app, name, sql)  # the moves change no table
from accounts.models import Team
from execution.models import Worker
from experiments.models import Run
print(Team.objects.count(), Worker.objects.count(), Run.objects.count())
"""


def python(script: str, tmp_path, database_url: str = "") -> str:
    env = {**os.environ, "LAB_VAR_DIR": str(tmp_path / "var"), "LAB_TORCH_THREADS": "1"}
    env.pop("DATABASE_URL", None)
    if database_url:
        env["DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO / "platform",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """'' (a SQLite file under the case's own LAB_VAR_DIR) or a PostgreSQL database of the case's
    own on the server `DATABASE_URL` names, dropped afterwards."""
    if request.param == "sqlite":
        yield ""
        return
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        pytest.skip("DATABASE_URL names no PostgreSQL server")
    import psycopg

    name = f"lab_migrations_{uuid.uuid4().hex[:12]}"
    server = urlsplit(url)
    admin = urlunsplit(server._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(server._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_from_an_empty_database(database_url, tmp_path):
    assert python(EMPTY, tmp_path, database_url) == "0 0 0"


def test_migrate_from_the_last_migration_before_the_move_keeps_the_data(database_url, tmp_path):
    found = json.loads(python(SCENARIO, tmp_path, database_url))
    assert found["members"] == [["alice", True]] and found["team_members"] == ["alice"]
    assert found["invited"] == [["bob", "alice"]]
    assert found["token_user"] == "alice"
    assert found["worker"] == [["host:1", ["cpu", "rollout"]]]
    assert found["run_team"] == "red" and found["experiments"] == ["sweep"]
    assert found["points"] == [["reward/mean", 1, 0.5]] and found["templates"] == ["base"]
    # Each moved model's content type is the same row, relabelled: its permissions come along.
    assert found["types_after"] == {
        model: [app, found["types_before"][model]] for model, app in MOVED.items()
    }
    assert found["left_in_experiments"] == []
    assert {f"{verb}_{model}" for model in MOVED for verb in ("add", "change", "delete", "view")} <= set(
        found["permissions"]
    )


BEFORE_CHUNKS = ("experiments", "0017_run_archived")

# Migrate to 0017, log points the old way (a row each: NaN and infinity were stored as null),
# migrate to the end (the points move into chunks and summaries), read them back through today's
# code, migrate back to 0017 and read the rows again.
CHUNKS_SCENARIO = f"""
import json, os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")
django.setup()
from datetime import datetime, timedelta, timezone
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

before = {BEFORE_CHUNKS!r}
call_command("migrate", *before, verbosity=0)
old = MigrationExecutor(connection).loader.project_state(before).apps
model = lambda app, name: old.get_model(app, name)
start = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=timezone.utc)
alice = model("auth", "User").objects.create(username="alice")
team = model("accounts", "Team").objects.create(name="red")
experiment = model("experiments", "Experiment").objects.create(team=team, owner=alice, name="sweep", spec={{}})
runs = [
    model("experiments", "Run").objects.create(
        experiment=experiment, config={{"steps": 3000}}, preset="grpo", staleness="on-policy", seed=seed
    )
    for seed in (0, 1)
]
Point = model("experiments", "MetricPoint")
long_name = "m" * 100
rows = [
    Point(run=runs[0], name="loss", step=step, value=1.0 / step, wall_time=start + timedelta(microseconds=step))
    for step in range(1, 2600)
] + [
    Point(run=runs[0], name="loss", step=3000, value=None, wall_time=start),
    Point(run=runs[1], name=long_name, step=-5, value=-2.5, wall_time=start),
    Point(run=runs[1], name=long_name, step=2**30, value=None, wall_time=start),
    Point(run=runs[1], name="eval/accuracy", step=0, value=0.25, wall_time=start),
]
Point.objects.bulk_create(rows)
def points():
    return sorted(
        [r.run_id, r.name, r.step, r.value, r.wall_time.isoformat()]
        for r in model("experiments", "MetricPoint").objects.all()
    )
logged = points()

call_command("migrate", verbosity=0)
from experiments import packing, series
from experiments.models import MetricChunk, MetricSummary
moved = sorted(
    [run.pk, name, step, series.shown(value), packing.wall_time(us).isoformat()]
    for run in runs
    for name, (steps, values, times) in series.points_of(run.pk)
    for step, value, us in zip(steps.tolist(), values.tolist(), times.tolist())
)
summaries = {{
    f"{{s.run_id}}:{{s.name}}": [s.count, s.last_step, s.last, s.finite, s.min, s.max, s.mean_last(3)]
    for s in MetricSummary.objects.all()
}}
chunks = MetricChunk.objects.filter(run_id=runs[0].pk, name="loss").count()
call_command("migrate", *before, verbosity=0)
old = MigrationExecutor(connection).loader.project_state(before).apps
print(json.dumps({{
    "logged": logged, "moved": moved, "back": points(), "summaries": summaries, "chunks": chunks,
    "runs": [run.pk for run in runs],
}}))
"""


def test_migrating_points_into_chunks_keeps_every_point_and_back(database_url, tmp_path):
    found = json.loads(python(CHUNKS_SCENARIO, tmp_path, database_url))
    assert len(found["logged"]) == 2603
    assert found["moved"] == found["logged"], "every point, value and wall time (µs) as it was"
    assert found["back"] == found["logged"], "and back again"
    assert found["chunks"] == 3  # steps 1–1023, 1024–2047, 2048–2599 and 3000
    first, second = found["runs"]
    last_three = pytest.approx((1 / 2597 + 1 / 2598 + 1 / 2599) / 3, rel=1e-12)
    assert found["summaries"] == {
        f"{first}:loss": [2600, 3000, None, 2599, 1.0 / 2599, 1.0, last_three],
        f"{second}:{'m' * 100}": [2, 2**30, None, 1, -2.5, -2.5, -2.5],
        f"{second}:eval/accuracy": [1, 0, 0.25, 1, 0.25, 0.25, 0.25],
    }


BEFORE_PINS = ("experiments", "0019_summary_tail_binary")

# Migrate to 0019, store runs with provenance records as they were then (one per run, no history),
# migrate to the end and read the history and the experiment's dataset pins through today's models.
PINS_SCENARIO = f"""
import json, os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")
django.setup()
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

before = {BEFORE_PINS!r}
call_command("migrate", *before, verbosity=0)
old = MigrationExecutor(connection).loader.project_state(before).apps
model = lambda app, name: old.get_model(app, name)
alice = model("auth", "User").objects.create(username="alice")
team = model("accounts", "Team").objects.create(name="red")
Experiment, Run = model("experiments", "Experiment"), model("experiments", "Run")
jsonl = Experiment.objects.create(team=team, owner=alice, name="jsonl", spec={{}}, theta0_sha256="t" * 64)
arithmetic = Experiment.objects.create(team=team, owner=alice, name="arithmetic", spec={{}})
task = {{"name": "jsonl", "path": "/data/train.jsonl", "eval_path": "/data/eval.jsonl"}}
record = {{"theta0_sha256": "t" * 64, "dataset_sha256": "1" * 64, "eval_dataset_sha256": "2" * 64}}
runs = [
    Run.objects.create(experiment=jsonl, config={{"task": task}}, preset="grpo", staleness="on-policy", seed=0, provenance=record),
    # A later run that read an edited training file (what the pin now refuses): the first run's hash is pinned.
    Run.objects.create(experiment=jsonl, config={{"task": task}}, preset="grpo", staleness="on-policy", seed=1,
                       provenance={{**record, "dataset_sha256": "3" * 64}}),
    Run.objects.create(experiment=jsonl, config={{"task": task}}, preset="grpo", staleness="on-policy", seed=2),
    Run.objects.create(experiment=arithmetic, config={{}}, preset="grpo", staleness="on-policy", seed=0,
                       provenance={{"theta0_sha256": "u" * 64}}),
]
call_command("migrate", verbosity=0)
from experiments.models import Experiment, Run
print(json.dumps({{
    "history": [Run.objects.get(pk=run.pk).provenance_history for run in runs],
    "provenance": [Run.objects.get(pk=run.pk).provenance for run in runs],
    "pins": [Experiment.objects.get(pk=e.pk).dataset_hashes for e in (jsonl, arithmetic)],
}}))
"""


def test_migrating_to_dataset_pins_carries_each_run_s_provenance_and_pins_its_experiment(
    database_url, tmp_path
):
    found = json.loads(python(PINS_SCENARIO, tmp_path, database_url))
    record = {"theta0_sha256": "t" * 64, "dataset_sha256": "1" * 64, "eval_dataset_sha256": "2" * 64}
    edited = {**record, "dataset_sha256": "3" * 64}
    arithmetic = {"theta0_sha256": "u" * 64}
    assert found["provenance"] == [record, edited, {}, arithmetic], "the records themselves are kept"
    assert found["history"] == [
        [{"attempt": None, "provenance": record}],
        [{"attempt": None, "provenance": edited}],
        [],
        [{"attempt": None, "provenance": arithmetic}],
    ]
    assert found["pins"] == [{"/data/train.jsonl": "1" * 64, "/data/eval.jsonl": "2" * 64}, {}]
