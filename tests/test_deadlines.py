"""The tests' one knob for a loaded machine: AURORA_TEST_PATIENCE scales every wait of
aurora_store.testing.processes, and a value that would shorten them is refused."""

from __future__ import annotations

import pytest

from aurora_store.testing.processes import deadline, patience, wait_for


def test_patience_scales_deadlines_and_refuses_what_would_shorten_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AURORA_TEST_PATIENCE", raising=False)
    assert patience() == 1.0 and deadline(30) == 30
    monkeypatch.setenv("AURORA_TEST_PATIENCE", "3")
    assert deadline(30) == 90
    for bad in ("0.5", "0", "-2", "nan", "three", "inf-ish"):
        monkeypatch.setenv("AURORA_TEST_PATIENCE", bad)
        with pytest.raises(ValueError, match="AURORA_TEST_PATIENCE"):
            patience()


def test_a_wait_ends_at_its_event_and_a_timeout_names_what_and_how_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AURORA_TEST_PATIENCE", "2")
    calls = iter(range(100))
    wait_for(lambda: next(calls) >= 3, "the third poll", timeout=600, interval=0)  # returns at the event
    with pytest.raises(AssertionError, match=r"timed out waiting for nothing \(0 s\)"):
        wait_for(lambda: False, "nothing", timeout=0.0001, interval=0)
