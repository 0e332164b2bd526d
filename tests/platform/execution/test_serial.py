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


@pytest.mark.django_db(transaction=True)
def test_with_two_workers_a_serial_runs_interval_overlaps_no_other_run(
    start_worker, client, alice, team, bob_team
):
    bob = bob_team.members.get()
    # B's runs are long enough that two of them, once the serial ones are done, overlap.
    submit(client, bob, "team-b", 2, steps=40)
    serial = submit(client, alice, "team-a", 2, serial=True)
    submit(client, bob, "team-b", 2, steps=40)
    start_worker()
    start_worker()
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
    # Unmeasured runs may share the pool: with two workers, two of B's ran at once at some point.
    overlaps = [
        (a.pk, b.pk)
        for a in others
        for b in others
        if a.pk < b.pk and a.started < b.finished and b.started < a.finished
    ]
    assert overlaps, "the two workers never ran two of team B's runs at once: the test shows nothing"
