"""The lines' colours: `PALETTE` in turn, then more (`colour`), given to the presets present in
`rlcore.presets` order (`preset_colours`)."""

from __future__ import annotations

import colorsys

from rlcore.presets import preset_names

# Colours for the lines of one chart, given in turn to the presets present (or a field's values):
# each at least 3:1 against white (WCAG's contrast for graphics) and every pair at least 22 apart in
# CIELAB (ΔE*76), so no two lines shown together look alike. Past 20, `colour` makes more.
PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#d55e00",
    "#8c564b",
    "#c71585",
    "#008080",
    "#b8860b",
    "#332288",
    "#882255",
    "#556b2f",
    "#1e90ff",
    "#800000",
    "#117733",
    "#2f4f4f",
    "#009e73",
    "#cc79a7",
    "#999933",
    "#8b4513",
)


def colour(index: int) -> str:
    """The `index`-th line colour: `PALETTE`, then hues a golden angle apart, dark enough for white."""
    if index < len(PALETTE):
        return PALETTE[index]
    hue = ((index - len(PALETTE)) * 137.508 + 15) % 360
    red, green, blue = colorsys.hls_to_rgb(hue / 360, 0.32, 0.75)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


def preset_colours(presets: list[str]) -> dict[str, str]:
    """A colour for each preset shown, given in turn to the presets present (in `rlcore.presets`
    order, then the others by name): no two alike, the same for the same runs (a permalink)."""
    known = {name: i for i, name in enumerate(preset_names())}
    ordered = sorted(set(presets), key=lambda p: (known.get(p, len(known)), p))
    return {p: colour(i) for i, p in enumerate(ordered)}
