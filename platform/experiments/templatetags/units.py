"""Template filters that show numbers in units people read: durations, fractions, plain numbers
at a precision that fits their size, and configs as JSON."""

from __future__ import annotations

import json
import math

from django import template

register = template.Library()


@register.filter
def seconds(value: float | None) -> str:
    """A duration in seconds as "850 µs", "12.3 ms", "4.56 s" or "3 min 20 s"; "–" when unknown."""
    if value is None:
        return "–"
    value = float(value)
    if value == 0:
        return "0 s"
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    if value < 60:
        return f"{value:.2f} s"
    minutes, rest = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@register.filter
def elapsed(start, end=None) -> str:
    """The time from `start` to `end` (a datetime; to now when None) as `seconds` shows it; "–"
    without a start."""
    if start is None:
        return "–"
    from django.utils import timezone

    return seconds(max(0.0, ((end or timezone.now()) - start).total_seconds()))


@register.filter
def percent(value: float | None) -> str:
    """A fraction as a percentage with one decimal, "23.5%"; "–" when unknown."""
    if value is None:
        return "–"
    return f"{float(value) * 100:.1f}%"


@register.filter
def number(value: float | None) -> str:
    """A number at a precision that fits its size: whole numbers as such ("30", "12,000"), others
    with 4 significant digits ("0.1752", "3e-05", "1,234"); "–" when unknown or not finite."""
    if value is None or isinstance(value, bool):
        return "–" if value is None else str(value)
    value = float(value)
    if not math.isfinite(value):
        return "–"
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.3g}"


@register.filter
def logged(value: float | None) -> str:
    """A metric's value as the run logged it: `number`'s, but a NaN or ±inf the run did log is shown
    as "NaN", "inf" or "-inf", apart from "–", a step where it logged none (a gap)."""
    if value is not None and not isinstance(value, bool) and not math.isfinite(float(value)):
        value = float(value)
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return number(value)


@register.filter
def as_json(value) -> str:
    """A config as JSON people can paste into the API (null, false, "…"), keys sorted."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
