"""Catch-up that yields to client writes (replica.data.yielding): the rate falls while writes are
slower than their recent base, never below the floor, and climbs back to the ceiling when they
are not (or when there are none)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replica.data.yielding import (
    CUT,
    FLOOR,
    MIN_WRITES,
    STEP,
    TOLERANCE,
    WriteGauge,
    YieldingRate,
)

CEILING = 1e6


def test_the_gauge_gives_the_window_s_count_and_mean_then_starts_over() -> None:
    gauge = WriteGauge()
    assert gauge.take() == (0, 0.0)
    for seconds in (0.01, 0.03):
        gauge.record(seconds)
    count, mean = gauge.take()
    assert count == 2
    assert abs(mean - 0.02) < 1e-12
    assert gauge.take() == (0, 0.0)


def test_writes_slower_than_their_base_cut_the_rate_down_to_the_floor_and_no_further() -> None:
    rate = YieldingRate(CEILING)
    assert rate.step(100, 0.030) == CEILING  # the base: 30 ms
    assert rate.step(100, 0.035) == CEILING  # within the tolerance
    assert rate.step(100, 0.060) == CEILING * CUT  # twice as slow: the copy yields
    assert rate.step(100, 0.060) == CEILING * CUT * CUT
    for _ in range(20):  # within the horizon: the 30 ms base still counts
        rate.step(100, 0.060)
    assert rate.rate == CEILING * FLOOR  # a copy always finishes
    assert rate.base == 0.030


def test_the_rate_climbs_back_when_writes_are_fast_again_or_stop() -> None:
    rate = YieldingRate(CEILING)
    rate.step(100, 0.030)
    for _ in range(10):
        rate.step(100, 0.090)
    low = rate.rate
    assert rate.step(100, 0.030) == low + CEILING * STEP
    assert rate.step(MIN_WRITES - 1, 5.0) == low + 2 * CEILING * STEP  # too few to judge
    for _ in range(20):
        rate.step(0, 0.0)
    assert rate.rate == CEILING


def test_the_base_is_the_fastest_busy_window_of_the_horizon_only() -> None:
    rate = YieldingRate(CEILING)
    rate.step(100, 0.010)
    for _ in range(200):  # far longer than the horizon, all at 40 ms
        rate.step(100, 0.040)
    assert rate.base == 0.040  # the 10 ms window has left the horizon
    assert rate.rate == CEILING  # and 40 ms is within the tolerance of itself


def test_an_unlimited_or_fixed_rate_never_changes() -> None:
    rate = YieldingRate(0.0)
    assert rate.step(100, 0.030) == 0.0
    assert rate.step(100, 9.0) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 500), st.floats(0.0, 2.0, allow_nan=False)),
        min_size=1,
        max_size=200,
    )
)
def test_the_rate_stays_between_the_floor_and_the_ceiling_and_only_cuts_on_slow_busy_windows(
    windows: list[tuple[int, float]],
) -> None:
    rate = YieldingRate(CEILING)
    for writes, mean in windows:
        before, base = rate.rate, rate.base
        after = rate.step(writes, mean)
        assert CEILING * FLOOR <= after <= CEILING
        if after < before:
            assert writes >= MIN_WRITES
            assert base is not None
            assert mean > base * TOLERANCE
