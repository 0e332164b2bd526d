"""The runs query language against runs whose answers are known: fields, config paths, tags (the
run's and its experiment's), summaries of a metric, precedence of and / or / not, parentheses, and
malformed queries with the position of the mistake; through the API too, and bad queries (Django
lookup names as keys, numbers past a float, deep nesting) as 422s on every surface that takes one."""

import json
from urllib.parse import quote

import pytest
from django.urls import reverse
from sample_experiments import make_finished_experiment

from experiments import runquery
from experiments.models import ExperimentTag, Run, RunTag, SavedView

# reinforce, grpo × on-policy, sync_offset=2 × seeds 0, 1; final eval/accuracy (step 20):
# 0.65 + 0.05 p − 0.1 s + 0.01 seed: reinforce 0.65 0.66 | 0.55 0.56; grpo 0.70 0.71 | 0.60 0.61.


@pytest.fixture
def runs(team, alice):
    experiment = make_finished_experiment(team, alice, name="grid", seeds=(0, 1))
    by_cell = {(r.preset, r.staleness, r.seed): r for r in experiment.runs.all()}
    RunTag.objects.create(run=by_cell[("grpo", "on-policy", 0)], name="baseline")
    RunTag.objects.create(run=by_cell[("reinforce", "sync_offset=2", 1)], name="odd")
    other = make_finished_experiment(
        team, alice, name="other", presets=("rec-oneside-nois",), staleness=({},), seeds=(0,)
    )
    ExperimentTag.objects.create(experiment=other, name="paper")
    by_cell[("rec-oneside-nois", "on-policy", 0)] = other.runs.get()
    return by_cell


def found(q, runs):
    ids = set(runquery.parse(q).apply(Run.objects.all()).values_list("pk", flat=True))
    return {cell for cell, run in runs.items() if run.pk in ids}


G, R, N = "grpo", "reinforce", "rec-oneside-nois"
ON, S2 = "on-policy", "sync_offset=2"
ALL_GRID = {(p, s, seed) for p in (R, G) for s in (ON, S2) for seed in (0, 1)}


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        ("", ALL_GRID | {(N, ON, 0)}),
        ("preset = grpo", {(G, s, seed) for s in (ON, S2) for seed in (0, 1)}),
        ("preset = grpo and seed = 1", {(G, ON, 1), (G, S2, 1)}),
        # and binds tighter than or
        (
            "preset = grpo and seed = 1 or preset = reinforce and staleness = 'sync_offset=2' and seed = 0",
            {(G, ON, 1), (G, S2, 1), (R, S2, 0)},
        ),
        (
            "seed = 1 or preset = grpo and staleness = 'on-policy'",
            {(p, s, 1) for p in (R, G) for s in (ON, S2)} | {(G, ON, 0)},
        ),
        ("(seed = 1 or preset = grpo) and staleness = 'on-policy'", {(R, ON, 1), (G, ON, 0), (G, ON, 1)}),
        ("not preset = grpo and experiment.name = grid", {(R, s, seed) for s in (ON, S2) for seed in (0, 1)}),
        ("NOT (preset = grpo OR staleness = 'on-policy')", {(R, S2, 0), (R, S2, 1)}),
        ("preset != grpo and seed >= 1", {(R, ON, 1), (R, S2, 1)}),
        ("preset ~ FORC", {(R, s, seed) for s in (ON, S2) for seed in (0, 1)}),
        ("preset !~ grpo and preset !~ nois", {(R, s, seed) for s in (ON, S2) for seed in (0, 1)}),
        ("last(eval/accuracy) > 0.655 and experiment.name = grid", {(R, ON, 1), (G, ON, 0), (G, ON, 1)}),
        (
            "last(eval/accuracy) >= 0.605 and last(eval/accuracy) < 0.705",
            {(R, ON, 0), (R, ON, 1), (G, ON, 0), (G, S2, 1), (N, ON, 0)},
        ),
        ("max(eval/accuracy) > 0.695", {(G, ON, 0), (G, ON, 1)}),
        ("min(eval/accuracy) < 0.25", set()),
        ("mean(kl/init) > 0.15", {(p, S2, seed) for p in (R, G) for seed in (0, 1)}),
        ("first(reward/mean) > 0.01", {(p, s, 1) for p in (R, G) for s in (ON, S2)}),
        ("last(no/such/metric) > 0", set()),
        ("algorithm.preset = reinforce", {(R, s, seed) for s in (ON, S2) for seed in (0, 1)}),
        ("staleness.sync_offset = 2", {(p, S2, seed) for p in (R, G) for seed in (0, 1)}),
        ("staleness.sync_offset > 1 and seed = 0", {(R, S2, 0), (G, S2, 0)}),
        ("staleness.offline = false and preset = rec-oneside-nois", {(N, ON, 0)}),
        ("tag = baseline", {(G, ON, 0)}),
        ("tag = paper", {(N, ON, 0)}),
        ("tag != baseline and tag != odd and tag != paper", ALL_GRID - {(G, ON, 0), (R, S2, 1)}),
        ("tag = baseline or tag = odd", {(G, ON, 0), (R, S2, 1)}),
        ("status = succeeded and seed < 1 and preset == grpo", {(G, ON, 0), (G, S2, 0)}),
        ("optimizer.lr > 0 and experiment.name = other", {(N, ON, 0)}),
        # as deep as parentheses and nots may nest
        (
            "(" * runquery.MAX_DEPTH + "preset = grpo and seed = 1" + ")" * runquery.MAX_DEPTH,
            {(G, ON, 1), (G, S2, 1)},
        ),
        (
            "not " * runquery.MAX_DEPTH + "preset = grpo and experiment.name = grid",
            {(G, s, seed) for s in (ON, S2) for seed in (0, 1)},
        ),
        (
            "algorithm.preset != 'grpo' and experiment.name = grid",
            {(R, s, seed) for s in (ON, S2) for seed in (0, 1)},
        ),
    ],
)
def test_queries_return_the_runs_they_must(runs, q, expected):
    assert found(q, runs) == expected


# What once gave a 500 or was applied as a Django lookup (issue 35 item 6): a lookup
# name as a config path's segment, a number that is not finite, nesting past MAX_DEPTH.
NOT_A_KEY = "is not a config key: a config path names keys only"
BAD_INPUT = [
    ("algorithm.preset.regex = 'x'", 17, f"'regex' {NOT_A_KEY}"),
    ("algorithm.preset.iregex != '.*'", 17, f"'iregex' {NOT_A_KEY}"),
    ("algorithm.preset.isnull = true", 17, f"'isnull' {NOT_A_KEY}"),
    ("algorithm.preset.in = grpo", 17, f"'in' {NOT_A_KEY}"),
    ("algorithm.preset.startswith != 'g'", 17, f"'startswith' {NOT_A_KEY}"),
    ("steps.gt = 1", 6, f"'gt' {NOT_A_KEY}"),
    ("seed.exact = 1", 5, f"'exact' {NOT_A_KEY}"),
    ("preset = grpo and algorithm.contains.preset = x", 28, f"'contains' {NOT_A_KEY}"),
    ("staleness.has_key = sync_offset", 10, f"'has_key' {NOT_A_KEY}"),
    ("seed = 1e400", 7, "a number is finite (got '1e400', too large)"),
    ("last(eval/accuracy) > -1e999", 22, "a number is finite"),
    ("(" * 320 + "seed = 1" + ")" * 320, runquery.MAX_DEPTH, "nest at most 32 deep"),
    ("not " * 40 + "seed = 1", 4 * runquery.MAX_DEPTH, "nest at most 32 deep"),
    ("(not " * 20 + "seed = 1" + ")" * 20, 5 * 16, "nest at most 32 deep"),
]


@pytest.mark.parametrize(
    ("q", "position", "words"),
    [
        ("preset =", 8, "ends too early"),
        ("preset grpo", 7, "expected an operator"),
        ("(preset = grpo", 14, "expected ')' to close the '(' at position 0"),
        ("preset = grpo)", 13, "closes nothing"),
        ("seed > abc", 7, "seed is a number"),
        ("seed ~ 1", 5, "seed is a number"),
        ("foo = 1", 0, "unknown field 'foo'"),
        ("algorithm..preset = x", 0, "unknown field"),
        ("last(eval/accuracy) > 'x'", 22, "is a number"),
        ("preset = 'grpo", 9, "never closed"),
        ("seed = 1 or", 11, "ends too early"),
        ("seed = 1 and and seed = 2", 13, "expected a field"),
        ("staleness = sync_offset=2", 23, "quote values"),
        ("status = done", 9, "status must be one of queued"),
        ("preset > a", 7, "preset is text"),
        ("tag > a", 6, "tag is compared with = or != only"),
        ("seed = 1 # comment", 9, "unexpected character '#'"),
        ("last(eval/accuracy > 1", 19, "expected ')'"),
        *BAD_INPUT,
    ],
)
def test_malformed_queries_point_at_the_mistake(q, position, words):
    with pytest.raises(runquery.QuerySyntaxError) as caught:
        runquery.parse(q)
    assert caught.value.position == position and words in caught.value.message, caught.value.message
    assert caught.value.message.startswith(f"at position {position}: ")


def test_the_api_filters_by_a_query_and_says_where_it_is_wrong(client, token, runs):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    page = client.get("/api/runs", {"q": "tag = baseline or last(eval/accuracy) < 0.555"}, **headers).json()
    assert {(r["preset"], r["staleness"], r["seed"]) for r in page["items"]} == {(G, ON, 0), (R, S2, 0)}
    assert next(r for r in page["items"] if r["preset"] == G)["tags"] == ["baseline"]
    bad = client.get("/api/runs", {"q": "seed > abc"}, **headers)
    assert bad.status_code == 422
    assert bad.json()["detail"] == [
        {
            "loc": ["query", "q"],
            "field": "q",
            "msg": "at position 7: seed is a number (got 'abc')",
            "position": 7,
        }
    ]


def test_another_teams_runs_are_never_matched(client, runs):
    from support import new_team_member

    from accounts.models import ApiToken

    bob = new_team_member("bob", "team-b")
    page = client.get(
        "/api/runs", {"q": "seed >= 0"}, HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(bob)}"
    ).json()
    assert page["count"] == 0


@pytest.mark.parametrize(("q", "position", "words"), BAD_INPUT)
def test_bad_queries_are_422s_with_their_position_wherever_a_query_is_taken(
    client, alice_client, token, team, q, position, words
):
    """GET /api/runs, tagging by query, saving a view; the Runs page, its tagging and its view save."""
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    message = f"at position {position}: "
    for answer, loc in [
        (client.get("/api/runs", {"q": q}, **headers), ["query", "q"]),
        (
            client.post(
                "/api/runs/tags",
                json.dumps({"q": q, "add": ["x"]}),
                content_type="application/json",
                **headers,
            ),
            ["body", "q"],
        ),
        (
            client.post(
                "/api/views",
                json.dumps({"name": "v", "query": q}),
                content_type="application/json",
                **headers,
            ),
            ["body", "query"],
        ),
    ]:
        assert answer.status_code == 422, answer.content
        (entry,) = answer.json()["detail"]
        assert (entry["loc"], entry["field"], entry["position"]) == (loc, loc[-1], position)
        assert entry["msg"].startswith(message) and words in entry["msg"], entry["msg"]

    page = alice_client.get(reverse("run-list"), {"q": q})
    assert page.status_code == 200 and page.context["query_mistake"]["position"] == position
    assert words in page.context["query_mistake"]["message"]
    saved = alice_client.post(reverse("view-save"), {"q": q, "name": "v", "team": team.pk}, follow=True)
    assert [str(m) for m in saved.context["messages"]][0].startswith(f"query: {message}")
    tagged = alice_client.post(
        reverse("runs-tag"), {"which": "matching", "filters": f"q={quote(q)}", "add": "x"}, follow=True
    )
    assert "The filters have a mistake" in [str(m) for m in tagged.context["messages"]][0]
    assert not SavedView.objects.exists() and not RunTag.objects.exists()
