"""Suite-wide test settings.

Hypothesis's per-example deadline (200 ms) is a timing assertion: on a busy machine an
ordinary example of a pure-core property test took 245 ms and failed the suite
(``test_placement_properties``, with a fault campaign running beside it). The properties are
about results, not speed, so no example has a deadline here; slow code shows up in the
benchmarks and in ``--durations``.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("raftlog", deadline=None)
settings.load_profile("raftlog")
