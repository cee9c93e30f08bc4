"""The benchmark's short cases run several times (``bench/run.py``): the row
reported is the median run by the case's figure, and it lists every run."""

from __future__ import annotations

import pytest

run = pytest.importorskip("bench.run")


def _fanout(rate: float, seconds: float) -> dict[str, object]:
    return {"tasks_per_s": rate, "seconds": seconds}


def test_the_median_fan_out_run_is_reported_with_every_run() -> None:
    case = run.Case("postgres", 4, "fanout", 1_000)
    rows = [_fanout(2_400.0, 0.42), _fanout(1_900.0, 0.53), _fanout(2_100.0, 0.48)]
    chosen = run.median_run(case, rows)
    assert chosen["tasks_per_s"] == 2_100.0
    assert chosen["seconds"] == 0.48  # the whole row of that run
    assert chosen["repeats"] == [2_400.0, 1_900.0, 2_100.0]  # in the order they ran


def test_a_chain_is_ranked_by_its_mean_hop_and_an_even_count_reports_the_slower() -> None:
    case = run.Case("sqlite", 1, "chain", 200)
    rows = [{"hop_mean_ms": ms} for ms in (0.9, 0.8, 1.1, 0.85)]
    assert run.median_run(case, rows)["hop_mean_ms"] == 0.9
    fanout = run.Case("sqlite", 2, "fanout", 1_000)
    assert (
        run.median_run(fanout, [_fanout(6_000.0, 0.2), _fanout(5_000.0, 0.2)])["tasks_per_s"]
        == 5_000.0
    )


def test_only_the_short_cases_repeat() -> None:
    assert run.repeats_of(run.Case("sqlite", 1, "fanout", 1_000), 3) == 3
    assert run.repeats_of(run.Case("sqlite", 1, "chain", 200), 3) == 3
    assert run.repeats_of(run.Case("sqlite", 1, "fanout", 10_000), 3) == 1
    assert run.repeats_of(run.Case("sqlite", 1, "many", 1_000), 3) == 1
    assert run.repeats_of(run.Case("sqlite", 1, "fanout", 1_000), 0) == 1
    single = {"tasks_per_s": 1.0}
    assert run.median_run(run.Case("sqlite", 1, "many", 1_000), [single]) is single


def test_the_targets_are_the_issues_own() -> None:
    """W1 on SQLite has a goal with two workers only: the one-worker row is a
    reference, and the table must not print it as a missed target."""
    cases = [run.Case("sqlite", workers, "fanout", 1_000) for workers in (1, 2)]
    results: dict[object, dict[str, object]] = {case: _fanout(4_000.0, 0.25) for case in cases}
    names = [goal["target"] for goal in run.targets(results, {"W1": cases})]
    assert names == ["W1 sqlite 2w tasks/s >="]
