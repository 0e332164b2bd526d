"""People's notes have a cap and can be deleted: a run or an experiment holds at most
`LAB_MAX_NOTES` of them (one more is refused with 422 naming the rule, even when added at once),
its author or an admin of its team deletes one (through the API or a button on the page), and
the notes workers leave on a run are never refused."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections
from django.test import override_settings
from django.urls import reverse
from support import new_team_member

from accounts.models import ApiToken, Membership
from experiments import tagging
from experiments.models import Note, Run

CAP = 3


def bearer(user) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(user)}", "content_type": "application/json"}


def add_note(client, headers, path: str, text: str):
    return client.post(path, json.dumps({"text": text}), **headers)


@pytest.fixture
def carol(team):
    """A member of alice's team who is not one of its admins."""
    user = new_team_member("carol", "carol's own team")
    Membership.objects.create(team=team, user=user, is_admin=False)
    return user


@override_settings(LAB_MAX_NOTES=CAP)
def test_a_run_and_an_experiment_hold_at_most_the_cap_and_a_deleted_note_makes_room(client, run, alice):
    headers = bearer(alice)
    for path in (f"/api/runs/{run.pk}/notes", f"/api/experiments/{run.experiment_id}/notes"):
        added = [add_note(client, headers, path, f"note {i}") for i in range(CAP)]
        assert [r.status_code for r in added] == [201] * CAP
        refused = add_note(client, headers, path, "one too many")
        assert refused.status_code == 422
        [error] = refused.json()["detail"]
        assert error["field"] == "text" and f"(LAB_MAX_NOTES={CAP})" in error["msg"], error
        assert f"holds {CAP} notes" in error["msg"] and "delete one before adding another" in error["msg"]

        first = added[0].json()["id"]
        deleted = client.delete(f"/api/notes/{first}", **headers)
        assert (deleted.status_code, deleted.json()) == (200, {"note": first})
        assert client.delete(f"/api/notes/{first}", **headers).status_code == 404
        assert add_note(client, headers, path, "room again").status_code == 201
    assert (
        Note.objects.filter(run=run).count() == Note.objects.filter(experiment=run.experiment).count() == CAP
    )
    # The existing bodies are unchanged: a note is still {id, author, text, created}.
    assert set(added[1].json()) == {"id", "author", "text", "created"}


@pytest.mark.django_db(transaction=True)
@override_settings(LAB_MAX_NOTES=CAP)
def test_the_cap_holds_for_notes_added_at_once(run, alice):
    results: list[str] = []
    together = threading.Barrier(10)

    def add(i: int) -> None:
        together.wait()
        try:
            tagging.add_note(alice, f"at once {i}", run=Run.objects.get(pk=run.pk))
            results.append("added")
        except tagging.TaggingError as exc:
            results.append(exc.message)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=add, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count("added") == CAP and len(results) == 10
    assert Note.objects.filter(run=run).count() == CAP


@override_settings(LAB_MAX_NOTES=CAP)
def test_the_notes_workers_leave_on_a_run_are_never_refused(run, alice):
    for i in range(CAP):
        tagging.add_note(alice, f"person {i}", run=run)
    assert run.claim("w:1", run.attempt)
    for i in range(CAP + 2):
        assert run.add_note("w:1", f"worker note {i}")
    run.refresh_from_db()
    assert [note["text"] for note in run.notes] == [f"worker note {i}" for i in range(CAP + 2)]
    assert Note.objects.filter(run=run).count() == CAP


def test_only_its_author_or_an_admin_of_its_team_deletes_a_note(client, run, alice, carol):
    alices = tagging.add_note(alice, "alice's", run=run)
    carols = tagging.add_note(carol, "carol's", experiment=run.experiment)
    bob = new_team_member("bob", "team-b")

    refused = client.delete(f"/api/notes/{alices.pk}", **bearer(carol))
    assert (
        refused.status_code == 403
        and "only its author or an admin of team team-a" in refused.json()["detail"]
    )
    assert client.delete(f"/api/notes/{alices.pk}", **bearer(bob)).status_code == 404, "another team's"
    assert client.delete(f"/api/notes/{carols.pk}", **bearer(bob)).status_code == 404
    assert Note.objects.count() == 2

    assert client.delete(f"/api/notes/{carols.pk}", **bearer(alice)).status_code == 200, "a team admin"
    assert client.delete(f"/api/notes/{alices.pk}", **bearer(alice)).status_code == 200, "its author"
    assert not Note.objects.exists()
    mine = tagging.add_note(carol, "carol's again", run=run)
    assert client.delete(f"/api/notes/{mine.pk}", **bearer(carol)).json() == {"note": mine.pk}


@override_settings(LAB_MAX_NOTES=CAP)
def test_the_pages_show_delete_buttons_to_those_who_may_and_refuse_a_note_over_the_cap(
    client, run, alice, carol
):
    alices = tagging.add_note(alice, "alice's", run=run)
    carols = tagging.add_note(carol, "carol's", run=run)
    run_page = reverse("run-detail", args=[run.pk])

    client.force_login(carol)
    page = client.get(run_page).content.decode()
    assert (
        reverse("note-delete", args=[carols.pk]) in page
        and reverse("note-delete", args=[alices.pk]) not in page
    )
    assert "onsubmit" not in page and "onclick" not in page
    refused = client.post(reverse("note-delete", args=[alices.pk]), follow=True)
    assert "Not deleted: only its author or an admin of team team-a" in refused.content.decode()
    assert client.get(reverse("note-delete", args=[carols.pk])).status_code == 405, "a POST only"
    tagging.add_note(carol, "the third", run=run)
    over = client.post(
        reverse("run-notes", args=[run.pk]), {"text": "a fourth"}, follow=True
    ).content.decode()
    assert f"(LAB_MAX_NOTES={CAP}): delete one before adding another" in over
    assert Note.objects.filter(run=run).count() == CAP

    client.force_login(alice)  # the team's admin: a button on every note
    page = client.get(run_page).content.decode()
    assert page.count('class="note-delete"') == CAP
    done = client.post(reverse("note-delete", args=[carols.pk]), follow=True)
    assert done.redirect_chain[-1][0] == run_page and "Deleted carol&#x27;s note." in done.content.decode()
    experiments_note = tagging.add_note(alice, "on the experiment", experiment=run.experiment)
    done = client.post(reverse("note-delete", args=[experiments_note.pk]))
    assert done.url == reverse("experiment-detail", args=[run.experiment_id])
    assert list(Note.objects.values_list("text", flat=True)) == ["alice's", "the third"]


@pytest.mark.django_db(transaction=True)
def test_a_note_is_deleted_with_its_button_in_a_browser(page, live_server, run, alice):
    note = tagging.add_note(alice, "to be deleted", run=run)
    tagging.add_note(alice, "to be kept", run=run)
    page.goto(live_server.url + reverse("run-detail", args=[run.pk]))
    page.click(f"#note-{note.pk} .note-delete button")
    page.wait_for_selector("text=Deleted alice's note.")
    [kept] = page.locator("#note-list li").all_inner_texts()
    assert kept.startswith("alice, ") and "to be kept" in kept
    assert list(Note.objects.values_list("text", flat=True)) == ["to be kept"]
