"""What the dashboard tests share besides fixtures (those are in conftest.py): the comparison
payload, the demo experiment's shape (the paper's claims), the speed-up cells and run summaries,
the operator's probe of ended-early runs, hostile report text, and waiting for the comparison
page to draw in Chromium."""

from __future__ import annotations

from django.urls import reverse
from support import TEST_VAR, log_points

from experiments import packing, series
from experiments.models import MetricChunk, MetricSummary, Run

SCREENSHOTS = TEST_VAR / "screenshots"


def data(client, experiment, **params):
    """The payload; the sample's reward/mean unless another metric is asked for (the page's default
    is eval/accuracy, see test_the_page_opens_on_held_out_accuracy)."""
    params.setdefault("metric", "reward/mean")
    response = client.get(reverse("experiment-compare-data", args=[experiment.pk]), params)
    assert response.status_code == 200, response.content
    return response.json()


def rendered(page, **state) -> None:
    """Wait until the page has drawn the view whose controls include `state`."""
    expected = "&&".join(f"{k}={v}" for k, v in state.items())
    page.wait_for_function(
        """expected => { const r = document.getElementById('compare').dataset.rendered;
            if (!r) return false; const q = new URLSearchParams(r);
            return expected.split('&&').every(kv => { const i = kv.indexOf('='); return q.get(kv.slice(0, i)) === kv.slice(i + 1); }); }""",
        arg=expected,
    )


# ---- the demo: 4 presets × 3 staleness settings × 3 seeds shaped like the paper's claims (`demo`)

DEMO_PRESETS = ("reinforce", "grpo", "rec-oneside-nois", "rec-oneside-nois-wide")
DEMO_STALENESS = ({}, {"sync_offset": 2}, {"offline": True})
# grpo − rec-oneside-nois offline per seed: mean 0.01, σ_d 0.02, so ⌈(2.80158 · 0.02 / 0.01)²⌉ = 32 seeds.
NOIS_OFFLINE = {0: 0.01, 1: 0.03, 2: -0.01}


def demo_accuracy(preset: str, staleness: str, seed: int) -> float:
    """Final held-out accuracy shaped like the paper's claims (docs/algorithms.md §10)."""
    if staleness == "on-policy":
        return 0.70 + 0.02 * seed
    if staleness == "sync_offset=2":
        return (0.50 if preset == "reinforce" else 0.695) + 0.02 * seed
    offline = {
        "reinforce": 0.40,
        "grpo": 0.60,
        "rec-oneside-nois": 0.60 + NOIS_OFFLINE[seed],
        "rec-oneside-nois-wide": 0.685,
    }
    return offline[preset] + 0.02 * seed


# ---- the speed-up readout: cells of every execution mode, and run summaries of known durations

CELLS = (
    {},
    {"sync_offset": 2},
    {"mode": "async", "max_staleness": 2},
    {"mode": "distributed", "sync_offset": 2},
)


def measured(wall_per_step_s: float, cpu_per_step_s: float, contended: bool = False, steps: int = 19) -> dict:
    """A run summary as `workers.measure` writes it, for `steps` steady steps."""
    return {
        "time/startup_s": 3.0,
        "time/warm_start_s": 7.0,
        "time/first_step_s": 1.5,
        "time/steady_s": 0.75 * wall_per_step_s * steps,
        "time/eval_steady_s": 0.25 * wall_per_step_s * steps,
        "time/checkpoint_steady_s": 0.0,
        "time/attempt_s": 100.0,
        "steps/steady": float(steps),
        "tokens/steady": 1000.0 * steps,
        "cpu/trainer_steady_s": 0.5 * cpu_per_step_s * steps,
        "cpu/rollout_steady_s": 0.5 * cpu_per_step_s * steps,
        "threads/trainer": 1.0,
        "machine/others_cores": 1.0 if contended else 0.02,
        "machine/contended": float(contended),
    }


# ---- the operator's probe (`probe`, research/probe-turn4.md, N11): grpo × seeds 0–1 ×
# {sync_offset 1, async ≤ 1}, 40 steps, held-out accuracy every 10

PROBE_STALENESS = ({"sync_offset": 1}, {"mode": "async", "max_staleness": 1})
PROBE_FINALS = {"sync_offset=1": 0.50, "async ≤ 1": 0.45}
ASYNC, SCHEDULE = "async ≤ 1", "sync_offset=1"


def probe_measured(wall_per_step_s: float, contended: bool = False, steps: int = 38) -> dict:
    """A run summary as `workers.measure` writes it (`measured`), a CPU second a step."""
    return measured(wall_per_step_s, 1.0, contended, steps)


def end_at(run: Run, status: str, step: int) -> None:
    """`run` as if it had ended `status` at `step`: its points after that step never stored, its
    progress that step."""
    kept = [
        (name, s, v, packing.wall_time(t))
        for name, (steps, values, times) in series.points_of(run.pk)
        for s, v, t in zip(steps.tolist(), values.tolist(), times.tolist(), strict=True)
        if s <= step
    ]
    MetricChunk.objects.filter(run=run).delete()
    MetricSummary.objects.filter(run=run).delete()
    log_points(run, kept)
    Run.objects.filter(pk=run.pk).update(status=status, progress=step)


def configured_for(experiment, steps: int) -> None:
    """Its runs' configs ask for the `steps` they logged (the sample's configs keep the tiny 6)."""
    for run in experiment.runs.all():
        run.config = {**run.config, "steps": steps}
        run.save(update_fields=["config"])


def async_run(experiment, seed: int = 1) -> Run:
    return experiment.runs.get(staleness=ASYNC, seed=seed)


# ---- hostile text for reports

# A metric name is any text: this one would be a link to another host in Plotly's title, unescaped.
HOSTILE_METRIC = '<a href="https://evil.example.com/x">click</a>'
PIXEL = "https://evil.example.com/pixel.png?who=report"

MALICIOUS = """Hello <script>window.pwned = 1</script>

[click](javascript:window.pwned=2) <img src=x onerror="window.pwned=3">

<a href="#" onclick="window.pwned=4">a</a> [ok](https://example.org/page)"""
