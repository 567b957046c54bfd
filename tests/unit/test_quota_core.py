"""The client quota core (``raftlog.server.quota_core``): Kafka's sampled rate and window,
the throttle-time formula, entity precedence, sensor expiry; and a greedy client simulated
against it stays within 20% of its quota."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.metadata.image import QuotaEntity
from raftlog.server.quota_core import (
    ClientQuotaCore,
    SampledRate,
    resolve,
    throttle_time_ms,
)

P = "producer_byte_rate"
R = "request_percentage"


def test_a_new_rate_is_measured_over_at_least_ten_windows() -> None:
    rate = SampledRate(11, 1000)
    rate.record(1000, 0)
    assert rate.window_size_ms(0) == 10_000
    assert rate.measure(0) == pytest.approx(100.0)
    rate.record(1000, 5500)
    assert rate.window_size_ms(5500) == 10_500  # 5 full windows + 5 made up + 0.5 elapsed
    # 12.5 s on: the samples are older than 11 windows, so they are reset.
    assert rate.window_size_ms(18_000) == 10_000
    assert rate.measure(18_000) == 0.0


def test_the_rate_slides_over_eleven_samples() -> None:
    rate = SampledRate(11, 1000)
    for second in range(30):
        rate.record(500, second * 1000)
    # The 11 samples started at 19..29 s, measured over the time since the oldest started.
    assert rate.measure(29_500) == pytest.approx(11 * 500 / 10.5, rel=1e-9)


def test_throttle_time_is_kafkas_formula() -> None:
    assert throttle_time_ms(200, 100, 10_000) == 10_000
    assert throttle_time_ms(150, 100, 11_000) == 5_500
    assert throttle_time_ms(100, 100, 10_000) == 0
    core = ClientQuotaCore()
    index = {(("client-id", "c"),): {P: 100.0}}
    assert core.record(index, P, "u", "c", 1000, 0) == 0  # 1000 B / 10 s = the quota
    # 3000 B over 10 s: 300 B/s on a 100 B/s quota, (300 - 100) / 100 * 10 s.
    assert core.record(index, P, "u", "c", 2000, 0) == 20_000


def test_request_percentage_throttles_at_most_one_window() -> None:
    core = ClientQuotaCore()
    index = {(("user", None),): {R: 1.0}}
    assert core.record(index, R, "u", "c", 500.0, 0) == 1000


_U, _C = "alice", "app"
# Kafka's precedence, most specific first, with whose rate each is measured on.
_LEVELS: list[tuple[QuotaEntity, tuple[str, str]]] = [
    ((("client-id", _C), ("user", _U)), (_U, _C)),
    ((("client-id", None), ("user", _U)), (_U, _C)),
    ((("user", _U),), (_U, "")),
    ((("client-id", _C), ("user", None)), (_U, _C)),
    ((("client-id", None), ("user", None)), (_U, _C)),
    ((("user", None),), (_U, "")),
    ((("client-id", _C),), ("", _C)),
    ((("client-id", None),), ("", _C)),
]


@pytest.mark.parametrize("level", range(len(_LEVELS)))
def test_precedence(level: int) -> None:
    # Every entity from ``level`` down sets the quota; the most specific one wins.
    index = {entity: {P: float(1000 + i)} for i, (entity, _) in enumerate(_LEVELS)
             if i >= level}
    # Unrelated entities never match.
    index[(("client-id", "other"), ("user", "bob"))] = {P: 1.0}
    index[(("user", "bob"),)] = {P: 2.0}
    assert resolve(index, P, _U, _C) == (_LEVELS[level][1], float(1000 + level))
    # An entity that sets another key does not capture this one.
    index[_LEVELS[0][0]] = {"consumer_byte_rate": 5.0}
    if level == 0:
        assert resolve(index, P, _U, _C) == (_LEVELS[1][1], 1001.0)


def test_no_quota_records_nothing() -> None:
    core = ClientQuotaCore()
    assert resolve({}, P, _U, _C) is None
    assert core.record({(("user", "bob"),): {P: 1.0}}, P, _U, _C, 10**9, 0) == 0
    assert core.sensor_count == 0


def test_default_client_quota_is_per_client_id() -> None:
    core = ClientQuotaCore()
    index = {(("client-id", None),): {P: 100.0}}
    assert core.record(index, P, "u", "a", 2000, 0) > 0
    assert core.record(index, P, "u", "b", 1000, 0) == 0  # b has its own rate
    # A user quota is one rate for all of the user's clients.
    index = {(("user", "u"),): {P: 100.0}}
    assert core.record(index, P, "u", "a", 1000, 0) == 0
    assert core.record(index, P, "u", "b", 1000, 0) > 0


def test_idle_sensors_expire_and_their_number_is_bounded() -> None:
    core = ClientQuotaCore(expiry_ms=3_600_000, sensors_max=3)
    index = {(("client-id", None),): {P: 100.0}}
    for name in "abc":
        core.record(index, P, "u", name, 1, 0)
    core.record(index, P, "u", "a", 1, 1000)  # a is now the most recently used
    core.record(index, P, "u", "d", 1, 2000)  # evicts b, the least recently used
    assert core.sensor_count == 3
    core.expire(3_600_000 + 500)  # c (last used at 0) is idle for an hour
    assert core.sensor_count == 2
    core.expire(3_600_000 + 2000)
    assert core.sensor_count == 0


def _greedy_client(quota: float, size: int, duration_ms: float, cost_ms: float) -> float:
    """A client that sends a request of ``size`` whenever it is not muted (as a throttled
    connection is); its achieved rate over ``duration_ms`` divided by the quota."""
    core = ClientQuotaCore()
    index = {(("client-id", "c"),): {P: quota}}
    now, total = 0.0, 0
    while now < duration_ms:
        total += size
        throttle = core.record(index, P, "u", "c", size, now)
        now += cost_ms + throttle
    return total / (duration_ms / 1000) / quota


@settings(max_examples=15, deadline=None)
@given(st.floats(min_value=50_000, max_value=2_000_000),
       st.floats(min_value=0.005, max_value=0.0625), st.floats(min_value=2, max_value=50))
def test_a_greedy_client_gets_its_quota_within_20_percent(quota: float, fraction: float,
                                                          speed: float) -> None:
    # Requests up to 1/16 of a second's quota (librdkafka's 16 KiB batches on >= 256 KB/s),
    # from a client that could send ``speed`` times its quota.
    size = max(1, int(quota * fraction))
    ratio = _greedy_client(quota, size, 30_000, size / (speed * quota) * 1000)
    assert 0.9 <= ratio <= 1.2, ratio
