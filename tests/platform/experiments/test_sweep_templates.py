"""Starting a sweep from another: "Clone this experiment" fills the form with its sweep, and "Save
as template" keeps it for the team, listed on the new-sweep page; another team's experiment or
template is a 404, and what the form cannot show is said, not dropped silently."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from support import TINY_CONFIG, new_team_member, queue_sweep

from experiments.models import Experiment, SweepTemplate

pytestmark = pytest.mark.django_db

STALENESS = [{}, {"sync_offset": 2}, {"sync_interval": 3}, {"offline": True}]


@pytest.fixture
def experiment(team, alice):
    config = {**TINY_CONFIG, "optimizer": {"lr": 1e-4}, "algorithm": {"params": {"eps_high": 0.4}}}
    return queue_sweep(
        team,
        alice,
        "original",
        description="why",
        config=config,
        presets=["grpo", "rec-oneside-nois"],
        staleness=STALENESS,
        seeds=[0, 2],
    )


def test_clone_fills_the_form_with_the_experiments_sweep(alice_client, experiment):
    response = alice_client.get(reverse("submit-sweep"), {"clone": experiment.pk})
    form = response.context["form"]
    initial = form.initial
    assert (initial["name"], initial["description"], initial["team"]) == (
        "original (copy)",
        "why",
        experiment.team_id,
    )
    assert initial["presets"] == ["grpo", "rec-oneside-nois"] and initial["seeds"] == "0, 2"
    assert (initial["on_policy"], initial["sync_offsets"], initial["sync_intervals"], initial["offline"]) == (
        True,
        "2",
        "3",
        True,
    )
    assert initial["optimizer.lr"] == 1e-4 and initial["algorithm.params.eps_high"] == 0.4
    assert initial["steps"] == TINY_CONFIG["steps"] and initial["model.tiny.hidden_size"] == 32
    assert f"Filled in from experiment #{experiment.pk} original" in response.content.decode()
    # Submitted as filled in, it queues the same grid.
    data = {name: value for name, value in initial.items() if value is not None}
    data["presets"] = initial["presets"]
    data["on_policy"] = data["offline"] = "on"
    response = alice_client.post(reverse("submit-sweep"), data)
    assert response.status_code == 302, response.context["form"].errors
    clone = Experiment.objects.exclude(pk=experiment.pk).get()

    def key(setting):
        return sorted(setting.items())

    assert sorted(clone.spec["staleness"], key=key) == sorted(experiment.spec["staleness"], key=key)
    assert clone.runs.count() == 16 and clone.spec["config"] == experiment.spec["config"]


def test_a_setting_the_form_cannot_show_is_said(alice_client, team, alice):
    combined = queue_sweep(team, alice, "combined", staleness=[{"sync_interval": 2, "sync_offset": 1}])
    html = alice_client.get(reverse("submit-sweep"), {"clone": combined.pk}).content.decode()
    assert "combines fields the form sets apart; submit it through the API" in html


def test_save_as_template_keeps_the_sweep_for_the_team(alice_client, experiment, team):
    url = reverse("experiment-save-template", args=[experiment.pk])
    response = alice_client.post(url, {"name": "my grid"}, follow=True)
    assert "Saved as the template &#x27;my grid&#x27; of team-a" in response.content.decode()
    template = SweepTemplate.objects.get()
    assert (template.team, template.spec) == (team, experiment.spec)
    again = alice_client.post(url, {"name": "my grid"}, follow=True)
    assert "has a template called &#x27;my grid&#x27; already" in again.content.decode()
    page = alice_client.get(reverse("submit-sweep")).content.decode()
    assert f'href="?saved={template.pk}">my grid</a>' in page
    filled = alice_client.get(reverse("submit-sweep"), {"saved": template.pk}).context["form"].initial
    assert filled["name"] == "my grid" and filled["sync_offsets"] == "2"


def test_another_teams_experiment_and_template_are_404(experiment, django_user_model):
    bob = new_team_member("bob", "team-b", is_admin=False)
    template = SweepTemplate.objects.create(team=experiment.team, name="theirs", spec=experiment.spec)
    client = Client()
    client.force_login(bob)
    assert client.get(reverse("submit-sweep"), {"clone": experiment.pk}).status_code == 404
    assert client.get(reverse("submit-sweep"), {"saved": template.pk}).status_code == 404
    assert (
        client.post(reverse("experiment-save-template", args=[experiment.pk]), {"name": "x"}).status_code
        == 404
    )
    assert "theirs" not in client.get(reverse("submit-sweep")).content.decode()
    for param in ("clone", "saved"):  # ids past any database integer: a blank form, never a 500
        assert client.get(reverse("submit-sweep"), {param: "9" * 40}).status_code == 200
