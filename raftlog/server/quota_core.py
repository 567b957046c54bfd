"""Client quotas as Kafka enforces them (KIP-13, KIP-124, KIP-219): a pure core, the clock
passed in by the caller (milliseconds).

* **The rate** is Kafka's ``Rate`` over a ``SampledStat``: ``quota.window.num`` samples (11)
  of ``quota.window.size.seconds`` (1 s) each. A value goes into the current sample, a new
  one starts when the current sample is a window old, and a sample older than all the
  windows together is reset. The rate is the sum of the samples over the time since the
  oldest sample started, counted as at least ``window.num - 1`` whole windows (so a new
  client is not judged on its first second).
* **The quota** that applies to a (user, client id) is found with Kafka's precedence, per
  quota key: /users/U/clients/C, /users/U/clients/<default>, /users/U,
  /users/<default>/clients/C, /users/<default>/clients/<default>, /users/<default>,
  /clients/C, /clients/<default>. Which entity matched decides who shares the rate (Kafka's
  metric tags): the user's name and the client id where the matched entity names that type
  (by name or as the default), nothing where it does not; so /clients/<default> gives every
  client id its own rate and /users/alice one rate for all of alice's clients.
* **The throttle time**, when the rate after recording exceeds the quota, is Kafka's
  ``(rate - quota) / quota * window``, the time it takes the rate to come back to the quota;
  for ``request_percentage`` at most one window (``ClientRequestQuotaManager``).
* **Bounded memory**: a rate that was not recorded for ``expiry_ms`` (Kafka: one hour) is
  dropped, and at most ``sensors_max`` rates are kept (the least recently used goes first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Final

from raftlog.metadata.image import ClientQuotaImage, QuotaEntity
from raftlog.metadata.quota_apply import CLIENT_ID, REQUEST_PERCENTAGE, USER

QUOTA_WINDOW_NUM_DEFAULT: Final = 11
QUOTA_WINDOW_SIZE_SECONDS_DEFAULT: Final = 1
SENSOR_EXPIRY_MS: Final = 3_600_000  # Kafka's InactiveSensorExpirationTimeSeconds
SENSORS_MAX: Final = 100_000

# (user tag, client-id tag): whose rate a quota is measured on.
Tags = tuple[str, str]


class SampledRate:
    """Kafka's ``Rate`` over ``samples`` windows of ``window_ms``."""

    __slots__ = ("_current", "_samples", "_samples_max", "_window_ms")

    def __init__(self, samples: int, window_ms: float) -> None:
        assert samples >= 2 and window_ms > 0
        self._samples_max = samples
        self._window_ms = window_ms
        self._samples: list[list[float]] = []  # [start_ms, value]
        self._current = 0

    def record(self, value: float, now_ms: float) -> None:
        if not self._samples:
            self._samples.append([now_ms, 0.0])
        sample = self._samples[self._current]
        if now_ms - sample[0] >= self._window_ms:
            self._current = (self._current + 1) % self._samples_max
            if self._current >= len(self._samples):
                self._samples.append([now_ms, 0.0])
            sample = self._samples[self._current]
            sample[0], sample[1] = now_ms, 0.0
        sample[1] += value

    def _purge(self, now_ms: float) -> None:
        expire_age = self._samples_max * self._window_ms
        for sample in self._samples:
            if now_ms - sample[0] >= expire_age:
                sample[0], sample[1] = now_ms, 0.0

    def window_size_ms(self, now_ms: float) -> float:
        """The time the rate is measured over (Kafka's ``Rate.windowSize``)."""
        self._purge(now_ms)
        oldest = min((sample[0] for sample in self._samples), default=now_ms)
        elapsed = now_ms - oldest
        full_windows = int(elapsed // self._window_ms)
        if full_windows < self._samples_max - 1:
            elapsed += (self._samples_max - 1 - full_windows) * self._window_ms
        return max(elapsed, 1.0)

    def measure(self, now_ms: float) -> float:
        """Units per second."""
        window_ms = self.window_size_ms(now_ms)
        return sum(sample[1] for sample in self._samples) * 1000.0 / window_ms


def quota_index(quotas: tuple[ClientQuotaImage, ...]) -> Mapping[QuotaEntity, Mapping[str, float]]:
    """The image's quotas by entity (built once per change of the image's quotas)."""
    return {quota.entity: quota.values for quota in quotas}


def resolve(index: Mapping[QuotaEntity, Mapping[str, float]], key: str, user: str,
            client_id: str) -> tuple[Tags, float] | None:
    """The quota on ``key`` for ``user`` and ``client_id`` and whose rate it is measured on,
    by Kafka's precedence; None when no entity sets ``key``."""
    if not index:
        return None
    both = (user, client_id)
    candidates: tuple[tuple[QuotaEntity, Tags], ...] = (
        (((CLIENT_ID, client_id), (USER, user)), both),
        (((CLIENT_ID, None), (USER, user)), both),
        (((USER, user),), (user, "")),
        (((CLIENT_ID, client_id), (USER, None)), both),
        (((CLIENT_ID, None), (USER, None)), both),
        (((USER, None),), (user, "")),
        (((CLIENT_ID, client_id),), ("", client_id)),
        (((CLIENT_ID, None),), ("", client_id)),
    )
    for entity, tags in candidates:
        values = index.get(entity)
        if values is not None and key in values:
            return tags, values[key]
    return None


def throttle_time_ms(rate: float, bound: float, window_ms: float) -> int:
    """Kafka's ``QuotaUtils.throttleTime``: how long until ``rate`` is back at ``bound``."""
    if rate <= bound:
        return 0
    return round((rate - bound) / bound * window_ms)


class _Sensor:
    __slots__ = ("last_ms", "rate")

    def __init__(self, rate: SampledRate, now_ms: float) -> None:
        self.rate = rate
        self.last_ms = now_ms


class ClientQuotaCore:
    """The rates of every (quota key, user, client id) that has a quota, and the throttle
    time of each new value. Not thread-safe: the node's trio thread calls it."""

    def __init__(self, window_num: int = QUOTA_WINDOW_NUM_DEFAULT,
                 window_size_s: int = QUOTA_WINDOW_SIZE_SECONDS_DEFAULT,
                 expiry_ms: float = SENSOR_EXPIRY_MS, sensors_max: int = SENSORS_MAX) -> None:
        self.window_num = window_num
        self.window_ms = window_size_s * 1000.0
        self.expiry_ms = expiry_ms
        self.sensors_max = sensors_max
        self._sensors: OrderedDict[tuple[str, str, str], _Sensor] = OrderedDict()

    @property
    def sensor_count(self) -> int:
        return len(self._sensors)

    def record(self, index: Mapping[QuotaEntity, Mapping[str, float]], key: str, user: str,
               client_id: str, value: float, now_ms: float) -> int:
        """Records ``value`` against the quota on ``key`` that applies to ``user`` and
        ``client_id`` (nothing without one) and returns the throttle time in ms (0: within
        the quota)."""
        self.expire(now_ms)
        found = resolve(index, key, user, client_id)
        if found is None:
            return 0
        (user_tag, client_tag), bound = found
        name = (key, user_tag, client_tag)
        sensor = self._sensors.get(name)
        if sensor is None:
            sensor = _Sensor(SampledRate(self.window_num, self.window_ms), now_ms)
            self._sensors[name] = sensor
            if len(self._sensors) > self.sensors_max:
                self._sensors.popitem(last=False)
        else:
            self._sensors.move_to_end(name)
        sensor.last_ms = now_ms
        sensor.rate.record(value, now_ms)
        rate = sensor.rate.measure(now_ms)
        throttle = throttle_time_ms(rate, bound, sensor.rate.window_size_ms(now_ms))
        if key == REQUEST_PERCENTAGE:
            throttle = min(throttle, int(self.window_ms))
        return throttle

    def expire(self, now_ms: float) -> None:
        """Drops the rates not recorded for ``expiry_ms`` (the least recently used first)."""
        while self._sensors:
            name, sensor = next(iter(self._sensors.items()))
            if now_ms - sensor.last_ms < self.expiry_ms:
                return
            del self._sensors[name]
