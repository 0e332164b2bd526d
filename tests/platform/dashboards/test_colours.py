"""Line colours: given in turn to the presets a page shows, so no two lines shown together share
a colour (grpo and m2po were both orange when colours went by a preset's place among all 25), each
readable on white (3:1, WCAG's contrast for graphics), the same for the same runs."""

from __future__ import annotations

import itertools
import math

from dashboards.comparison.colours import PALETTE, colour, preset_colours
from rlcore.presets import preset_names


def _linear(channel: int) -> float:
    c = channel / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


def contrast_on_white(hex_colour: str) -> float:
    r, g, b = map(_linear, _rgb(hex_colour))
    return 1.05 / (0.2126 * r + 0.7152 * g + 0.0722 * b + 0.05)


def lab(hex_colour: str) -> tuple[float, float, float]:
    r, g, b = map(_linear, _rgb(hex_colour))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def test_the_presets_the_new_user_compared_get_three_different_readable_colours():
    colours = preset_colours(["m2po", "grpo", "decoupled-ppo", "grpo"])
    assert set(colours) == {"grpo", "m2po", "decoupled-ppo"}
    assert len(set(colours.values())) == 3
    assert all(contrast_on_white(c) >= 3 for c in colours.values()), colours
    assert preset_colours(["grpo", "decoupled-ppo", "m2po"]) == colours, "the same runs, the same colours"


def test_every_palette_colour_is_readable_on_white_and_far_from_every_other():
    assert len(PALETTE) == 20
    for c in PALETTE:
        assert contrast_on_white(c) >= 3, c
    for a, b in itertools.combinations(PALETTE, 2):
        assert math.dist(lab(a), lab(b)) >= 22, (a, b)


def test_all_presets_at_once_and_more_still_differ_and_stay_readable():
    names = [*preset_names(), "imported-a", "imported-b", *(f"x{i}" for i in range(20))]
    colours = preset_colours(names)
    assert len(set(colours.values())) == len(names)
    assert all(contrast_on_white(c) >= 3 for c in colours.values())
    assert [colours[p] for p in preset_names()[:20]] == list(PALETTE), "rlcore's order first"
    assert colour(20) != colour(21) and colour(5) == PALETTE[5]
