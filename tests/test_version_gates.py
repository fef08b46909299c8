"""When keras_lars.compat installs a workaround, and when keras_lars imports at
all: each needed workaround's target has the shape its patch was written for,
inside its verified versions; outside them, or on a changed target, nothing is
patched and the feature that needs it refuses in one line; a workaround whose
symptom is absent is not installed, behaviour changes can be left out, each
install is logged once, and the registry's table lists them all; each
workaround is the module named after it; a wrong environment is one
ImportError, at the Keras floor of setup.cfg. Each workaround at work is
tests/test_compat.py."""

import json
import logging
import os
import re
import subprocess
import sys
import warnings

import keras
import pytest
import tensorflow as tf

import keras_lars
from keras_lars import compat
from keras_lars.compat import _registry
from tests.compat_models import CPUS
from tests.compat_models import bn_model


@pytest.fixture
def restore_compat(restore_compat):
    """Installs every workaround; conftest.py's fixture of this name leaves
    keras_lars.compat as found."""
    compat.apply()


# --- version and shape gates -------------------------------------------------
def test_every_workaround_is_verified_for_the_installed_versions():
    """Runs on every pair of the matrix: each needed workaround's target has
    the shape its patch was written for, inside its verified versions."""
    for workaround in compat.WORKAROUNDS:
        if workaround.needed():
            assert workaround.problem() is None, (workaround.name, workaround.problem())
    fixed = [w.name for w in compat.WORKAROUNDS if w.fixed_in is not None]
    assert fixed == ["distributed_datasets_from_function", "on_read_metric_variables"]
    assert all(w.needed() for w in compat.WORKAROUNDS if w.fixed_in is None)


@pytest.fixture
def fresh_compat(monkeypatch, restore_compat):
    """Keras's own code, and no memory of earlier warnings or logs."""
    with compat.unpatched():
        monkeypatch.setattr(_registry, "_UNAVAILABLE", {})
        monkeypatch.setattr(_registry, "_LOGGED", set())
        yield


def _replace(monkeypatch, name, **changes):
    import dataclasses

    workarounds = tuple(
        dataclasses.replace(w, **changes) if w.name == name else w for w in compat.WORKAROUNDS
    )
    monkeypatch.setattr(_registry, "WORKAROUNDS", workarounds)
    monkeypatch.setattr(_registry, "_BY_NAME", {w.name: w for w in workarounds})


def test_outside_the_verified_versions_nothing_is_patched(monkeypatch, fresh_compat):
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    original = TensorFlowTrainer._make_function
    _replace(monkeypatch, "steps_per_execution_loop", verified=((3, 0), (3, 1)))
    with pytest.warns(
        compat.CompatWarning,
        match=r"not installing `steps_per_execution_loop` \(keras#19246\): "
        rf"Keras {keras.__version__} is outside the versions it was "
        r"verified on \(3\.0 to 3\.1\)",
    ):
        installed = compat.apply()
    assert "steps_per_execution_loop" not in installed
    assert "symbolic_build_batch" in installed  # the others still are
    assert TensorFlowTrainer._make_function is original
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        compat.apply()
    with pytest.raises(
        compat.UnsupportedVersionError,
        match=r"^--steps_per_execution=4 under 2 replicas needs keras_lars\.compat's "
        r"`steps_per_execution_loop` workaround \(keras#19246\), which cannot "
        r"be installed here: Keras .* Use Keras 3\.0 to 3\.1\.$",
    ):
        compat.require("steps_per_execution_loop", "--steps_per_execution=4 under 2 replicas")


def test_a_changed_target_is_not_patched_and_the_feature_refuses(monkeypatch, fresh_compat):
    """A Keras whose _maybe_symbolic_build has another signature: no patch,
    and make_strategy("multi_worker") refuses before building anything."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    def changed(self, iterator=None, data_batch=None, extra=None):
        raise AssertionError("never called")

    monkeypatch.setattr(TensorFlowTrainer, "_maybe_symbolic_build", changed)
    workaround = _registry._BY_NAME["symbolic_build_batch"]
    assert workaround.problem() == (
        f"its target changed in Keras {keras.__version__}: TensorFlowTrainer._maybe_symbolic_build "
        "takes (self, iterator, data_batch, extra), expected (self, iterator, data_batch)"
    )
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": ["localhost:1", "localhost:2"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    with pytest.warns(compat.CompatWarning, match="not installing `symbolic_build_batch`"):
        with pytest.raises(
            compat.UnsupportedVersionError,
            match=r"model\.fit under MultiWorkerMirroredStrategy needs "
            r"keras_lars\.compat's `symbolic_build_batch`.*takes \(self, "
            r"iterator, data_batch, extra\)",
        ):
            keras_lars.make_strategy("multi_worker")
    assert TensorFlowTrainer._maybe_symbolic_build is changed
    assert "symbolic_build_batch" not in compat.applied()


def test_an_unexpected_epoch_iterator_is_a_clear_error(restore_compat):
    """The iterator check at run time: an item that is neither (step,
    batches) nor (begin, end, batches) is named, not unpacked."""
    with compat.unpatched(), compat.patched(["symbolic_build_batch"]):
        with tf.distribute.MirroredStrategy(CPUS).scope():
            model = bn_model()
        with pytest.raises(
            compat.UnsupportedVersionError,
            match=r"`symbolic_build_batch` expected Keras's epoch iterator to "
            r"yield \(step, batches\) or \(begin, end, batches\), got list",
        ):
            model._maybe_symbolic_build(iterator=iter([[0, 1, 2, 3]]))


def test_a_workaround_is_not_installed_where_its_symptom_is_absent(monkeypatch, fresh_compat):
    from keras.src.backend.tensorflow import trainer

    original = trainer.reduce_per_replica
    installed_version = tuple(int(p) for p in keras.__version__.split(".")[:2])
    _replace(monkeypatch, "multi_worker_metrics", fixed_in=installed_version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not needed: no warning either
        assert "multi_worker_metrics" not in compat.apply()
    assert trainer.reduce_per_replica is original
    compat.require("multi_worker_metrics", "anything")  # nothing needed, nothing refused


def test_behaviour_changes_can_be_left_out(fresh_compat):
    installed = compat.apply(behaviour_changes=False)
    assert installed == tuple(
        w.name for w in compat.WORKAROUNDS if w.kind == "crash" and w.needed()
    )
    assert {
        "symbolic_build_batch",
        "multi_worker_metrics",
        "steps_per_execution_loop",
        "distinct_collective_keys",
    } <= set(installed)
    assert keras.layers.BatchNormalization.build.__module__.startswith("keras.")
    with pytest.raises(compat.UnsupportedVersionError, match=r"call keras_lars\.compat\.apply\(\)"):
        compat.require("mean_batch_norm_statistics", "the tool")


def test_installing_is_logged_once_by_name(caplog, fresh_compat):
    with caplog.at_level(logging.INFO, logger="keras_lars"):
        compat.apply(["steps_per_execution_loop"])
        compat.unapply()
        compat.apply(["steps_per_execution_loop"])
    messages = [r.getMessage() for r in caplog.records if r.name == "keras_lars"]
    assert messages == [
        "keras_lars.compat installed `steps_per_execution_loop` (crash fix, keras#19246)"
    ]


def test_the_registry_table_lists_every_workaround():
    table = compat.table().splitlines()
    assert len(table) == 2 + len(compat.WORKAROUNDS)
    for row, workaround in zip(table[2:], compat.WORKAROUNDS):
        assert row.startswith(f"| `{workaround.name}` | {workaround.kind} | {workaround.issues} |")
        assert row.endswith(f"| {workaround.describe_versions()} |")


# --- the package's structure -----------------------------------------------
def test_each_workaround_is_the_module_named_after_it():
    """Its `Workaround(...)` entry sits beside its patch, in registry order."""
    import importlib

    for workaround in compat.WORKAROUNDS:
        module = importlib.import_module(f"keras_lars.compat.{workaround.name}")
        assert module.WORKAROUND is workaround
        assert workaround.install is module.install and workaround.shape is module.shape


def test_no_workaround_is_fixed_at_or_below_the_keras_floor():
    """Keras below the floor is refused at import: such a fix would be dead."""
    from keras_lars import _environment

    for workaround in compat.WORKAROUNDS:
        if workaround.package == "keras" and workaround.fixed_in is not None:
            assert workaround.fixed_in > _environment.KERAS_FLOOR, workaround.name


# --- the environment check at import -----------------------------------------
@pytest.mark.subprocess
@pytest.mark.parametrize(
    "environment, fakes, message",
    [
        (
            {"TF_USE_LEGACY_KERAS": "1"},
            {},
            r"keras_lars needs Keras 3, but TF_USE_LEGACY_KERAS=1 makes TensorFlow use Keras 2",
        ),
        (
            {},
            {"keras": "__version__ = '2.15.0'"},
            r"keras_lars needs Keras >= 3\.8, < 4; installed: keras 2\.15\.0",
        ),
        (
            {},
            {"keras": "__version__ = '3.7.0'"},
            r"keras_lars needs Keras >= 3\.8, < 4; installed: keras 3\.7\.0 .*keras#19891",
        ),
        (  # TensorFlow missing under Keras's default backend
            {"KERAS_BACKEND": "tensorflow"},
            {
                "tensorflow": "raise ModuleNotFoundError(\"No module named 'tensorflow'\", "
                "name='tensorflow')"
            },
            r"Keras's backend is tensorflow .*but TensorFlow is not installed: "
            r"pip install 'keras-lars\[cpu\]'",
        ),
    ],
)
def test_a_wrong_environment_is_one_import_error(environment, fakes, message, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [root]
    for package, source in fakes.items():  # found before the installed one
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(source + "\n")
    if fakes:
        path.insert(0, str(tmp_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **environment)
    program = (
        "import sys\ntry:\n    import keras_lars\nexcept ImportError as error:\n"
        "    print(error)\n    sys.exit(3)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 3, result.stdout + result.stderr[-2000:]
    assert re.search(message, result.stdout.strip()), result.stdout
    assert len(result.stdout.strip().splitlines()) == 1


def test_the_floor_matches_setup_cfg():
    import configparser

    from keras_lars import _environment

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = configparser.ConfigParser()
    config.read(os.path.join(root, "setup.cfg"))
    floor = ".".join(map(str, _environment.KERAS_FLOOR))
    assert f"keras>={floor},<4" in config["options"]["install_requires"].split()
    assert compat.KERAS_VERIFIED[0] == _environment.KERAS_FLOOR
