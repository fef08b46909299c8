"""Test-session setup: quiet TensorFlow, two logical CPU devices, and the hooks
of the test tiers.

Two logical CPUs let MirroredStrategy tests run two replicas on one machine;
they must be configured before TensorFlow initialises its devices. Every
process that collects or runs tests does that in pytest_configure; xdist's
controller, which only hands tests to its workers, never imports TensorFlow
(its ~6 s came before any worker started).

The tiers (CONTRIBUTING.md, "Tests": which tests are `slow`, the guard of the
fast tier, what CI's oldest-pair stage leaves out, xdist's units of work) are
tests/tiers.py; the hooks below call it.
"""

import atexit
import gc
import importlib.util
import os
import shutil
import sys
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _set_up_tensorflow():
    """Two logical CPUs, and distinct collective keys: several test files
    build their own MirroredStrategy; without them each one reuses the first
    one's collective keys and fails with "Shape mismatch in the collective
    instance" once the models differ (tensorflow#62790)."""
    import tensorflow as tf

    from keras_lars import compat

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
    compat.apply(["distinct_collective_keys"])


# The JAX processes the tests start (tests/test_train_jax.jax_env) share one
# XLA compilation cache, made once per test session (xdist's workers inherit
# the variable): a process that compiles a step another one compiled loads it
# instead (measured 2026-12-03: a 12-step run on 4 devices, 47 s fresh, 26 s
# from the cache). The same executable computes the same bits.
if "KERAS_LARS_TEST_JAX_CACHE" not in os.environ:
    os.environ["KERAS_LARS_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="keras_lars_jax_cache_")
    atexit.register(shutil.rmtree, os.environ["KERAS_LARS_TEST_JAX_CACHE"], True)

# The JAX-backend tests need the `jax` extra, installed with TensorFlow in one
# pip command (setup.cfg says why); noxfile.py installs it for every pair.
requires_jax = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None,
    reason="jax is not installed: pip install it in one command with your TensorFlow "
    "(the `jax` extra), so that the resolver picks a jax that fits it",
)

from tests import tiers  # after the setup above: it imports the tools
from tests import timing

_TIMING_LINES = pytest.StashKey()
_timing = None  # timing.Timing on the controller (or the only process)


def pytest_addoption(parser):
    parser.addoption(
        "--timing-report",
        metavar="FILE",
        help="write the run's durations (per module, fixture and test) as Markdown "
        "(tests/timing.py; the committed one is tests/durations.md)",
    )


@pytest.hookimpl(trylast=True)  # after xdist's, which registers its controller's session
def pytest_configure(config):
    tiers.unordered_units(config)
    global _timing
    if not hasattr(config, "workerinput"):  # the controller, or the only process
        _timing = timing.Timing()
    if not config.pluginmanager.hasplugin("dsession"):  # not xdist's controller
        _set_up_tensorflow()


def pytest_ignore_collect(collection_path, config):
    """`-m smoke` collects only the smoke tier's modules (tiers.SMOKE): importing
    every other module would take most of its minute."""
    if config.getoption("markexpr") == "smoke" and collection_path.suffix == ".py":
        return collection_path.name.startswith("test_") and collection_path.name not in tiers.SMOKE
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects, and before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    tiers.classify(items, requires_jax)


def pytest_collection_finish(session):
    """Moves every object alive after collection (TensorFlow's, Keras's, JAX's
    and the tools' modules: some 460,000 after the imports alone) into the
    collector's permanent generation: each later collection (Keras's
    clear_session runs one; the study runs one a cell) skips them, 0.05 s
    instead of 0.26 after a fit of ResNet-20 in a fresh process, and more in a
    worker whose heap grew. Modules and classes live as long as the process."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(optionalhook=True)  # xdist's, on the controller
def pytest_xdist_node_collection_finished(node, ids):
    """Under `--dist loadgroup`, stop unless xdist put each test in its unit:
    see tiers.ungrouped."""
    if node.config.getoption("dist") == "loadgroup":
        line = tiers.ungrouped(ids)
        if line:
            pytest.exit(line, returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    return (yield from timing.fixture_timed(fixturedef, request))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from timing.cpu_teardown(item))


def pytest_runtest_logreport(report):
    if _timing is not None:
        _timing.record(report)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """The timing summary (tests/timing.py); a test far past the 20-second
    rule and not listed in tiers.LONG_TESTS fails the run."""
    if _timing is None:
        return
    lines, too_long = timing.finish(_timing, session.config, tiers.LONG_TESTS)
    for nodeid, spent in too_long:
        lines.append(
            f"timing: FAILED: {nodeid} took {spent:.0f} s, past the cap of "
            f"{timing.UNLISTED_FAIL_SECONDS:.0f} s for a test not in LONG_TESTS"
        )
    session.config.stash[_TIMING_LINES] = lines
    if too_long and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    lines = terminalreporter.config.stash.get(_TIMING_LINES, [])
    if lines:
        terminalreporter.section("timing")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    timing.cpu_begins(item)
    return (yield from tiers.guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from tiers.guarded(item))


@pytest.fixture(autouse=True)
def compat_left_as_found():
    """Removes the keras_lars.compat workarounds a test installed (e.g.
    through keras_lars.make_strategy("mirrored")), so that no test runs on
    patches an earlier one left: a test's outcome must not depend on the
    order (one did: iterations_after_data broke jit-compiled steps)."""
    from keras_lars import compat

    before = compat.applied()
    yield
    compat.unapply([name for name in compat.applied() if name not in before])


@pytest.fixture
def restore_compat():
    """Leaves keras_lars.compat as the test found it (test_compat.py and
    test_version_gates.py install every workaround on top of it)."""
    from keras_lars import compat

    before = compat.applied()
    yield
    compat.unapply([name for name in compat.applied() if name not in before])
    compat.apply(before)
