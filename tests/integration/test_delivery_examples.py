"""The delivery-semantics examples (examples/at_most_once.py, examples/at_least_once.py,
examples/exactly_once.py), each SIGKILLed midway and restarted by examples/kill_demo.py's
logic, against a real broker: at-most-once never processes a record twice (and may miss
some), at-least-once never misses one (and may process some twice), exactly-once puts each
input's result in the output topic exactly once (read_committed) although its side-effect
file may show a redone batch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.integration.conftest import BrokerProcess

RECORDS = 300
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _kill_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_demo", EXAMPLES / "kill_demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kill_demo"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_kill_midway(broker: BrokerProcess, tmp_path: Path) -> None:
    kill_demo = _kill_demo()
    outcomes = {o.strategy: o for o in kill_demo.demo(broker.bootstrap, RECORDS, tmp_path)}
    produced = {kill_demo.value(i) for i in range(RECORDS)}
    for outcome in outcomes.values():
        print(outcome.summary())
        assert set(outcome.times) <= produced
        # The kill came midway: the first run had not processed everything.
        assert 0 < outcome.killed_after < RECORDS

    at_most = outcomes["at-most-once"]
    assert at_most.more == 0, f"at-most-once processed {at_most.more} records twice"
    assert at_most.never + at_most.once == RECORDS

    at_least = outcomes["at-least-once"]
    assert at_least.never == 0, f"at-least-once never processed {at_least.never} records"
    assert at_least.once + at_least.more == RECORDS

    exactly = outcomes["exactly-once"]
    assert exactly.never == 0 and exactly.more == 0, exactly.summary()
    assert exactly.once == RECORDS and sum(exactly.times.values()) == RECORDS
    # The attempts (outside the transaction) cover every input at least once.
    assert exactly.attempts is not None and set(exactly.attempts) == produced
