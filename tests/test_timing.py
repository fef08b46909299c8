"""tests/timing.py: the suite's durations summed per test, module and
fixture from the reports pytest (or xdist's controller) sees, and the
20-second rule against tests/tiers.py's LONG_TESTS."""

import subprocess
import sys
import time
import types

import keras
import pytest
import tensorflow as tf

from tests import tiers
from tests import timing


def _report(nodeid, when, duration, worker="gw0", outcome="passed", properties=()):
    return types.SimpleNamespace(
        nodeid=nodeid,
        when=when,
        duration=duration,
        outcome=outcome,
        user_properties=list(properties),
        node=types.SimpleNamespace(gateway=types.SimpleNamespace(id=worker)),
    )


def _timed(*tests):
    """A Timing fed each (nodeid, setup, call, teardown, fixtures, worker)."""
    found = timing.Timing()
    for nodeid, setup, call, teardown, fixtures, worker in tests:
        properties = [("fixture_seconds", fixture) for fixture in fixtures]
        found.record(_report(nodeid, "setup", setup, worker, properties=properties[:1]))
        found.record(_report(nodeid, "call", call, worker, properties=properties[:1]))
        found.record(_report(nodeid, "teardown", teardown, worker, properties=properties))
    return found


RUNS = "tests/test_a.py::test_runs@test_a.py"
SHORT = "tests/test_a.py::test_short[1]@test_a.py"
OTHER = "tests/test_b.py::test_other@several_processes"
TIMED = _timed(
    (RUNS, 30.0, 2.5, 0.5, [("runs", "module", 29.0), ("tmp_path", "function", 0.25)], "gw0"),
    (SHORT, 0.0, 0.75, 0.25, [("tmp_path", "function", 0.125)], "gw0"),
    (OTHER, 1.0, 24.0, 0.0, [], "gw1"),
)


def test_each_test_is_its_phases_summed_and_each_module_its_tests():
    assert dict(TIMED.tests) == {RUNS: 33.0, SHORT: 1.0, OTHER: 25.0}
    assert TIMED.longest(2) == [(RUNS, 33.0), (OTHER, 25.0)]
    assert TIMED.modules() == {"test_a.py": (34.0, 2), "test_b.py": (25.0, 1)}
    assert TIMED.outcomes == {"passed": 3}


def test_a_fixture_counts_once_from_the_teardown_report_of_its_test():
    assert dict(TIMED.fixtures) == {
        ("test_a.py", "runs", "module"): 29.0,
        ("test_a.py", "tmp_path", "function"): 0.375,
    }


def test_a_failed_phase_counts_its_outcome():
    found = timing.Timing()
    found.record(_report(RUNS, "setup", 1.0, outcome="failed"))
    found.record(_report(RUNS, "teardown", 0.5))
    assert found.outcomes == {"failed": 1} and found.tests[RUNS] == 1.5


@pytest.mark.parametrize(
    "listed, unlisted",
    [
        ({}, [RUNS, OTHER]),
        ({"test_a.py::test_runs": "why"}, [OTHER]),
        ({"test_b.py::*": "why", "test_a.py::test_run*": "why"}, []),
        ({"test_a.py::test_runs[*]": "a parameter that is not there"}, [RUNS, OTHER]),
    ],
)
def test_tests_over_20_seconds_are_named_unless_a_pattern_lists_them(listed, unlisted):
    assert [nodeid for nodeid, _ in TIMED.unlisted(listed)] == unlisted


def test_a_parametrized_test_is_matched_with_its_parameters_and_without_its_group():
    found = _timed(("tests/test_c.py::test_p[jax-8]@several_processes", 0, 21.0, 0, [], "gw0"))
    assert found.unlisted({"test_c.py::test_p[jax-*]": "why"}) == []
    assert len(found.unlisted({"test_c.py::test_p[tf-*]": "why"})) == 1


def test_the_summary_names_totals_the_longest_and_the_unlisted():
    lines = TIMED.lines(wall=40.0, listed={"test_b.py::*": "why"}, top=2)
    assert lines[0] == (
        "timing: 3 tests, 59 s of worker time, 0 s of CPU (workers and their child processes), "
        "40 s wall (2 processes)"
    )
    assert lines[1:4] == [
        "timing: the 2 longest tests (worker seconds, all phases):",
        f"     33.0  {RUNS}",
        f"     25.0  {OTHER}",
    ]
    assert "     34.0  test_a.py (2)" in lines
    assert "     29.0  test_a.py::runs (module)" in lines
    assert lines[-1] == (
        f"timing: {RUNS} took 33.0 s (> 20 s) and is not in tests/tiers.py's LONG_TESTS: "
        "make it shorter, or list it there with its reason"
    )


def test_the_report_table_lists_every_module_and_the_long_tests():
    table = TIMED.table(wall=40.0, command="python -m pytest -n 2")
    assert (
        "- 3 tests (3 passed): 59 s of worker time, 0 s of CPU (workers and their child " in table
    )
    assert "| test_a.py | 2 | 34.0 | 57.6% | 0.0 |" in table
    assert "| test_b.py | 1 | 25.0 | 42.4% | 0.0 |" in table
    assert "| test_a.py::runs | module | 29.0 |" in table
    # The versions installed, which xdist's controller reads without importing them.
    assert f"tensorflow {tf.__version__}, keras {keras.__version__}" in table
    assert "tmp_path" not in table  # fixtures under a second are left out
    assert f"| {SHORT} |" not in table  # tests under 5 s too


def test_a_short_run_prints_nothing_and_only_far_past_the_cap_fails():
    config = types.SimpleNamespace(getoption=lambda name: None)
    assert timing.finish(TIMED, config, {}) == ([], [])
    many = timing.Timing()
    for index in range(timing.SUMMARY_FROM_TESTS):
        many.record(_report(f"tests/test_d.py::test_{index}", "teardown", 0.5))
    many.record(_report("tests/test_d.py::test_long", "teardown", 100.0))
    many.record(_report("tests/test_d.py::test_listed", "teardown", 500.0))
    # Past the cap in worker seconds and in CPU seconds: fails.
    cpu = [("cpu_seconds", 95.0)]
    many.record(_report("tests/test_d.py::test_busy", "teardown", 100.0, properties=cpu))
    # Past the cap in worker seconds only (starved, or waiting): named with its CPU, not failed.
    cpu = [("cpu_seconds", 1.5)]
    many.record(_report("tests/test_d.py::test_starved", "teardown", 120.0, properties=cpu))
    lines, too_long = timing.finish(many, config, {"test_d.py::test_listed": "why"})
    long, busy = "tests/test_d.py::test_long", "tests/test_d.py::test_busy"
    assert too_long == [(long, 100.0), (busy, 100.0)]
    assert (
        "timing: tests/test_d.py::test_starved took 120.0 s (> 20 s, 1.5 s of CPU) and is not "
        "in tests/tiers.py's LONG_TESTS: make it shorter, or list it there with its reason"
    ) in lines


def test_a_fixtures_setup_seconds_go_to_the_test_that_ran_it():
    item = types.SimpleNamespace(user_properties=[])
    request = types.SimpleNamespace(_pyfuncitem=item)
    fixturedef = types.SimpleNamespace(argname="runs", scope="module")
    wrapper = timing.fixture_timed(fixturedef, request)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(None)
    [(name, (fixture, scope, seconds))] = item.user_properties
    assert (name, fixture, scope) == ("fixture_seconds", "runs", "module") and seconds >= 0


def test_a_tests_cpu_seconds_come_from_its_teardown_report_per_test_and_module():
    found = timing.Timing()
    for nodeid, cpu in ((RUNS, 61.5), (SHORT, 0.5), (OTHER, 0.25)):
        found.record(_report(nodeid, "setup", 1.0, properties=[("cpu_seconds", 99.0)]))
        found.record(_report(nodeid, "call", 1.0))
        found.record(_report(nodeid, "teardown", 0.0, properties=[("cpu_seconds", cpu)]))
    assert dict(found.cpu) == {RUNS: 61.5, SHORT: 0.5, OTHER: 0.25}  # the setup's not counted
    assert dict(found.module_cpu()) == {"test_a.py": 62.0, "test_b.py": 0.25}
    table = found.table(wall=4.0, command="python -m pytest")
    assert "- 3 tests (3 passed): 6 s of worker time, 62 s of CPU (workers and their " in table
    assert "| test_a.py | 2 | 4.0 | 66.7% | 62.0 |" in table
    assert found.lines(wall=4.0, listed={})[0] == (
        "timing: 3 tests, 6 s of worker time, 62 s of CPU (workers and their child processes), "
        "4 s wall (1 process)"
    )


def test_a_tests_cpu_seconds_hold_its_child_processes_and_its_own(tmp_path):
    """The teardown wrapper records at least what a child it waited for says
    it spent (its own process_time) plus what this process spent meanwhile."""
    item = types.SimpleNamespace(user_properties=[])
    timing.cpu_begins(item)
    child = subprocess.run(
        [sys.executable, "-c", BURN],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    own = time.process_time()
    sum(range(2_000_000))
    own = time.process_time() - own
    wrapper = timing.cpu_teardown(item)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(None)
    [(name, seconds)] = item.user_properties
    assert name == "cpu_seconds" and seconds >= float(child.stdout) + own


# A child that spends 0.2 s of CPU and prints how much it spent.
BURN = (
    "import time\n"
    "while time.process_time() < 0.2:\n"
    "    sum(range(10000))\n"
    "print(time.process_time())\n"
)


def test_every_long_test_listed_names_a_module_and_gives_a_reason():
    for pattern, reason in tiers.LONG_TESTS.items():
        assert pattern.split("::")[0].startswith("test_") and "::" in pattern, pattern
        assert isinstance(reason, str) and len(reason) > 20, pattern
