"""Writes fixture.json: rliable 1.2's IQM, its CI, probability of improvement and performance
profiles on fixed inputs, for `dashboards.comparison.statistics` to be checked against.

Run it with rliable 1.2 installed (it pins old dependencies, so in a venv of its own):
    python -m venv /tmp/rl && /tmp/rl/bin/pip install rliable==1.2.0 "pandas<3"  # arch 7.2 breaks on pandas 3
    /tmp/rl/bin/python tests/platform/dashboards/rliable/make_fixture.py
rliable draws its bootstrap from numpy's global RNG (its `random_state` is not used by
`update_indices`), so the global RNG is seeded before every call.
"""

import json
from pathlib import Path

import numpy as np
import rliable
from rliable import library, metrics

SEED = 7
rng = np.random.default_rng(2021)
INPUTS = {
    "five_seeds": rng.normal(0.6, 0.05, size=(5, 1)).round(4),
    "three_seeds_tied": np.array([[0.5], [0.5], [0.7]]),
    "two_seeds": np.array([[0.61], [0.64]]),
    "six_seeds_three_tasks": rng.uniform(0, 1, size=(6, 3)).round(4),
    "four_seeds_three_tasks": rng.uniform(0, 1, size=(4, 3)).round(4),
}
POI_PAIRS = [
    ("five_seeds", "three_seeds_tied"),
    ("three_seeds_tied", "two_seeds"),
    ("six_seeds_three_tasks", "four_seeds_three_tasks"),
    ("five_seeds", "five_seeds"),
]
TAUS = np.linspace(0.0, 1.0, 11)
REPS = 2000


def iqm_func(x):
    return np.array([metrics.aggregate_iqm(x)])


out = {
    "rliable": getattr(rliable, "__version__", "1.2.0"),
    "seed": SEED,
    "reps": REPS,
    "taus": TAUS.tolist(),
    "inputs": {k: v.tolist() for k, v in INPUTS.items()},
    "iqm": {},
    "poi": [],
    "profile": {},
}
for name, scores in INPUTS.items():
    np.random.seed(SEED)
    point, interval = library.get_interval_estimates({name: scores}, iqm_func, reps=REPS)
    out["iqm"][name] = {
        "value": float(point[name][0]),
        "lo": float(interval[name][0, 0]),
        "hi": float(interval[name][1, 0]),
    }
    np.random.seed(SEED)
    profiles, cis = library.create_performance_profile({name: scores}, TAUS, reps=REPS)
    out["profile"][name] = {
        "value": profiles[name].tolist(),
        "lo": cis[name][0].tolist(),
        "hi": cis[name][1].tolist(),
    }
for x, y in POI_PAIRS:
    np.random.seed(SEED)
    point, interval = library.get_interval_estimates(
        {"x,y": (INPUTS[x], INPUTS[y])},
        lambda a, b: np.array([metrics.probability_of_improvement(a, b)]),
        reps=REPS,
    )
    out["poi"].append(
        {
            "x": x,
            "y": y,
            "value": float(point["x,y"][0]),
            "lo": float(interval["x,y"][0, 0]),
            "hi": float(interval["x,y"][1, 0]),
        }
    )
(Path(__file__).parent / "fixture.json").write_text(json.dumps(out, indent=1) + "\n")
