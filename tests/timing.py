"""Where the suite's time goes: each test's worker seconds (setup + call +
teardown, as pytest measures them) and each fixture's setup seconds, summed
on the controller under xdist, printed at the end of a run and written as a
table with `--timing-report=FILE` (tests/durations.md is the committed one:
CONTRIBUTING, "Tests").

Worker time is what a test costs a process; wall time is the run's elapsed
time, about the worker time over the processes when the units of work
balance. CPU time is what a test costs the machine: the user and system
seconds of its worker (its threads too) and of the child processes it
started and waited for (getrusage's RUSAGE_SELF and RUSAGE_CHILDREN), from
its setup's start to its teardown's end. Worker seconds grow when tests run
side by side on fewer cores than they use; CPU seconds do not, so they say
where cutting pays (a test that waits on a timeout costs worker time and no
CPU; one that runs two processes at once, twice its worker time). A
fixture's seconds are counted once, in the test whose setup ran it (a
module-scoped fixture: the module's first test).

tests/conftest.py's hooks call this module: `fixture_timed` around each
fixture's setup (in the process that runs the test), `record` for each report
and `summary` at the end (on the controller).

The 20-second rule (tests/tiers.py's LONG_TESTS): a test over
LONG_TEST_SECONDS of worker time is listed there with its reason; the
summary names every one that is not, with its CPU seconds. It fails the run
only past UNLISTED_FAIL_SECONDS, a generous cap (the machines are shared and
noisy, and a test's speed is not a test of the code), and only where its CPU
seconds pass LONG_TEST_SECONDS too: a test long in worker seconds alone
waited, or ran starved beside another worker's processes (seen: 0.22 s
alone, 39.5 s in the suite; 1 s alone, 61.6 s), which is not its doing.
"""

import collections
import datetime
import importlib.metadata
import os
import platform
import re
import resource
import time

LONG_TEST_SECONDS = 20.0
UNLISTED_FAIL_SECONDS = 90.0
# A summary is printed after runs of at least this many tests (a module or
# two run between edits prints nothing).
SUMMARY_FROM_TESTS = 100
TOP = 15
_PROPERTY = "fixture_seconds"
_CPU_PROPERTY = "cpu_seconds"


class Timing:
    """The run's reports, summed per test, module and fixture."""

    def __init__(self):
        self.started = time.monotonic()
        self.tests = collections.defaultdict(float)  # nodeid -> seconds (all phases)
        self.workers = {}  # nodeid -> the xdist worker that ran it
        self.fixtures = collections.defaultdict(float)  # (module, fixture, scope) -> seconds
        self.cpu = collections.defaultdict(float)  # nodeid -> CPU seconds (worker + children)
        self.outcomes = collections.Counter()

    def record(self, report):
        """Adds one phase's report (pytest_runtest_logreport)."""
        self.tests[report.nodeid] += report.duration
        node = getattr(report, "node", None)
        gateway = getattr(node, "gateway", None)
        self.workers[report.nodeid] = getattr(gateway, "id", "main")
        if report.when == "teardown":  # the properties of every phase are there
            module = _module(report.nodeid)
            for name, value in report.user_properties:
                if name == _PROPERTY:
                    fixture, scope, seconds = value
                    self.fixtures[(module, fixture, scope)] += seconds
                elif name == _CPU_PROPERTY:
                    self.cpu[report.nodeid] += value
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.outcome] += 1

    def modules(self):
        """{module: (worker seconds, tests)}, the longest first."""
        seconds, counts = collections.defaultdict(float), collections.Counter()
        for nodeid, spent in self.tests.items():
            seconds[_module(nodeid)] += spent
            counts[_module(nodeid)] += 1
        order = sorted(seconds, key=seconds.get, reverse=True)
        return {module: (seconds[module], counts[module]) for module in order}

    def module_cpu(self):
        """{module: CPU seconds}."""
        seconds = collections.defaultdict(float)
        for nodeid, spent in self.cpu.items():
            seconds[_module(nodeid)] += spent
        return seconds

    def longest(self, count=None):
        """[(nodeid, seconds)], the longest first."""
        ranked = sorted(self.tests.items(), key=lambda pair: pair[1], reverse=True)
        return ranked[:count] if count else ranked

    def unlisted(self, listed):
        """[(nodeid, seconds)] over LONG_TEST_SECONDS that no pattern of
        `listed` (tests/tiers.py's LONG_TESTS keys: `module.py::test[parameters]`
        where `*` matches any text) covers."""
        return [
            (nodeid, spent)
            for nodeid, spent in self.longest()
            if spent > LONG_TEST_SECONDS and not _listed(nodeid, listed)
        ]

    def cpu_bound(self, nodeid):
        """Whether the test's CPU seconds pass LONG_TEST_SECONDS (True where
        none were recorded: then its worker seconds decide)."""
        spent = self.cpu.get(nodeid)
        return spent is None or spent > LONG_TEST_SECONDS

    def lines(self, wall, listed, top=TOP):
        """The end-of-run summary's lines."""
        worker = sum(self.tests.values())
        found = [
            f"timing: {len(self.tests)} tests, {worker:.0f} s of worker time, "
            f"{sum(self.cpu.values()):.0f} s of CPU (workers and their child processes), "
            f"{wall:.0f} s wall ({_processes(len(set(self.workers.values())))})",
            f"timing: the {top} longest tests (worker seconds, all phases):",
        ]
        found += [f"  {spent:7.1f}  {nodeid}" for nodeid, spent in self.longest(top)]
        found.append(f"timing: the {top} longest modules (worker seconds, tests):")
        for module, (spent, count) in list(self.modules().items())[:top]:
            found.append(f"  {spent:7.1f}  {module} ({count})")
        fixtures = sorted(self.fixtures.items(), key=lambda pair: pair[1], reverse=True)
        found.append(f"timing: the {min(top, 10)} longest fixtures (setup seconds):")
        for (module, fixture, scope), spent in fixtures[: min(top, 10)]:
            found.append(f"  {spent:7.1f}  {module}::{fixture} ({scope})")
        for nodeid, spent in self.unlisted(listed):
            cpu = self.cpu.get(nodeid)
            cpu = "" if cpu is None else f", {cpu:.1f} s of CPU"
            found.append(
                f"timing: {nodeid} took {spent:.1f} s (> {LONG_TEST_SECONDS:.0f} s{cpu}) and is "
                "not in tests/tiers.py's LONG_TESTS: make it shorter, or list it there with its "
                "reason"
            )
        return found

    def table(self, wall, command):
        """The Markdown report of `--timing-report`."""
        worker = sum(self.tests.values())
        out = [
            "# Test durations",
            "",
            "Made by `python -m pytest -q -n 2 --dist loadgroup --timing-report=tests/durations.md`"
            " (tests/timing.py); compare yours with it.",
            "",
            f"- command: `{command}`",
            f"- date: {datetime.date.today().isoformat()}; Python {platform.python_version()}, "
            f"{_versions()}; {os.cpu_count()} CPUs",
            f"- {len(self.tests)} tests ({_outcomes(self.outcomes)}): "
            f"{worker:.0f} s of worker time, {sum(self.cpu.values()):.0f} s of CPU (workers "
            f"and their child processes), {wall:.0f} s wall",
            "",
            "## Modules",
            "",
            "| module | tests | worker s | share | CPU s |",
            "|---|---:|---:|---:|---:|",
        ]
        cpu = self.module_cpu()
        for module, (spent, count) in self.modules().items():
            out.append(
                f"| {module} | {count} | {spent:.1f} | {100 * spent / worker:.1f}% "
                f"| {cpu[module]:.1f} |"
            )
        out += ["", "## Fixtures (setup seconds)", "", "| fixture | scope | s |", "|---|---|---:|"]
        fixtures = sorted(self.fixtures.items(), key=lambda pair: pair[1], reverse=True)
        for (module, fixture, scope), spent in fixtures:
            if spent >= 1.0:
                out.append(f"| {module}::{fixture} | {scope} | {spent:.1f} |")
        out += [
            "",
            "## Tests over 5 s (worker seconds, all phases)",
            "",
            "| test | s | CPU s |",
            "|---|---:|---:|",
        ]
        out += [
            f"| {nodeid} | {spent:.1f} | {self.cpu[nodeid]:.1f} |"
            for nodeid, spent in self.longest()
            if spent > 5
        ]
        return "\n".join(out) + "\n"


def _processes(count):
    return f"{count} process" + ("es" if count != 1 else "")


def _module(nodeid):
    return nodeid.split("::")[0].split("@")[0].rsplit("/", 1)[-1]


def _short(nodeid):
    """`module.py::test[params]` of a node id (folder and xdist group dropped)."""
    path, _, rest = nodeid.partition("::")
    return f"{path.rsplit('/', 1)[-1]}::{rest.rsplit('@', 1)[0] if '@' in rest else rest}"


def _listed(nodeid, listed):
    """Whether a pattern of `listed` matches `nodeid`: `*` matches any text,
    everything else itself (brackets too: they hold the parameters)."""
    short = _short(nodeid)
    return any(re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), short) for pattern in listed)


def _outcomes(counts):
    return ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))


def _versions():
    """'tensorflow 2.21.0, keras 3.15.1, jax 0.10.2': the installed versions
    (read from the packages' metadata: xdist's controller imports none)."""
    distributions = importlib.metadata.packages_distributions()
    found = []
    for name in ("tensorflow", "keras", "jax"):
        for distribution in distributions.get(name, [])[:1]:
            found.append(f"{name} {importlib.metadata.version(distribution)}")
    return ", ".join(found)


def fixture_timed(fixturedef, request):
    """Wraps a fixture's setup (pytest_fixture_setup) and records its seconds
    on the test being set up."""
    begun = time.monotonic()
    try:
        return (yield)
    finally:
        item = getattr(request, "_pyfuncitem", None)
        if item is not None:
            spent = time.monotonic() - begun
            item.user_properties.append((_PROPERTY, (fixturedef.argname, fixturedef.scope, spent)))


def cpu_seconds():
    """User + system seconds of this process and its waited-for children."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPU_AT_SETUP = "_timing_cpu_at_setup"


def cpu_begins(item):
    """At a test's setup (pytest_runtest_setup): notes the CPU seconds so far."""
    setattr(item, _CPU_AT_SETUP, cpu_seconds())


def cpu_teardown(item):
    """Wraps a test's teardown (pytest_runtest_teardown): records its CPU
    seconds since its setup began on the test, which its teardown report
    carries."""
    try:
        return (yield)
    finally:
        begun = getattr(item, _CPU_AT_SETUP, None)
        if begun is not None:
            item.user_properties.append((_CPU_PROPERTY, cpu_seconds() - begun))


def finish(timing, config, listed):
    """At the end of a run (on the controller): writes --timing-report and
    returns (the summary's lines, the tests past UNLISTED_FAIL_SECONDS that
    LONG_TESTS does not list). No lines after a run of a few tests."""
    wall = time.monotonic() - timing.started
    report = config.getoption("timing_report")
    if report:
        command = " ".join(["python -m pytest", *config.invocation_params.args])
        with open(report, "w") as f:
            f.write(timing.table(wall, command))
    if len(timing.tests) < SUMMARY_FROM_TESTS and not report:
        return [], []
    too_long = [
        (nodeid, spent)
        for nodeid, spent in timing.unlisted(listed)
        if spent > UNLISTED_FAIL_SECONDS and timing.cpu_bound(nodeid)
    ]
    return timing.lines(wall, listed), too_long
