"""A finished experiment written straight into the database, for the comparison tests: no
training, just runs and metric points whose values follow a formula the tests can check.

`make_finished_experiment` builds presets × staleness settings × seeds runs with steps
0…`steps`, each logging `reward/mean = (step / steps) × (0.5 + 0.25 p − 0.1 s) + 0.05 seed`
(p = preset index, s = staleness index), `kl/init = 0.01 × step × (1 + s)`,
`response_length/mean = 10 + seed`, one step per second of wall time; from step 1 on, as
the trainer does, `time/step_s` (`step_time`) and `tokens_per_s` (`tokens_per_s`); and every
`eval_every` steps and after the last, `eval/accuracy` (`accuracy`, or the `final_accuracy`
given: a function of (preset, staleness label, seed) that the accuracy climbs to linearly from 0.25;
with `axes`, of (preset, staleness label, seed, variant)).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from support import TINY_CONFIG, log_points

from experiments.models import Experiment, Run
from experiments.sweeps import expand

START = datetime(2026, 11, 1, tzinfo=UTC)


def reward(step: int, steps: int, preset_index: int, staleness_index: int, seed: int) -> float:
    return step / steps * (0.5 + 0.25 * preset_index - 0.1 * staleness_index) + 0.05 * seed


def accuracy(step: int, steps: int, preset_index: int, staleness_index: int, seed: int) -> float:
    return 0.25 + step / steps * (0.4 + 0.05 * preset_index - 0.1 * staleness_index) + 0.01 * seed


def step_time(step: int, preset_index: int, staleness_index: int, seed: int) -> float:
    """`time/step_s`: (1 + s) × (0.5 + 0.25 p) × (1 + 0.5 seed) seconds, 20% less on odd steps and 20%
    more on even ones, so the mean over an even number of steps is exactly the first three factors."""
    return (1 + staleness_index) * (0.5 + 0.25 * preset_index) * (1 + 0.5 * seed) * (0.8 if step % 2 else 1.2)


def tokens_per_s(step: int, preset_index: int, staleness_index: int, seed: int) -> float:
    """`tokens_per_s`: 16 responses (4 prompts × 4) of `10 + seed` tokens over `step_time`."""
    return 16 * (10 + seed) / step_time(step, preset_index, staleness_index, seed)


def make_finished_experiment(
    team,
    owner,
    name: str = "compare",
    presets: tuple[str, ...] = ("reinforce", "grpo"),
    staleness: tuple[dict, ...] = ({}, {"sync_offset": 2}),
    seeds: tuple[int, ...] = (0, 1),
    steps: int = 20,
    eval_every: int = 5,
    final_accuracy: Callable[..., float] | None = None,
    axes: dict | None = None,
) -> Experiment:
    sweep = expand(TINY_CONFIG, list(presets), list(staleness), list(seeds), axes=axes)
    experiment = Experiment.objects.create(team=team, owner=owner, name=name, spec=sweep.as_spec())
    cells = len(sweep.configs) // (len(presets) * len(staleness))  # variants × seeds per preset and setting
    # In the grid's order: presets × staleness × variants × seeds.
    for index, (config, variant) in enumerate(zip(sweep.configs, sweep.variants, strict=True)):
        p = presets.index(config.algorithm.preset)
        s = index // cells % len(staleness)
        run = Run.create_for(experiment, config, status=Run.SUCCEEDED, progress=steps, variant=variant)
        points = []
        for step in range(steps + 1):
            wall_time = START + timedelta(seconds=step)
            values = {
                "reward/mean": reward(step, steps, p, s, config.seed),
                "kl/init": 0.01 * step * (1 + s),
                "response_length/mean": 10.0 + config.seed,
            }
            if step % eval_every == 0 or step == steps:
                if final_accuracy is None:
                    values["eval/accuracy"] = accuracy(step, steps, p, s, config.seed)
                else:
                    args = (config.algorithm.preset, config.staleness_label, config.seed)
                    end = final_accuracy(*args, variant) if axes else final_accuracy(*args)
                    values["eval/accuracy"] = 0.25 + step / steps * (end - 0.25)
            if step > 0:
                values["time/step_s"] = step_time(step, p, s, config.seed)
                values["tokens_per_s"] = tokens_per_s(step, p, s, config.seed)
            points += [(metric, step, value, wall_time) for metric, value in values.items()]
        log_points(run, points)
    return experiment
