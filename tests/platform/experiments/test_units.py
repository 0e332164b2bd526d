"""Numbers and configs as pages show them: a precision that fits the size, JSON that pastes into the API."""

import json

import pytest

from experiments.templatetags.units import as_json, logged, number, percent, seconds


@pytest.mark.parametrize(
    "value,shown",
    [
        (30.0, "30"),
        (12000, "12,000"),
        (3e-05, "3e-05"),
        (0.17523, "0.1752"),
        (0.0, "0"),
        (-0.5, "-0.5"),
        (1234.5678, "1235"),
        (123456.7, "123,457"),
        (float("nan"), "–"),
        (None, "–"),
    ],
)
def test_numbers_are_shown_at_a_precision_that_fits_their_size(value, shown):
    assert number(value) == shown


def test_logged_values_tell_a_logged_nan_or_inf_from_a_gap():
    assert [logged(v) for v in (float("nan"), float("inf"), float("-inf"), None, 0.17523)] == [
        "NaN",
        "inf",
        "-inf",
        "–",
        "0.1752",
    ]


def test_configs_are_json_that_pastes_into_the_api():
    config = {"model": {"path": None}, "staleness": {"offline": False}, "steps": 30}
    text = as_json(config)
    assert "null" in text and "false" in text and "None" not in text and "False" not in text
    assert json.loads(text) == config


def test_durations_and_fractions():
    assert (seconds(0.0123), seconds(200), percent(0.235)) == ("12.3 ms", "3 min 20 s", "23.5%")
