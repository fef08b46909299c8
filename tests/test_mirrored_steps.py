"""Training steps on two replicas in this process (MirroredStrategy on
conftest.py's two logical CPUs) and the keras_lars.compat workarounds they
need: each shown failing without it (in a child process of its own), several
strategies in one process, steps_per_execution, clipping applied to the
all-reduced gradient (refused in one line where Keras's optimizer changed),
and the all-reduce in low precision (allreduce_dtype) within its rounding; and
keras_lars.compat's bookkeeping (explicit, idempotent and reversible; the
version gate). Worker processes are tests/test_distribute.py."""

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from keras_lars import compat
from tests import multiworker_worker as worker
from tests.processes import CHILD_TIMEOUT
from tests.processes import ROOT

WORKER_TIMEOUT = CHILD_TIMEOUT


# --- in-process: MirroredStrategy on two logical CPUs ------------------------
def _fit_mirrored(steps_per_execution):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model, _ = worker.train(strategy, batch_norm=True, steps_per_execution=steps_per_execution)
    return model.get_weights()


@pytest.mark.subprocess
def test_each_mirrored_strategy_workaround_is_needed(tmp_path):
    """Without `steps_per_execution_loop` (keras#19246) or, for a second
    strategy training another model, `distinct_collective_keys`
    (tensorflow#62790), fit fails. Each runs in a child process of its own:
    a failed collective can leave a process unable to run one again."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    env.pop("TF_CONFIG", None)
    bugs = {
        "steps_per_execution": "InvalidArgumentError: Graph execution error",
        "collective_keys": "Shape mismatch in the collective instance",
    }
    children = {
        bug: subprocess.Popen(
            [
                sys.executable,
                worker.__file__,
                "mirrored_symptom",
                str(tmp_path / f"{bug}.npz"),
                "--bug",
                bug,
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for bug in bugs
    }
    for bug, child in children.items():
        log, _ = child.communicate(timeout=WORKER_TIMEOUT)
        assert child.returncode == 0, log[-3000:]
        error = str(np.load(tmp_path / f"{bug}.npz")["error"])
        assert bugs[bug] in error, error[-2000:]
    assert "You must feed a value for placeholder tensor" in str(
        np.load(tmp_path / "steps_per_execution.npz")["error"]
    )


def test_several_mirrored_strategies_in_one_process(restore_compat):
    """With `distinct_collective_keys` (tensorflow#62790)."""
    compat.apply()
    worker.train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    second = worker.train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), batch_norm=True)
    reference = worker.train(tf.distribute.get_strategy(), batch_norm=True)[0]
    for a, b in zip(second[0].get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("steps_per_execution", [3, 4])
def test_steps_per_execution_under_mirrored_strategy(steps_per_execution, restore_compat):
    """With compat (keras#19246). 4 batches an epoch: 4 is one execution an
    epoch, 3 ends each epoch with an execution that runs out of data."""
    compat.apply()
    one_step = _fit_mirrored(1)
    for a, b in zip(_fit_mirrored(steps_per_execution), one_step):
        np.testing.assert_array_equal(a, b)
    reference = worker.train(tf.distribute.get_strategy(), batch_norm=True)[0].get_weights()
    for a, b in zip(one_step, reference):  # synchronized batch norm: global-batch statistics
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


CLIPPED = {  # optimizer, its arguments, the clipping argument
    "LARS clipnorm": (
        keras_lars.LARS,
        {"learning_rate": 0.5, "weight_decay": 1e-3},
        {"clipnorm": 0.05},
    ),
    "LAMB global_clipnorm": (keras_lars.LAMB, {"learning_rate": 0.01}, {"global_clipnorm": 0.1}),
    "LAMB clipvalue": (keras_lars.LAMB, {"learning_rate": 0.01}, {"clipvalue": 0.01}),
}


@pytest.mark.parametrize("case", sorted(CLIPPED))
def test_clipping_applies_to_the_all_reduced_gradient(case, restore_compat):
    """tensorflow#33929: Keras 3 clips each replica's partial gradient."""
    cls, arguments, clipping = CLIPPED[case]
    clipped = lambda: cls(**arguments, **clipping)  # noqa: E731
    single = tf.distribute.get_strategy()
    reference = worker.train(single, optimizer=clipped)[0].get_weights()
    unclipped = worker.train(single, optimizer=lambda: cls(**arguments))[0].get_weights()
    assert max(np.abs(a - b).max() for a, b in zip(reference, unclipped)) > 1e-3  # clipping acts

    def mirrored(optimizer=clipped):
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        return worker.train(strategy, optimizer=optimizer)[0].get_weights()

    # Keras's own optimizers clip each replica's part (the bug) ...
    keras_sgd = lambda: keras.optimizers.SGD(0.1, **clipping)  # noqa: E731
    single_sgd = worker.train(single, optimizer=keras_sgd)[0].get_weights()
    per_replica = mirrored(keras_sgd)
    assert max(np.abs(a - b).max() for a, b in zip(per_replica, single_sgd)) > 1e-4
    # ... keras_lars's clip the all-reduced gradient, as one device does.
    for a, b in zip(mirrored(), reference):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _clip(gradients, clipping):
    """numpy clipnorm (each tensor), global_clipnorm (all) or clipvalue."""
    if "clipnorm" in clipping:
        c = clipping["clipnorm"]
        return [g * c / max(np.linalg.norm(g), c) for g in gradients]
    if "global_clipnorm" in clipping:
        c, norm = clipping["global_clipnorm"], np.sqrt(sum(np.sum(g**2) for g in gradients))
        return [g * c / max(norm, c) for g in gradients]
    return [np.clip(g, -clipping["clipvalue"], clipping["clipvalue"]) for g in gradients]


@pytest.mark.parametrize(
    "clipping", [{"clipnorm": 1.0}, {"global_clipnorm": 1.5}, {"clipvalue": 0.3}], ids=str
)
def test_two_replicas_clip_the_sum_of_their_gradients(clipping):
    """optimizer.apply in each of 2 replicas: w = -lr * clip(g_0 + g_1)
    (LARS with momentum 0, no decay, no adaptation: plain SGD)."""
    rng = np.random.default_rng(1)
    parts = [[rng.normal(size=(3, 4)), rng.normal(size=(4,))] for _ in range(2)]
    parts = [[p.astype("float32") for p in replica] for replica in parts]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        variables = [
            keras.Variable(np.zeros(p.shape, "float32"), name=f"v{i}")
            for i, p in enumerate(parts[0])
        ]
        optimizer = keras_lars.LARS(
            0.5, momentum=0.0, exclude_from_layer_adaptation=["."], **clipping
        )
        optimizer.build(variables)
    stacked = [tf.constant(np.stack([p[i] for p in parts])) for i in range(len(variables))]

    @tf.function
    def step():
        def replica():
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            optimizer.apply([tf.gather(s, index) for s in stacked], variables)

        strategy.run(replica)

    step()
    summed = [a.astype(np.float64) + b for a, b in zip(*parts)]
    for variable, expected in zip(variables, _clip(summed, clipping)):
        np.testing.assert_allclose(variable.numpy(), -0.5 * expected, rtol=1e-6, atol=1e-7)
    per_replica = [a + b for a, b in zip(*(_clip(p, clipping) for p in parts))]
    assert max(np.abs(a - b).max() for a, b in zip(per_replica, _clip(summed, clipping))) > 0.05


def test_clipping_under_replicas_refuses_where_keras_changed(monkeypatch):
    """Clipping after the all-reduce relies on Keras's optimizer methods:
    verified on this Keras, refused in one line where their shape differs."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    assert keras_lars.layerwise._clip_order_shape() is None
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        clipped, unclipped = keras_lars.LAMB(global_clipnorm=1.0), keras_lars.LAMB()

    def changed(self, grads_and_vars, options=None):
        raise AssertionError("never called")

    monkeypatch.setattr(TFOptimizer, "_all_reduce_sum_gradients", changed)
    strategy.run(lambda: unclipped._clip_gradients([tf.ones((2, 2))]))  # needs nothing
    (low_major, low_minor), (high_major, high_minor) = compat.KERAS_VERIFIED
    with pytest.raises(
        compat.UnsupportedVersionError,
        match=r"^clipping \(clipnorm/global_clipnorm/clipvalue\) in 'LAMB' under 2 "
        r"replicas clips after the all-reduce, which keras_lars cannot do here: its "
        rf"target changed in Keras {re.escape(keras.__version__)}: TFOptimizer\._all_"
        r"reduce_sum_gradients takes \(self, grads_and_vars, options\), expected "
        rf"\(self, grads_and_vars\)\. Use Keras {low_major}\.{low_minor} to "
        rf"{high_major}\.{high_minor}\.$",
    ):
        strategy.run(lambda: clipped._clip_gradients([tf.ones((2, 2))]))
    (one_replica,) = clipped._clip_gradients([tf.ones((2, 2))])  # Keras's own clipping
    np.testing.assert_allclose(one_replica, np.full((2, 2), 0.5), rtol=1e-6)


# --- keras_lars.compat bookkeeping -------------------------------------------
def test_compat_apply_is_explicit_idempotent_and_reversible(restore_compat):
    from keras.src.backend.tensorflow import trainer

    with compat.unpatched():
        assert compat.applied() == ()
        originals = (
            trainer.TensorFlowTrainer._make_function,
            trainer.TensorFlowTrainer._maybe_symbolic_build,
            trainer.reduce_per_replica,
        )
        own = _keras_lars_classes()
        names = compat.apply()
        assert _keras_lars_classes() == own  # no keras_lars class is patched
        assert names == tuple(w.name for w in compat.WORKAROUNDS if w.needed())
        patched = (
            trainer.TensorFlowTrainer._make_function,
            trainer.TensorFlowTrainer._maybe_symbolic_build,
            trainer.reduce_per_replica,
        )
        assert all(p is not o for p, o in zip(patched, originals))
        assert compat.apply() == names  # idempotent: nothing wrapped twice
        assert (
            trainer.TensorFlowTrainer._make_function,
            trainer.TensorFlowTrainer._maybe_symbolic_build,
            trainer.reduce_per_replica,
        ) == patched
        with compat.unpatched(["steps_per_execution_loop"]):
            assert trainer.TensorFlowTrainer._make_function is originals[0]
            assert trainer.reduce_per_replica is patched[2]
        assert compat.applied() == names
        assert trainer.TensorFlowTrainer._make_function is not originals[0]
        compat.unapply()  # one undo each brings back Keras's own code
        assert compat.applied() == ()
        assert (
            trainer.TensorFlowTrainer._make_function,
            trainer.TensorFlowTrainer._maybe_symbolic_build,
            trainer.reduce_per_replica,
        ) == originals
    with pytest.raises(ValueError, match="names"):
        compat.apply(["no_such_fix"])


def _keras_lars_classes():
    """{class: {attribute: id(value)}} of every class keras_lars defines."""
    import inspect

    modules = [m for name, m in list(sys.modules.items()) if name.startswith("keras_lars.")]
    return {
        cls: {name: id(value) for name, value in vars(cls).items()}
        for module in modules
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__.startswith("keras_lars.")
    }


def test_compat_version_gate():
    def install():
        raise AssertionError("a workaround outside its versions must not be installed")

    def gate(**kwargs):
        return compat.Workaround(
            "x", "keras#0", "symptom", "crash", install, lambda: None, **kwargs
        )

    major_minor = tuple(int(p) for p in keras.__version__.split(".")[:2])
    assert gate().needed()  # since 3.0, still open
    assert not gate(fixed_in=major_minor).needed()
    assert not gate(since=(major_minor[0] + 1, 0)).needed()
    tf_major_minor = tuple(int(p) for p in tf.__version__.split(".")[:2])
    assert gate(package="tensorflow", since=(2, 0)).needed()
    assert not gate(package="tensorflow", since=(2, 0), fixed_in=tf_major_minor).needed()
    for workaround in compat.WORKAROUNDS:
        assert workaround.issues.startswith(("keras#", "tensorflow#", "no upstream issue found"))
        assert workaround.kind in ("crash", "behaviour")


# --- half-precision all-reduce (allreduce_dtype) -----------------------------------
def _all_reduced(parts, allreduce_dtype):
    """The optimizer's all-reduce of two replicas' gradients `parts`."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        variables = [
            keras.Variable(np.zeros(p.shape, "float32"), name=f"v{i}")
            for i, p in enumerate(parts[0])
        ]
        optimizer = keras_lars.LARS(allreduce_dtype=allreduce_dtype)
    stacked = [tf.constant(np.stack([p[i] for p in parts])) for i in range(len(variables))]

    @tf.function
    def reduce():
        def replica():
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            grads = [tf.gather(s, index) for s in stacked]
            pairs = optimizer._all_reduce_sum_gradients(list(zip(grads, variables)))
            return [g for g, _ in pairs]

        return strategy.run(replica)

    return [strategy.experimental_local_results(g)[0].numpy() for g in reduce()]


@pytest.mark.parametrize(
    "dtype, unit_roundoff", [("float32", 0.0), ("bfloat16", 2.0**-8), ("float16", 2.0**-11)]
)
def test_all_reduce_in_low_precision_is_within_its_rounding(dtype, unit_roundoff):
    # Each replica's part is rounded once and the sum once: |error| <=
    # 2 u (|g_0| + |g_1|) per entry (float16: u of the scaled entry, and the
    # per-gradient power-of-two scale keeps the tiny gradient out of the
    # subnormals, where it would have been flushed to 0).
    rng = np.random.default_rng(0)
    parts = [
        [
            (rng.normal(size=(40, 6)) * 10.0 ** rng.uniform(-1, 2, (40, 6))).astype("float32"),
            rng.normal(1e-9, 1e-10, (5,)).astype("float32"),
        ]
        for _ in range(2)
    ]
    reduced = _all_reduced(parts, dtype)
    for i, result in enumerate(reduced):
        exact = parts[0][i].astype(np.float64) + parts[1][i]
        magnitude = np.abs(parts[0][i]).astype(np.float64) + np.abs(parts[1][i])
        error = np.abs(result - exact)
        if dtype == "float32":
            np.testing.assert_allclose(result, exact, rtol=1e-7)
        else:
            assert np.all(error <= 2 * unit_roundoff * magnitude), np.max(error / magnitude)
            assert np.any(error > 0)  # it did go through the low precision
    assert reduced[1].dtype == np.float32 and np.all(reduced[1] > 0)


def test_allreduce_dtype_is_checked_and_kept_in_the_config():
    with pytest.raises(ValueError, match="allreduce_dtype"):
        keras_lars.LAMB(allreduce_dtype="int8")
    optimizer = keras_lars.LAMB(allreduce_dtype="bfloat16")
    assert keras_lars.LAMB.from_config(optimizer.get_config()).allreduce_dtype == "bfloat16"
