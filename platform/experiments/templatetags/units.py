"""Template filters that show numbers in units people read: durations and fractions."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def seconds(value: float | None) -> str:
    """A duration in seconds as "850 µs", "12.3 ms", "4.56 s" or "3 min 20 s"; "–" when unknown."""
    if value is None:
        return "–"
    value = float(value)
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    if value < 60:
        return f"{value:.2f} s"
    minutes, rest = divmod(round(value), 60)
    return f"{minutes} min {rest} s"


@register.filter
def percent(value: float | None) -> str:
    """A fraction as a percentage with one decimal, "23.5%"; "–" when unknown."""
    if value is None:
        return "–"
    return f"{float(value) * 100:.1f}%"
