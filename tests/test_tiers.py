"""tests/tiers.py's test tiers: what collection marks slow, and the guard
that fails a test not marked slow which starts a process or trains a run."""

import collections
import importlib
import os

import keras
import numpy as np
import pytest

from tests import tiers

# Test code as tests/ holds it: a process started through a helper function
# and a method of a class.
SAMPLE = """
import subprocess


def starts(args):
    return subprocess.run(args)


def through_a_helper():
    return starts(["true"])


class Cluster:
    def start(self):
        return through_a_helper()


def uses_a_class():
    return Cluster().start()


def pure():
    return len("no process")


def imports_a_starter_locally():
    from keras_lars.tools.train import runtime_jax

    return runtime_jax.start_processes


def imports_a_harmless_name_locally():
    from keras_lars.tools.train import runtime_jax

    return runtime_jax.Devices
"""


def _sample():
    namespace = {"__name__": __name__}
    path = os.path.join(tiers.TESTS, "tiers_sample.py")
    exec(compile(SAMPLE, path, "exec"), namespace)
    return namespace


def test_a_process_start_is_found_through_the_functions_and_classes_of_tests():
    sample = _sample()
    reach = tiers._Reach(tiers.process_starters())
    assert reach.find(sample["uses_a_class"]) == [
        "uses_a_class",
        "Cluster",
        "Cluster.start",
        "through_a_helper",
        "starts",
        "subprocess",
    ]
    assert reach.find(sample["pure"]) is None
    # `from package import module` inside the function, then `module.starter`
    assert reach.find(sample["imports_a_starter_locally"]) == [
        "imports_a_starter_locally",
        "start_processes",
    ]
    assert reach.find(sample["imports_a_harmless_name_locally"]) is None
    # A helper that bounds its run is not read: what it reaches does not count.
    opaque = tiers._Reach(tiers.process_starters(), opaque=[sample["through_a_helper"]])
    assert opaque.find(sample["uses_a_class"]) is None


def test_the_slow_tests_are_the_ones_that_start_a_process_or_train_a_run(request):
    items = {item.name: item for item in request.session.items}
    slow = {name for name, item in items.items() if item.get_closest_marker("slow")}
    if "test_help_lists_every_setting" in items:  # test_train_loop.py collected too
        assert "test_help_lists_every_setting" in slow  # run_tool -> subprocess
        assert items["test_help_lists_every_setting"].get_closest_marker("subprocess")
    if "test_two_replicas_train_and_evaluate_padded_batches" in items:  # test_train_flags.py
        assert "test_two_replicas_train_and_evaluate_padded_batches" in slow
        assert "test_sgd_is_momentum_sgd_with_coupled_weight_decay" not in slow
    if "test_leftovers_are_removed_and_other_data_is_refused" in items:  # ..._checkpoints.py
        assert (
            "test_a_run_in_this_process_checkpoints_each_epoch_and_ends_with_a_summary" not in slow
        )
    assert request.node.name not in slow


class _Item:
    nodeid = "tests/sample.py::test_sample"


def test_the_guard_refuses_a_process_start_and_counts_the_training(monkeypatch):
    guard = tiers._Guard(_Item())
    guard.install()
    try:
        # getattr: a call that collection does not see, as a misclassified test's.
        with pytest.raises(
            tiers.ProcessInFastTest,
            match=r"test_sample starts a process \(os.system\) but is not marked slow: it must",
        ):
            getattr(os, "system")("true")  # noqa: B009
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])  # 8 parameters
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
        model.fit(np.zeros((16, 3)), np.zeros((16, 2)), batch_size=4, epochs=2, verbose=0)
        model.train_on_batch(np.zeros((4, 3)), np.zeros((4, 2)))
    finally:
        guard.uninstall()
    assert (guard.steps, guard.work) == (9, 9 * 8)
    assert len(guard.problems()) == 1  # the process; 72 parameter-steps are few
    with monkeypatch.context() as patch:  # (this test's own guard reads FAST_WORK after it)
        patch.setattr(tiers, "FAST_WORK", 71)
        problems = guard.problems()
    assert "trains 9 steps, 72 parameter-steps (> FAST_WORK=71)" in problems[1]


# Modules whose tests are the version-dependent paths CI must run on the oldest pair.
VERSION_DEPENDENT = (
    "test_compat.py",
    "test_version_gates.py",
    "test_jax_distribution.py",
    "test_train_jax.py",
    "test_train_checkpoints.py",
    "test_train_cluster.py",
    "test_train_flags.py",
    "test_train_input.py",
    "test_train_loop.py",
    "test_train_resume.py",
    "test_train_runs.py",
    "test_launchers.py",
    "test_cluster_resolution.py",
    "test_signals.py",
    "test_elastic_resume.py",
    "test_distribute.py",
    "test_mirrored_steps.py",
    "test_xla_readiness.py",
    "test_golden.py",
    "test_lars.py",
    "test_lamb.py",
)


def test_version_independent_modules_exist_and_leave_the_version_dependent_in():
    listed = set(tiers.VERSION_INDEPENDENT)
    assert listed <= set(os.listdir(tiers.TESTS)), listed - set(os.listdir(tiers.TESTS))
    assert not listed & set(VERSION_DEPENDENT)
    assert all(len(why) > 20 for why in tiers.VERSION_INDEPENDENT.values())


def test_version_independent_is_marked_on_those_modules_only(request):
    for item in request.session.items:
        marked = item.get_closest_marker("version_independent") is not None
        name = os.path.basename(str(item.fspath))
        assert marked == (name in tiers.VERSION_INDEPENDENT), item.nodeid


def test_newest_only_in_ci_names_collected_tests_outside_the_kept_paths(request):
    collected = {
        f"{os.path.basename(str(item.fspath))}::{item.name}": item for item in request.session.items
    }
    for name in tiers.NEWEST_ONLY_IN_CI:
        if name in collected:  # a run of some modules collects only those
            item = collected[name]
            assert item.get_closest_marker("newest_only_in_ci"), name
            assert not item.get_closest_marker("multiworker"), name
    names = {name.split("::")[1] for name in tiers.NEWEST_ONLY_IN_CI}
    assert not {n for n in names if any(w in n for w in ("sigterm", "kill", "worker", "jax"))}


def test_slow_in_process_names_tests_that_exist_and_leaves_a_case_of_each_fast(request):
    collected = {
        f"{os.path.basename(str(item.fspath))}::{item.name}": item for item in request.session.items
    }
    listed = collections.Counter()
    for name, why in tiers.SLOW_IN_PROCESS.items():
        assert len(why) > 15, name
        module, test = name.split("::")
        function = getattr(
            importlib.import_module(f"tests.{module[:-3]}"), test.split("[")[0], None
        )
        assert callable(function), name  # not renamed away
        if "[" in name:
            listed[function] += 1
        if name in collected:  # not deselected (-m "not slow") and its module run
            item = collected[name]
            assert item.get_closest_marker("slow"), name
            assert ("slow", f"takes long in this process (SLOW_IN_PROCESS): {why}") in (
                item.user_properties
            )
        others = [
            other
            for other in collected
            if "[" in name
            and other.startswith(name.split("[")[0] + "[")
            and other not in tiers.SLOW_IN_PROCESS
        ]
        assert all(not collected[other].get_closest_marker("slow") for other in others), name
    for function, count in listed.items():  # a parametrized test keeps a case in the fast tier
        cases = [mark for mark in function.pytestmark if mark.name == "parametrize"]
        assert count < len(cases[0].args[1]), function.__name__


class _UnitItem:
    """What tiers._work_unit reads of a test item."""

    def __init__(self, module, fixturenames=(), multiworker=False):
        self.fspath, self.fixturenames = os.path.join(tiers.TESTS, module), list(fixturenames)
        self.multiworker = multiworker

    def get_closest_marker(self, name):
        return object() if name == "multiworker" and self.multiworker else None


def test_the_tests_that_run_several_processes_share_one_work_unit():
    several = "several_processes"
    assert tiers._work_unit(_UnitItem("test_train_cluster.py", multiworker=True)) == several
    assert tiers._work_unit(_UnitItem("test_train_runs.py", ["tmp_path"])) == "test_train_runs.py"
    assert tiers._work_unit(_UnitItem("test_launchers.py")) == several
    assert tiers._work_unit(_UnitItem("test_train_jax.py", ["runs", "tmp_path"])) == several
    assert tiers._work_unit(_UnitItem("test_train_jax.py", ["tmp_path"])) == "test_train_jax.py"
    # Each fixture named there exists in its module (a rename would let its
    # runs leave the unit).
    for module, fixtures in tiers.SEVERAL_PROCESSES.items():
        tests = importlib.import_module(f"tests.{module.removesuffix('.py')}")
        for name in fixtures or ():
            assert callable(getattr(tests, name, None)), (module, name)


def test_a_run_whose_tests_xdist_did_not_group_is_stopped_in_one_line():
    grouped = ["tests/test_a.py::test_b@test_a.py", "tests/test_c.py::test_d[x@y]@several"]
    assert tiers.ungrouped(grouped) is None
    for node_id in ("tests/test_a.py::test_b", "tests/test_c.py::test_d[x@y]"):
        line = tiers.ungrouped([*grouped, node_id])
        assert line.startswith(f"--dist loadgroup: {node_id} carries no @group: pytest-xdist ")
        assert line.endswith(f"pytest {pytest.__version__} (pytest-xdist#1386): install pytest<9.2")
