"""What a run's worker measures is named once (`rlcore.sinks.Measured`): each field under its key
in the run's summary, written and read back through the same class."""

from __future__ import annotations

import pytest

from rlcore.sinks import MEASURED_KEYS, STEP_METRICS, Measured


def test_each_measured_field_has_its_key_and_no_key_is_a_step_metric():
    assert MEASURED_KEYS["time_attempt_s"] == "time/attempt_s"
    assert MEASURED_KEYS["time_warm_start_s"] == "time/warm_start_s"
    assert MEASURED_KEYS["machine_others_cores"] == "machine/others_cores"
    assert MEASURED_KEYS["weights_publish_s_mean"] == "weights/publish_s_mean"
    assert len(set(MEASURED_KEYS.values())) == len(MEASURED_KEYS)
    assert not set(MEASURED_KEYS.values()) & set(STEP_METRICS)


def test_what_is_stored_reads_back_and_what_was_not_measured_is_none():
    measured = Measured(time_attempt_s=12.5, steps_steady=9.0, machine_contended=1.0)
    stored = measured.stored()
    assert stored == {"time/attempt_s": 12.5, "steps/steady": 9.0, "machine/contended": 1.0}
    assert Measured.of({**stored, "eval/accuracy": 0.5}) == measured
    assert measured.contended is True and measured.steady_steps == 9
    assert Measured.of(None) == Measured() and Measured().contended is None and Measured().steady_steps == 0
    with pytest.raises(TypeError):
        Measured(time_atempt_s=1.0)  # a misspelt field is refused, not stored under a new key
