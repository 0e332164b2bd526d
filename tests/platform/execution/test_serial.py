"""Fair measurement on request: a serial sweep's runs each start only when no other run is
running, nothing starts beside one, and the other teams' runs go on after: by the claim rule
alone, and with two training workers and two teams queued."""

from __future__ import annotations

import copy

import pytest
from support import TINY_CONFIG, new_team_member, wait_for

from accounts.models import ApiToken
from experiments.models import Experiment, Run


@pytest.fixture
def bob_team(db):
    return new_team_member("bob", "team-b").memberships.get().team


def submit(client, user, team: str, seeds: int, serial: bool = False, steps: int = 6) -> list[int]:
    body = {
        "name": f"{team} {'serial' if serial else 'sweep'}",
        "team": team,
        "config": {**copy.deepcopy(TINY_CONFIG), "steps": steps},
        "presets": ["grpo"],
        "seeds": list(range(seeds)),
        "serial": serial,
    }
    response = client.post(
        "/api/sweeps",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(user)}",
    )
    assert response.status_code == 201, response.content
    return response.json()["runs"]


@pytest.mark.django_db
def test_a_serial_run_waits_for_an_idle_pool_and_holds_everything_back_while_it_runs(
    client, alice, team, bob_team
):
    bob = bob_team.members.get()
    b_first = submit(client, bob, "team-b", 1)
    serial = submit(client, alice, "team-a", 2, serial=True)
    b_later = submit(client, bob, "team-b", 2)
    assert Experiment.objects.get(name="team-a serial").spec["serial"] is True
    assert set(Run.objects.filter(serial=True).values_list("pk", flat=True)) == set(serial)

    assert Run.claim_next("cpu", "w1:1").pk == b_first[0]
    # A's turn: its serial run waits for the pool to drain, and nothing else starts meanwhile.
    assert Run.claim_next("cpu", "w2:1") is None
    first = Run.objects.get(pk=b_first[0])
    assert first.finish(first.worker, {})
    measured = Run.claim_next("cpu", "w2:1")
    assert measured.pk == serial[0]
    assert Run.claim_next("cpu", "w1:1") is None, "nothing starts beside a run measured alone"
    assert measured.finish(measured.worker, {})
    # B's turn (A was served last), then A's next serial run waits for B's to end.
    other = Run.claim_next("cpu", "w1:1")
    assert other.pk == b_later[0]
    assert Run.claim_next("cpu", "w2:1") is None
    assert other.finish(other.worker, {})
    assert Run.claim_next("cpu", "w2:1").pk == serial[1]


@pytest.mark.django_db
def test_a_serial_run_next_on_another_queue_holds_this_queue_back(client, alice, team, bob_team):
    bob = bob_team.members.get()
    b_runs = submit(client, bob, "team-b", 3)
    assert Run.claim_next("cpu", "w1:1").pk == b_runs[0]
    serial = submit(client, alice, "team-a", 1, serial=True)
    Run.objects.filter(pk__in=serial).update(queue="gpu")
    # The serial run is next on the gpu queue and waits for the pool to drain: no cpu run starts.
    assert Run.claim_next("gpu", "g1:1") is None
    assert Run.claim_next("cpu", "w2:1") is None
    first = Run.objects.get(pk=b_runs[0])
    assert first.finish(first.worker, {})
    assert Run.claim_next("gpu", "g1:1").pk == serial[0]
    assert Run.claim_next("cpu", "w2:1") is None, "nothing starts beside it"
    measured = Run.objects.get(pk=serial[0])
    assert measured.finish(measured.worker, {})
    assert Run.claim_next("cpu", "w2:1").pk == b_runs[1]
    assert Run.claim_next("cpu", "w3:1").pk == b_runs[2], "with no serial run left, runs share the pool"


@pytest.mark.django_db(transaction=True)
def test_with_two_workers_a_serial_runs_interval_overlaps_no_other_run(
    start_worker, client, alice, team, bob_team
):
    bob = bob_team.members.get()
    # B's first two runs, long enough to run side by side on the two workers; then the serial sweep
    # and two more of B's.
    first = submit(client, bob, "team-b", 2, steps=150)
    start_worker()
    start_worker()
    wait_for(
        lambda: Run.objects.filter(pk__in=first, status=Run.RUNNING).count() == 2,
        300,
        "B's two runs to run at once",
    )
    serial = submit(client, alice, "team-a", 2, serial=True)
    submit(client, bob, "team-b", 2)
    wait_for(lambda: not Run.objects.filter(status__in=Run.ACTIVE).exists(), 600, "every run to end", 0.5)
    runs = list(Run.objects.all())
    assert all(run.status == Run.SUCCEEDED for run in runs), [(run.pk, run.error) for run in runs]
    others = [run for run in runs if run.pk not in serial]
    for run in (r for r in runs if r.pk in serial):
        for other in (r for r in runs if r.pk != run.pk):
            assert other.finished <= run.started or other.started >= run.finished, (
                f"run {other.pk} ran from {other.started} to {other.finished}, beside serial run {run.pk} "
                f"({run.started} to {run.finished})"
            )
    # Unmeasured runs share the pool: the two workers ran B's first two at once.
    a, b = (run for run in others if run.pk in first)
    assert a.started < b.finished and b.started < a.finished
