"""keras_lars.distribute and keras_lars.compat: strategies, the Keras
workarounds (each shown failing without it), XLA readiness, fault tolerance.

The multi-worker tests start two real worker processes
(tests/multiworker_worker.py) on free localhost ports and compare their
final weights with single-process runs of the same functions.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from keras_lars import compat
from keras_lars import distribute
from keras_lars import rendezvous
from keras_lars.tools.benchmark_allreduce import free_ports
from tests import multiworker_worker as worker
from tests.processes import CHILD_TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER_TIMEOUT = CHILD_TIMEOUT


@pytest.fixture
def restore_compat():
    """Leaves keras_lars.compat as the test found it."""
    before = compat.applied()
    yield
    compat.unapply([name for name in compat.applied() if name not in before])
    compat.apply(before)


# --- two worker processes --------------------------------------------------
class _Workers:
    """Two worker processes of one job; `results()` waits for both."""

    def __init__(self, tmp_path, job, tag, extra_args=((), ())):
        cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
        self.scratch = tmp_path / f"{tag}_tmp"
        self.scratch.mkdir()
        self.outputs, self.logs, self.processes = [], [], []
        for index in range(2):
            env = dict(
                os.environ,
                TF_CONFIG=json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}}
                ),
                CUDA_VISIBLE_DEVICES="",
                TF_CPP_MIN_LOG_LEVEL="3",
                KERAS_BACKEND="tensorflow",
                PYTHONPATH=ROOT,
                TMPDIR=str(self.scratch),
            )
            self.outputs.append(tmp_path / f"{tag}{index}.npz")
            self.logs.append(tmp_path / f"{tag}{index}.log")
            with open(self.logs[-1], "w") as log:
                self.processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            worker.__file__,
                            job,
                            str(self.outputs[-1]),
                            *extra_args[index],
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,
                    )
                )

    def log_tails(self):
        return "\n".join(
            f"--- worker {i} log:\n" + path.read_text()[-3000:] for i, path in enumerate(self.logs)
        )

    def kill(self, index):
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait()

    def kill_running(self):
        """Leaves no process behind when a test fails early."""
        for index, process in enumerate(self.processes):
            if process.poll() is None:
                self.kill(index)

    def results(self):
        deadline = time.monotonic() + WORKER_TIMEOUT
        try:
            codes = [p.wait(max(deadline - time.monotonic(), 1)) for p in self.processes]
        except subprocess.TimeoutExpired:
            for p in self.processes:
                p.kill()
                p.wait()
            pytest.fail("worker processes timed out\n" + self.log_tails())
        assert codes == [0, 0], self.log_tails()
        return [dict(np.load(path)) for path in self.outputs]


def _weights(results, prefix):
    return [
        results[f"{prefix}/{i}"]
        for i in range(len([key for key in results if key.startswith(prefix + "/")]))
    ]


@pytest.fixture(scope="module")
def two_worker_training(tmp_path_factory):
    """The "train" job on two workers, and the same training in this process
    (no strategy: one replica sees each whole global batch)."""
    workers = _Workers(tmp_path_factory.mktemp("train"), "train", "train")
    try:
        single = tf.distribute.get_strategy()
        references = {
            "lars": worker.train(single)[0].get_weights(),
            "sync_bn": worker.train(single, batch_norm=True)[0].get_weights(),
        }
        return workers.results(), references
    finally:
        workers.kill_running()


@pytest.mark.multiworker
def test_two_workers_match_single_process_on_the_global_batches(two_worker_training):
    (chief, other), references = two_worker_training
    assert chief["replicas"] == other["replicas"] == 2
    assert str(chief["communication"]) == "RING 256"  # make_strategy's options reached TF
    assert chief["chief"] and not other["chief"]
    for prefix, reference in [("spe1", references["lars"]), ("sync_bn", references["sync_bn"])]:
        ours = _weights(chief, prefix)
        assert len(ours) == len(reference)
        for a, b in zip(ours, _weights(other, prefix)):  # one all-reduce, one result
            np.testing.assert_array_equal(a, b)
        start = worker.build_model(prefix == "sync_bn").get_weights()
        assert min(np.abs(b - s).max() for b, s in zip(reference, start) if s.ndim == 2) > 1e-2
        for a, b in zip(ours, reference):  # two half batches all-reduced = one global batch
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # (float32 sums reordered)


@pytest.mark.multiworker
def test_steps_per_execution_4_equals_1_on_two_workers(two_worker_training):
    (chief, other), _ = two_worker_training
    for results in (chief, other):
        for a, b in zip(_weights(results, "spe4"), _weights(results, "spe1")):
            np.testing.assert_array_equal(a, b)


@pytest.mark.multiworker
def test_each_multi_worker_workaround_is_needed(tmp_path):
    """Keras's own code, one workaround missing at a time, shows each
    upstream symptom; with all of them `fit` works (tests above)."""
    for results in _Workers(tmp_path, "symptoms", "symptoms").results():
        # keras#20585 / tensorflow#72388: strategy.reduce of the whole batch
        assert "Attempt to convert a value (PerReplica" in str(results["no_workaround"])
        # keras#20585 / tensorflow#72388: reduce(..., axis=0) of scalar metrics
        assert "Invalid reduction dimension 0 for input with 0 dimensions" in str(
            results["no_metrics_fix"]
        )
        # keras#19246: steps_per_execution > 1
        assert "You must feed a value for placeholder tensor" in str(results["no_loop_fix"])


@pytest.mark.multiworker
def test_killed_worker_restarts_from_backup_and_ends_like_uninterrupted_run(
    tmp_path, two_worker_training
):
    (uninterrupted, _), _ = two_worker_training
    backup = tmp_path / "backup"
    pause = tmp_path / "paused"
    args = ("--backup-dir", str(backup))
    first = _Workers(
        tmp_path, "fault", "first", extra_args=(args, args + ("--pause-file", str(pause)))
    )
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT
        while not pause.exists():  # worker 1 is in epoch 2, after 2 steps
            assert time.monotonic() < deadline and first.processes[1].poll() is None, (
                first.log_tails()
            )
            time.sleep(0.2)
        # Only the chief wrote the backup, of the end of epoch 1 (next epoch: 2).
        assert sorted(os.listdir(backup)) == ["latest.weights.h5", "training_metadata.json"]
        assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 2
        first.kill(1)  # SIGKILL; the chief then waits forever in an all-reduce
        first.kill(0)
        assert [p.returncode for p in first.processes] == [-signal.SIGKILL] * 2
    finally:
        first.kill_running()

    second = _Workers(tmp_path, "fault", "second", extra_args=(args, args))
    for results in second.results():
        np.testing.assert_array_equal(results["epochs"], [2, 3])  # resumed at epoch 2
        for a, b in zip(_weights(results, "fault"), _weights(uninterrupted, "spe1")):
            np.testing.assert_array_equal(a, b)
    assert not backup.exists()  # the chief removes the backup at the end
    assert os.listdir(second.scratch) == []  # the other worker's scratch saves are gone


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


# --- the strategy factory ----------------------------------------------------
GOOD = {
    "cluster": {"worker": ["localhost:1234", "localhost:1235"]},
    "task": {"type": "worker", "index": 1},
}


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "TF_CONFIG is not set"),
        ("{'cluster': 1", "TF_CONFIG is not valid JSON"),
        ("[1, 2]", "TF_CONFIG must be a JSON object"),
        (json.dumps({"task": GOOD["task"]}), r"TF_CONFIG\['cluster'\] must be"),
        (
            json.dumps({**GOOD, "cluster": {"worker": ["localhost"]}}),
            r"TF_CONFIG\['cluster'\]\['worker'\] must be a non-empty list of 'host:port'",
        ),
        (json.dumps({"cluster": GOOD["cluster"]}), r"TF_CONFIG\['task'\] must be"),
        (
            json.dumps({**GOOD, "task": {"type": "chief", "index": 0}}),
            r"TF_CONFIG\['task'\]\['type'\] = 'chief' is not a job",
        ),
        (
            json.dumps({**GOOD, "task": {"type": "worker", "index": "0"}}),
            r"TF_CONFIG\['task'\]\['index'\] must be an integer",
        ),
        (
            json.dumps({**GOOD, "task": {"type": "worker", "index": 2}}),
            r"TF_CONFIG\['task'\]\['index'\] = 2 is out of range for job 'worker' with 2",
        ),
    ],
)
def test_bad_tf_config_is_named(text, message, monkeypatch, restore_compat):
    if text is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", text)
    with compat.unpatched():
        with pytest.raises(ValueError, match=message):
            distribute.make_strategy("multi_worker")
        assert compat.applied() == ()  # nothing is patched for a failed call
    assert distribute.parse_tf_config(json.dumps(GOOD)) == GOOD


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"kind": "gpu"}, "kind"),
        ({"collective_implementation": "mpi"}, "collective_implementation"),
        ({"bytes_per_pack": -1}, "bytes_per_pack"),
        ({"bytes_per_pack": 1.5}, "bytes_per_pack"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_bad_strategy_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        distribute.make_strategy(**kwargs)


def test_tpu_without_a_tpu_names_the_address(monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    with pytest.raises(ValueError, match="tpu_address"):
        distribute.make_strategy("tpu")


def test_factory_kinds(monkeypatch, restore_compat):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    with compat.unpatched():
        assert distribute.make_strategy("auto") is tf.distribute.get_strategy()  # no GPU here
        one = distribute.make_strategy("one_device", devices=["/cpu:1"])
        assert isinstance(one, tf.distribute.OneDeviceStrategy)
        assert one.extended.worker_devices[0].endswith("CPU:1")
        assert compat.applied() == ()
        mirrored = distribute.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
        assert mirrored.num_replicas_in_sync == 2
        assert compat.applied() == tuple(w.name for w in compat.WORKAROUNDS if w.needed())
    assert distribute.is_chief(mirrored)


# --- TPU readiness without a TPU ---------------------------------------------
HOST_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "NumpyFunction", "Print", "PrintV2"}


def _op_types(graph):
    """Op types of a graph and of every function in its library."""
    graph_def = graph.as_graph_def()
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


@pytest.mark.parametrize("optimizer", ["LARS", "LAMB"])
def test_train_step_compiles_with_xla_and_has_no_host_ops(optimizer):
    schedule = keras_lars.WarmupPolyDecay(
        peak_learning_rate=0.5, warmup_steps=2, total_steps=8, end_learning_rate=0.01
    )
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(8),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer=getattr(keras_lars, optimizer)(schedule, weight_decay=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    x, y = worker.make_data()
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert int(model.optimizer.iterations.numpy()) == 8

    # The whole step (forward, backward, schedule, optimizer, metrics) as
    # one XLA computation: lowering to HLO fails on any op XLA cannot compile.
    step = tf.function(model.train_step, jit_compile=True)
    batch = (tf.constant(x[:16]), tf.constant(y[:16]))
    assert "HloModule" in step.experimental_get_compiler_ir(batch)(stage="hlo")
    assert not _op_types(step.get_concrete_function(batch).graph) & HOST_OPS


def test_xla_check_rejects_a_host_op():
    """The checks above can fail: a numpy callback is a host op XLA rejects."""
    step = tf.function(lambda v: tf.numpy_function(np.sin, [v], tf.float32), jit_compile=True)
    value = tf.constant([1.0])
    assert _op_types(step.get_concrete_function(value).graph) & HOST_OPS
    with pytest.raises(Exception, match="(?i)compil|xla|supported"):
        step.experimental_get_compiler_ir(value)(stage="hlo")


# --- waiting for the cluster -------------------------------------------------------
def _two_task_config(monkeypatch, own_port, peer_port):
    cluster = {"worker": [f"localhost:{own_port}"], "chief": [f"localhost:{peer_port}"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )


def _chief_meets(own_port, peer_port, outcome, settings=None):
    """Chief 0 of _two_task_config's cluster, in a thread: its result (or
    error) goes to `outcome`."""
    cluster = {"chief": [f"localhost:{peer_port}"], "worker": [f"localhost:{own_port}"]}
    tasks = {("chief", 0): "chief 0", ("worker", 0): "worker 0"}

    def meet():
        try:
            outcome.append(
                rendezvous.meet(
                    ("chief", 0),
                    tasks,
                    f"localhost:{peer_port}",
                    60,
                    run={"cluster": cluster},
                    settings=settings,
                )
            )
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=meet)
    thread.start()
    return thread


def test_wait_for_workers_returns_once_the_chief_admits_this_task(monkeypatch):
    own, peer = free_ports(2)
    _two_task_config(monkeypatch, own, peer)
    outcome = []
    chief = _chief_meets(own, peer, outcome, settings={"--seed": 1})
    assert keras_lars.distribute.wait_for_workers(60, settings={"--seed": 1}) == 1
    chief.join()
    assert outcome == [1]
    # Meanwhile this task held its own port; now it is free for TensorFlow.
    with socket.socket() as again:
        again.bind(("localhost", own))


def test_wait_for_workers_names_the_settings_that_differ(monkeypatch):
    own, peer = free_ports(2)
    _two_task_config(monkeypatch, own, peer)
    outcome = []
    chief = _chief_meets(own, peer, outcome, settings={"--seed": 1, "--model": "resnet18"})
    differ = "settings differ: --seed: 1 on chief 0, 2 on worker 0"
    with pytest.raises(
        rendezvous.HandshakeError,
        match=rf"^chief 0 \(localhost:{peer}\) refused worker 0: {differ}$",
    ):
        keras_lars.distribute.wait_for_workers(60, settings={"--seed": 2, "--model": "resnet18"})
    chief.join()
    assert isinstance(outcome[0], rendezvous.HandshakeError) and str(outcome[0]) == differ


def test_wait_for_workers_logs_the_missing_task_and_times_out(monkeypatch):
    own, peer = free_ports(2)
    _two_task_config(monkeypatch, own, peer)
    lines = []
    started = time.monotonic()
    with pytest.raises(
        TimeoutError, match=rf"^chief 0 \(localhost:{peer}\) did not start within 1.5 s$"
    ):
        keras_lars.distribute.wait_for_workers(1.5, log=lines.append, report_every_seconds=0.5)
    assert 1.5 <= time.monotonic() - started < 6
    assert lines and all(
        line.startswith(f"waiting for chief 0 (localhost:{peer}) (") for line in lines
    )


def test_wait_for_workers_stops_when_asked(monkeypatch):
    _two_task_config(monkeypatch, *free_ports(2))
    with pytest.raises(InterruptedError, match="stopped by SIGTERM while waiting for chief 0"):
        keras_lars.distribute.wait_for_workers(60, stop=lambda: "SIGTERM")


def test_wait_for_workers_names_a_taken_own_address(monkeypatch):
    own, peer = free_ports(2)
    _two_task_config(monkeypatch, own, peer)
    with socket.socket() as taken:
        taken.bind(("", own))
        taken.listen(1)
        with pytest.raises(OSError, match=f"cannot listen on this task's address localhost:{own}"):
            keras_lars.distribute.wait_for_workers(5)


def test_wait_for_workers_alone_or_with_a_bad_timeout(monkeypatch):
    (port,) = free_ports(1)
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": [f"localhost:{port}"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    assert keras_lars.distribute.wait_for_workers(1) == 0
    with pytest.raises(ValueError, match="timeout_seconds"):
        keras_lars.distribute.wait_for_workers(0)


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
