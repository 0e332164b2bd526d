"""Invalid sweeps, through the form and the API: field errors or 422, no run, nothing queued.

The checks are RunConfig's (the form and the API carry no bounds of their own); a valid
submission is the control that shows the queue count would notice a message.
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from support import TEST_VAR, TINY_CONFIG, purge_queue, queued_messages, sweep_form

from accounts.models import ApiToken
from experiments.models import Experiment, Run
from rlcore.config import RunConfig

pytestmark = pytest.mark.django_db(transaction=True)


def form_data(team, **changes) -> dict:
    data = sweep_form(
        team,
        "bad sweep",
        fields={
            "task.name": "arithmetic",
            "rollout.group_size": "4",
            "optimizer.lr": "3e-5",
            "steps": "6",
        },
    )
    data.update(changes)
    return data


INVALID_FORMS = {
    "unknown preset": (
        {"presets": ["no-such-preset"]},
        "presets",
        "no-such-preset is not one of the available",
    ),
    "group size 1": ({"rollout.group_size": "1"}, "rollout.group_size", "greater than or equal to 2"),
    "negative lr": ({"optimizer.lr": "-0.001"}, "optimizer.lr", "greater than 0"),
    "steps over the limit": ({"steps": "100001"}, "steps", "less than or equal to 100000"),
    "dataset outside the roots": (
        {"task.name": "jsonl", "task.path": "/etc/passwd"},
        "task.path",
        "outside the allowed roots",
    ),
    "not a number": (
        {"rollout.group_size": "eight"},
        "rollout.group_size",
        "“eight” is not a whole number; leave it blank for the default, 8",
    ),
    # What a number box dropped silently (it submitted a blank, i.e. the default): refused, named.
    "letters for the steps": (
        {"steps": "sixty"},
        "steps",
        "“sixty” is not a whole number; leave it blank for the default, 150",
    ),
    "letters for the lr": (
        {"optimizer.lr": "fast"},
        "optimizer.lr",
        "“fast” is not a number; leave it blank for the default, 3e-05",
    ),
    "letters for a knob": (
        {"algorithm.params.eps_low": "wide"},
        "algorithm.params.eps_low",
        "“wide” is not a number; leave it blank for the preset's value",
    ),
    # A field's own rule comes first: no sync_offset error for a steps value that is itself invalid.
    "negative steps": ({"steps": "-5", "sync_offsets": "8"}, "steps", "greater than or equal to 1"),
    "async with staleness settings": (
        {"execution.mode": "async", "sync_offsets": "2"},
        "execution.mode",
        "keep only on-policy and set that bound",
    ),
    "bad seed list": ({"seeds": "0, x"}, "seeds", "whole numbers separated by commas"),
    "empty grid": ({"on_policy": ""}, "on_policy", "choose at least one value for staleness"),
    "sync interval 0": ({"sync_intervals": "0"}, "sync_intervals", "greater than or equal to 1"),
    "max_staleness without async": (
        {"execution.mode": "distributed", "execution.max_staleness": "2"},
        "execution.max_staleness",
        "only (mode is",
    ),
    "too many rollout workers": (
        {"execution.mode": "distributed", "execution.rollout_workers": "17"},
        "execution.rollout_workers",
        "less than or equal to 16",
    ),
    "rollout-gpu on a cpu device": (
        {"execution.mode": "distributed", "rollout.engine": "vllm", "device": "cpu"},
        "device",
        "the rollout-gpu queue",
    ),
    "repeated preset": ({"presets": ["grpo", "reinforce", "grpo"]}, "presets", "grpo is listed twice"),
    "repeated seeds": ({"seeds": "0, 1, 0, 1"}, "seeds", "0, 1 are listed twice"),
    "repeated sync interval": (
        {"sync_intervals": "2, 2"},
        "sync_intervals",
        "sync_interval=2 is listed twice",
    ),
    "repeated sync offset": ({"sync_offsets": "2 3 2"}, "sync_offsets", "sync_offset=2 is listed twice"),
    "sync offset 0 is on-policy again": (
        {"sync_offsets": "0"},
        "sync_offsets",
        "sync_offset=0 is the same setting as on-policy",
    ),
    "sync offset as long as the run": (
        {"sync_offsets": "6"},
        "sync_offsets",
        "sync_offset 6 with 6 steps would make an offline run",
    ),
    "sync interval as long as the run": (
        {"sync_intervals": "6"},
        "sync_intervals",
        "sync_interval 6 with 6 steps would make an offline run",
    ),
    "knob the preset does not read": (
        {"presets": ["grpo", "opmd"], "algorithm.params.eps_high": "0.4"},
        "algorithm.params.eps_high",
        "eps_high is not a knob of opmd: its loss does not read it",
    ),
    "knob out of range": (
        {"algorithm.params.eps_low": "1.5"},
        "algorithm.params.eps_low",
        "eps_low must satisfy",
    ),
    "format spec in the prompt template": (
        {
            "task.name": "jsonl",
            "task.path": str(TEST_VAR / "data" / "train.jsonl"),
            "task.prompt_template": "{question}{question:>1000000000}",
        },
        "task.prompt_template",
        "has a format spec",
    ),
    "responses per step over the budget": (
        {"rollout.prompts_per_step": "4096"},
        "rollout.prompts_per_step",
        "(4096 × 4 = 16,384 responses per step) must be",
    ),
    "batches generated ahead over the budget": (
        {
            "on_policy": "",
            "sync_offsets": "40",
            "steps": "100",
            "rollout.prompts_per_step": "64",
            "rollout.group_size": "16",
            "rollout.max_new_tokens": "1024",
        },
        "sync_offsets",
        "(40 × 1,048,576 = 41,943,040 tokens of batches generated ahead) must be",
    ),
}


@pytest.fixture(autouse=True)
def empty_queue():
    purge_queue()


@pytest.mark.parametrize("case", INVALID_FORMS, ids=list(INVALID_FORMS))
def test_invalid_form_shows_the_field_error_and_creates_nothing(alice_client, team, case):
    changes, field, message = INVALID_FORMS[case]
    response = alice_client.post(reverse("submit-sweep"), form_data(team, **changes))
    assert response.status_code == 422
    errors = response.context["form"].errors
    assert field in errors, errors
    assert any(message in e for e in errors[field]), errors[field]
    assert escape(message) in response.content.decode() or message in response.content.decode()
    assert Experiment.objects.count() == 0 and Run.objects.count() == 0
    assert queued_messages() == 0


def test_preview_counts_the_grid_and_creates_nothing(alice_client, team):
    data = form_data(team, presets=["grpo", "reinforce"], sync_offsets="2, 4", seeds="0 1", preview="1")
    response = alice_client.post(reverse("submit-sweep"), data)
    assert response.status_code == 200
    assert "This sweep makes 12 runs × 6 steps, lr 3e-05." in response.content.decode()
    defaults = alice_client.post(reverse("submit-sweep"), {**data, "steps": "", "optimizer.lr": ""})
    assert "This sweep makes 12 runs × 150 steps (default), lr 3e-05 (default)." in defaults.content.decode()
    assert Run.objects.count() == 0 and queued_messages() == 0


def test_valid_form_creates_and_enqueues_every_run(alice_client, team):
    data = form_data(team, presets=["grpo", "reinforce"], sync_offsets="2", offline="on")
    response = alice_client.post(reverse("submit-sweep"), data)
    experiment = Experiment.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "experiment-detail", args=[experiment.pk]
    )
    runs = experiment.runs.all()
    assert sorted((r.preset, r.staleness) for r in runs) == sorted(
        (p, s) for p in ("grpo", "reinforce") for s in ("on-policy", "sync_offset=2", "offline")
    )
    assert all(r.status == Run.QUEUED and r.config["rollout"]["group_size"] == 4 for r in runs)
    assert queued_messages() == 6


def test_sync_offset_one_short_of_offline_is_accepted(alice_client, team):
    # k + d = 1 + 4 < 6 steps: step 6 trains on version 1, so the run is not offline.
    response = alice_client.post(reverse("submit-sweep"), form_data(team, on_policy="", sync_offsets="4"))
    assert response.status_code == 302
    assert Run.objects.get().staleness == "sync_offset=4"


def test_a_knob_override_is_stored_resolved_in_every_run_that_reads_it(alice_client, team):
    presets = ["rec-oneside-nois", "rec-oneside-nois-wide"]
    for eps_high in ("0.28", "0.5"):
        data = form_data(
            team, presets=presets, name=f"eps_high {eps_high}", **{"algorithm.params.eps_high": eps_high}
        )
        assert alice_client.post(reverse("submit-sweep"), data).status_code == 302
    params = {
        (run.experiment.name, run.preset): run.config["algorithm"]["params"]
        for run in Run.objects.select_related("experiment")
    }
    assert {key: (p["eps_low"], p["eps_high"]) for key, p in params.items()} == {
        ("eps_high 0.28", "rec-oneside-nois"): (0.2, 0.28),
        ("eps_high 0.28", "rec-oneside-nois-wide"): (0.6, 0.28),
        ("eps_high 0.5", "rec-oneside-nois"): (0.2, 0.5),
        ("eps_high 0.5", "rec-oneside-nois-wide"): (0.6, 0.5),
    }
    assert all(p["reg_coef"] == 0.0 and p["loss_agg"] == "token-mean" for p in params.values())
    assert queued_messages() == 4


def test_the_error_summary_lists_every_error_with_a_link_to_its_field(alice_client, team):
    data = form_data(team, **{"rollout.group_size": "1", "sync_offsets": "2 2"})
    response = alice_client.post(reverse("submit-sweep"), data)
    html = response.content.decode()
    summary = html[html.index('id="error-summary"') : html.index("</div>", html.index('id="error-summary"'))]
    assert summary.count("<li>") == 2
    assert (
        '<a href="#id_rollout.group_size">Group size</a>: Input should be greater than or equal to 2'
        in summary
    )
    assert '<a href="#id_sync_offsets">Sync offsets</a>: sync_offset=2 is listed twice' in summary
    assert 'id="id_rollout.group_size"' in html and 'id="id_sync_offsets"' in html


def test_blank_run_parameters_take_the_runconfig_defaults(alice_client, team):
    data = sweep_form(team, "defaults")
    assert alice_client.post(reverse("submit-sweep"), data).status_code == 302
    expected = RunConfig.model_validate({"algorithm": {"preset": "grpo"}})
    assert Run.objects.get().config == expected.model_dump(mode="json")


@pytest.fixture
def api(client, alice):
    token = ApiToken.issue(alice)

    def post(path: str, body) -> object:
        payload = body if isinstance(body, str) else json.dumps(body)
        return client.post(
            path, payload, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )

    return post


def sweep_body(**changes) -> dict:
    body = {"name": "api sweep", "team": "team-a", "config": copy.deepcopy(TINY_CONFIG), "presets": ["grpo"]}
    body.update(changes)
    return body


def with_config(path: str, value) -> dict:
    config = copy.deepcopy(TINY_CONFIG)
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return sweep_body(config=config)


INVALID_BODIES = {
    "unknown preset": (sweep_body(presets=["grpo", "no-such-preset"]), "presets", "unknown preset"),
    "group size 1": (
        with_config("rollout.group_size", 1),
        "config.rollout.group_size",
        "greater than or equal to 2",
    ),
    "negative lr": (with_config("optimizer.lr", -0.001), "config.optimizer.lr", "greater than 0"),
    "steps over the limit": (with_config("steps", 100_001), "config.steps", "less than or equal to 100000"),
    "dataset outside the roots": (
        with_config("task", {"name": "jsonl", "path": "/etc/passwd"}),
        "config.task.path",
        "outside the allowed roots",
    ),
    "unknown config field": (with_config("rollout.groupsize", 4), "config.rollout.groupsize", "Extra inputs"),
    "staleness out of range": (
        sweep_body(staleness=[{"sync_offset": -1}]),
        "staleness.sync_offset",
        "greater than or equal to 0",
    ),
    "max_staleness without async": (
        with_config("execution", {"mode": "distributed", "max_staleness": 2}),
        "config.execution.max_staleness",
        "only (mode is",
    ),
    "too many rollout workers": (
        with_config("execution", {"mode": "async", "rollout_workers": 17}),
        "config.execution.rollout_workers",
        "less than or equal to 16",
    ),
    "rollout-gpu on a cpu device": (
        sweep_body(
            config={"execution": {"mode": "distributed"}, "rollout": {"engine": "vllm"}, "device": "cpu"}
        ),
        "config.device",
        "the rollout-gpu queue",
    ),
    "team of someone else": (sweep_body(team="team-b"), "team", "not a member"),
    "name too long": (sweep_body(name="x" * 201), "name", "at most 200 characters"),
    "blank name": (sweep_body(name="  "), "name", "at least 1 character"),
    "NUL in the description": (sweep_body(description="a\x00b"), "description", "should match pattern"),
    "NUL in the config": (with_config("task.prompt_template", "{question}\x00"), "config", "NUL characters"),
    "repeated preset": (sweep_body(presets=["grpo", "grpo"]), "presets", "grpo is listed twice"),
    "repeated seed": (sweep_body(seeds=[3, 3]), "seeds", "3 is listed twice"),
    "repeated staleness setting": (
        sweep_body(staleness=[{"sync_offset": 2}, {}, {"sync_offset": 2}]),
        "staleness.sync_offset",
        "sync_offset=2 is listed twice",
    ),
    "sync interval 1 is on-policy again": (
        sweep_body(staleness=[{}, {"sync_interval": 1}]),
        "staleness.sync_interval",
        "sync_interval=1 is the same setting as on-policy",
    ),
    "sync offset beyond the run": (
        sweep_body(staleness=[{"sync_offset": 10}]),
        "staleness.sync_offset",
        "would make an offline run",
    ),
    "format spec in the prompt template": (
        with_config(
            "task",
            {
                "name": "jsonl",
                "path": str(TEST_VAR / "data" / "train.jsonl"),
                "prompt_template": "{question}{question:>1000000000}",
            },
        ),
        "config.task.prompt_template",
        "has a format spec (:>1000000000); only {name} is allowed",
    ),
    "attribute access in the prompt template": (
        with_config(
            "task",
            {
                "name": "jsonl",
                "path": str(TEST_VAR / "data" / "train.jsonl"),
                "prompt_template": "{question.__class__}",
            },
        ),
        "config.task.prompt_template",
        "{question.__class__} must be a plain {name} of a field of the line",
    ),
    "responses per step over the budget": (
        with_config("rollout", {"prompts_per_step": 4096, "group_size": 4}),
        "config.rollout.prompts_per_step",
        "(4096 × 4 = 16,384 responses per step) must be <= 8,192",
    ),
    "new tokens per step over the budget": (
        with_config("rollout", {"prompts_per_step": 64, "group_size": 16, "max_new_tokens": 2048}),
        "config.rollout.max_new_tokens",
        "(64 × 16 × 2048 = 2,097,152 new tokens per step) must be <= 1,048,576",
    ),
    "batches generated ahead over the budget": (
        sweep_body(
            config={
                **TINY_CONFIG,
                "steps": 100,
                "rollout": {"prompts_per_step": 64, "group_size": 16, "max_new_tokens": 1024},
            },
            staleness=[{"sync_offset": 40}],
        ),
        "staleness.sync_offset",
        "(40 × 1,048,576 = 41,943,040 tokens of batches generated ahead) must be <= 33,554,432",
    ),
    "knob the presets do not read": (
        sweep_body(
            presets=["grpo", "reinforce", "opmd"],
            config={**TINY_CONFIG, "algorithm": {"params": {"temp": 2}}},
        ),
        "config.algorithm.params.temp",
        "temp is not a knob of grpo, reinforce, opmd: their loss does not read it",
    ),
}


@pytest.mark.parametrize("case", INVALID_BODIES, ids=list(INVALID_BODIES))
def test_invalid_api_sweep_is_422_naming_the_field(api, case):
    body, field, message = INVALID_BODIES[case]
    response = api("/api/sweeps", body)
    assert response.status_code == 422, response.content
    detail = response.json()["detail"]
    assert any(d["field"] == field and message in d["msg"] for d in detail), detail
    assert Experiment.objects.count() == 0 and Run.objects.count() == 0
    assert queued_messages() == 0


@pytest.mark.parametrize(
    "body",
    ["{not json", "[]"],
    ids=["malformed", "not an object"],
)
def test_malformed_api_body_is_a_client_error(api, body):
    response = api("/api/sweeps", body)
    assert 400 <= response.status_code < 500, response.content
    assert Run.objects.count() == 0 and queued_messages() == 0


def test_non_finite_numbers_in_the_api_config_are_422(api):
    body = json.dumps(sweep_body()).replace('"steps": 6', '"steps": 6, "optimizer": {"grad_clip": Infinity}')
    response = api("/api/sweeps", body)
    assert response.status_code == 422, response.content
    assert (
        response.json()["detail"][0]["field"] == "config" and "finite" in response.json()["detail"][0]["msg"]
    )
    assert Run.objects.count() == 0 and queued_messages() == 0


def test_wrong_types_in_the_api_body_are_422_naming_the_field(api):
    response = api("/api/sweeps", sweep_body(presets="grpo", seeds=[0, "one"]))
    assert response.status_code == 422
    assert {d["field"] for d in response.json()["detail"]} == {"presets", "seeds.1"}
    assert Run.objects.count() == 0 and queued_messages() == 0


def test_valid_api_sweep_returns_the_experiment_and_its_runs(api):
    response = api("/api/sweeps", sweep_body(presets=["grpo", "reinforce"], seeds=[0, 1]))
    assert response.status_code == 201, response.content
    body = response.json()
    experiment = Experiment.objects.get()
    assert body == {
        "experiment": experiment.pk,
        "runs": sorted(experiment.runs.values_list("pk", flat=True)),
        "message": "4 runs queued",
    }
    assert len(body["runs"]) == 4 and queued_messages() == 4


def test_runs_go_to_the_queue_their_device_needs(api):
    purge_queue("gpu")
    response = api("/api/sweeps", with_config("device", "cuda"))
    assert response.status_code == 201, response.content
    assert Run.objects.get().queue == "gpu"
    assert (queued_messages("gpu"), queued_messages("cpu")) == (1, 0)
    purge_queue("gpu")


def test_the_cpu_demo_template_fills_the_form_with_the_demo_grid(alice_client, team):
    html = alice_client.get(reverse("submit-sweep")).content.decode()
    assert 'href="?template=cpu-demo"' in html
    filled = alice_client.get(reverse("submit-sweep"), {"template": "cpu-demo"}).context["form"]
    assert filled["presets"].value() == ["reinforce", "grpo", "rec-oneside-nois", "rec-oneside-nois-wide"]
    assert (filled["sync_intervals"].value(), filled["sync_offsets"].value(), filled["seeds"].value()) == (
        "48",
        "8",
        "0, 1",
    )
    assert filled["on_policy"].value() is True and filled["offline"].value() is True
    assert filled["optimizer.lr"].value() == 3e-5 and filled["steps"].value() == 150
    assert (filled["rollout.prompts_per_step"].value(), filled["rollout.group_size"].value()) == (16, 8)
    assert (
        alice_client.get(reverse("submit-sweep"), {"template": "nope"}).context["form"]["seeds"].value()
        == "0"
    )


def nested(depth: int) -> str:
    """A JSON object `depth` levels deep, written out (json.dumps would itself hit the recursion limit)."""
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


@pytest.mark.parametrize("depth", [500, 900])
@pytest.mark.parametrize("team_name", ["team-a", "team-b"], ids=["own team", "a team she is not in"])
def test_a_deeply_nested_config_is_422_naming_the_field_and_the_maximum_depth(api, team_name, depth):
    body = json.dumps(sweep_body(team=team_name, config={})).replace(
        '"config": {}', f'"config": {nested(depth)}'
    )
    response = api("/api/sweeps", body)
    assert response.status_code == 422, response.content
    detail = response.json()["detail"]
    assert any(d["field"] == "config" and "the maximum depth is 32" in d["msg"] for d in detail), detail
    assert any(d["field"] == "team" for d in detail) == (team_name == "team-b"), detail
    assert Run.objects.count() == 0 and queued_messages() == 0


def test_a_deeply_nested_staleness_setting_is_422(api):
    body = json.dumps(sweep_body(staleness=[])).replace('"staleness": []', f'"staleness": [{nested(600)}]')
    response = api("/api/sweeps", body)
    assert response.status_code == 422, response.content
    assert {d["field"] for d in response.json()["detail"]} == {"staleness"}
    assert "the maximum depth is 32" in response.json()["detail"][0]["msg"]


def test_a_config_at_the_maximum_depth_is_judged_by_runconfig(api):
    body = json.dumps(sweep_body(config={})).replace('"config": {}', f'"config": {nested(32)}')
    detail = api("/api/sweeps", body).json()["detail"]
    assert [d["field"] for d in detail] == ["config.a"] and "Extra inputs" in detail[0]["msg"], detail


def test_negative_steps_give_only_their_own_error_and_async_staleness_one_error_with_a_remedy(
    alice_client, team
):
    response = alice_client.post(
        reverse("submit-sweep"), form_data(team, steps="-5", sync_offsets="8", sync_intervals="4")
    )
    assert [(anchor, message) for anchor, _, message in response.context["form"].error_summary()] == [
        ("id_steps", "Input should be greater than or equal to 1")
    ]
    response = alice_client.post(
        reverse("submit-sweep"),
        form_data(team, **{"execution.mode": "async", "sync_offsets": "2", "offline": "on"}),
    )
    summary = response.context["form"].error_summary()
    assert len(summary) == 1 and summary[0][0] == "id_execution.mode", summary
    assert response.content.decode().count("keep only on-policy and set that bound") == 2, (
        "in the summary and at the field"
    )


def test_the_same_form_sent_again_asks_before_queueing_a_duplicate(alice_client, team):
    """The back button returns the submitted form filled in: a second submit of the same name and
    grid within 10 minutes queues nothing and says what is already queued, with a button to queue
    it again; another name or another grid queues at once."""
    data = form_data(team, name="once", seeds="0, 1")
    assert alice_client.post(reverse("submit-sweep"), data).status_code == 302
    first = Experiment.objects.get(name="once")
    again = alice_client.post(reverse("submit-sweep"), data)
    assert again.status_code == 409
    html = again.content.decode()
    assert f"#{first.pk} once</a>,\n        with this name and this grid, was queued" in html
    assert 'name="queue_again"' in html and Experiment.objects.count() == 1 and Run.objects.count() == 2
    assert alice_client.post(reverse("submit-sweep"), {**data, "seeds": "0, 1, 2"}).status_code == 302
    assert alice_client.post(reverse("submit-sweep"), {**data, "name": "twice"}).status_code == 302
    assert alice_client.post(reverse("submit-sweep"), {**data, "queue_again": "1"}).status_code == 302
    assert Experiment.objects.filter(name="once").count() == 3
    Experiment.objects.filter(name="once").update(created=timezone.now() - timedelta(minutes=11))
    assert alice_client.post(reverse("submit-sweep"), data).status_code == 302, "long after: a new sweep"
