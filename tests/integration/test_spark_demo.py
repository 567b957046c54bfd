"""The demo pipeline (`make demo`, spark_connector/demo.py), run small against a real node with
the shared local[2] SparkSession, so that it cannot break silently; and its output check."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector tests need pyspark (the [spark] extra)")
pytest.importorskip("matplotlib", reason="the demo's plot needs matplotlib (the [spark] extra)")

from pyspark.sql import SparkSession

from spark_connector.demo import WINDOW_MS, DemoSettings, run_pipeline, verify
from tests.integration.conftest import BrokerProcess
from tests.integration.spark_support import spark_session


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """The one SparkSession of the pytest run (shared with the other test_spark_* modules)."""
    return spark_session()


def test_the_pipeline_counts_every_view_once(spark: SparkSession, broker: BrokerProcess,
                                             tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    settings = DemoSettings(events=3_000, generate_s=6.0, event_span_s=180.0,
                            replication_factor=1, trigger_s=1.0, refresh_s=2.0,
                            catch_up_timeout_s=90.0)
    plot = tmp_path / "views.png"
    result = run_pipeline(spark, broker.bootstrap, settings, tmp_path, plot)
    assert result.problems == []
    assert sum(result.expected.values()) == 3_000
    assert len({window for window, _ in result.expected}) == 3  # 180 s of event time
    assert result.latest == result.expected
    assert result.output_records == len(result.expected)  # each (window, page) once
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "page" in table and "views" in table and "/docs" in table


def test_the_output_check_finds_duplicates_gaps_and_wrong_counts() -> None:
    expected = {(0, "/"): 5, (0, "/docs"): 2, (WINDOW_MS, "/"): 4}
    assert verify(expected, {(0, "/"): [5], (0, "/docs"): [2], (WINDOW_MS, "/"): [4]}) == []
    problems = verify(expected, {(0, "/"): [5, 5], (0, "/docs"): [3]})
    assert len(problems) == 3
    assert any("written 2 times" in p for p in problems)
    assert any("3 views in pageview-counts, 2 generated" in p for p in problems)
    assert any("missing from pageview-counts (4 generated)" in p for p in problems)
