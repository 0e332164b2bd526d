"""The link beside a claim that more seeds would settle: it adds the seeds missing to the
experiment, after its confirmation page (in a real Chromium)."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from accounts.models import ApiToken
from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def post(client, token, path, body):
    return client.post(
        f"/api{path}", json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def test_a_claim_more_seeds_would_settle_offers_to_add_them(page, live_server, client, alice, demo):
    """grpo ahead of rec-oneside-nois offline: 0.01 apart, σ_d 0.02 over 3 seed pairs; the claim
    says how many seeds per cell would settle it, and the link adds the ones missing."""
    body = {
        "experiment": demo.pk,
        "parts": [{"kind": "beats", "x": "grpo", "y": "rec-oneside-nois"}],
        "settings": ["offline"],
    }
    claim = post(client, ApiToken.issue(alice), "/claims", body).json()
    (part,) = claim["by_setting"][0]["parts"]
    assert part["n"] == 3 and part["seeds_needed"] > 3, part
    page.goto(live_server.url + reverse("experiment-compare", args=[demo.pk]) + "?metric=eval/accuracy")
    page.wait_for_selector("#claims .add-seeds")
    more = part["seeds_needed"] - 3
    assert page.get_attribute("#claims .add-seeds", "href") == f"/experiments/{demo.pk}/seeds/?n={more}"
    assert page.text_content("#claims .add-seeds") == f"Add {more} seeds…"
    page.click("#claims .add-seeds")
    page.wait_for_selector("#seeds-summary")
    added = ", ".join(str(seed) for seed in range(3, 3 + more))
    assert (
        page.text_content("#seeds-summary")
        == f"Seed{'s' if more > 1 else ''} {added}: {12 * more} runs to queue."
    )
    assert Run.objects.filter(experiment=demo).count() == 36, "only asked"
