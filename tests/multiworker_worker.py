"""One worker of the 2-worker MultiWorkerMirroredStrategy tests.

    TF_CONFIG=... python tests/multiworker_worker.py JOB OUT.npz [--backup-dir D] [--pause-file F]

JOB is "train" (LARS + WarmupPolyDecay with steps_per_execution 1 and 4, and
a synchronized-batch-norm model, all with keras_lars.compat; then the same
fit on Keras's own code, one workaround missing at a time, its errors
recorded: the symptoms), "mirrored_symptom" (no TF_CONFIG; MirroredStrategy on
two logical CPUs without one workaround, `--bug steps_per_execution` or
`--bug collective_keys`; a failed collective can leave a process unable to
run collectives again, so these run in processes of their own) or "fault"
(the LARS run with
keras_lars.distribute.BackupAndRestore; with --pause-file the worker writes
that file and stops in epoch PAUSE_EPOCH, to be killed). The final weights
(or errors) go to OUT.npz. The model, data and training are defined here
once, so that the tests train their single-process references with the
same functions.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import keras_lars  # noqa: E402
from keras_lars import compat  # noqa: E402
from keras_lars import distribute  # noqa: E402

GLOBAL_BATCH = 16
BATCHES_PER_EPOCH = 4
EPOCHS = 4
PAUSE_EPOCH = 2  # "fault": the paused worker stops after 2 steps of this epoch


def make_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH * BATCHES_PER_EPOCH, 5)).astype("float32")
    y = (np.argmax(x[:, :3], axis=1) + (x[:, 3] > 1.0)).astype("int32") % 3
    return x, y


def make_dataset():
    """The global batches, identical on every worker. DATA sharding splits
    each global batch of 16 into per-replica batches of 8 (worker i takes
    the i-th half), so a step of the 2-worker job averages exactly the
    gradient of one global batch, as a single process training on it."""
    x, y = make_data()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)


def build_model(batch_norm=False, steps_per_execution=1, optimizer=None):
    """A small MLP with fixed initial weights (numpy, not TF's RNG), compiled
    with LARS on a warmup + polynomial-decay schedule. `batch_norm=True` adds
    BatchNormalization(synchronized=True): one replica's statistics then are
    those of the global batch. `optimizer` replaces the LARS optimizer."""
    layers = [keras.Input((5,)), keras.layers.Dense(8)]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization(synchronized=True, momentum=0.5))
    layers += [keras.layers.Activation("relu"), keras.layers.Dense(3)]
    model = keras.Sequential(layers)
    rng = np.random.default_rng(1)
    model.set_weights(
        [  # kernels random; biases and batch-norm state as Keras sets them
            rng.normal(scale=0.5, size=w.shape).astype("float32") if w.ndim == 2 else w
            for w in model.get_weights()
        ]
    )
    schedule = keras_lars.WarmupPolyDecay(
        peak_learning_rate=1.0,
        warmup_steps=4,
        total_steps=EPOCHS * BATCHES_PER_EPOCH,
        end_learning_rate=0.01,
    )
    model.compile(
        optimizer=optimizer
        or keras_lars.LARS(schedule, momentum=0.9, weight_decay=1e-3, trust_coefficient=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


def train(strategy, batch_norm=False, steps_per_execution=1, callbacks=(), optimizer=None):
    """Builds the model under `strategy` and fits EPOCHS epochs; returns the
    model and the epochs this call ran. `optimizer`: a function returning
    the optimizer to use instead of LARS."""
    with strategy.scope():
        model = build_model(batch_norm, steps_per_execution, optimizer and optimizer())
    history = model.fit(
        make_dataset(), epochs=EPOCHS, callbacks=list(callbacks), shuffle=False, verbose=0
    )
    return model, history.epoch


class _Pause(keras.callbacks.Callback):
    """Writes `path` and sleeps (until killed) after 2 steps of PAUSE_EPOCH."""

    def __init__(self, path):
        super().__init__()
        self.path, self.epoch = path, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == PAUSE_EPOCH and batch == 1:
            with open(self.path, "w") as f:
                f.write("paused")
            import time

            time.sleep(600)


def _weights(prefix, model):
    return {f"{prefix}/{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}


def _error(run):
    try:
        run()
    except Exception as error:  # the symptom to record
        return f"{type(error).__name__}: {error}"
    return ""


def _symptoms(strategy):
    """The errors of the fit on Keras's own code, one workaround missing at a time."""
    found = {}
    with compat.unpatched():
        found["no_workaround"] = _error(lambda: train(strategy))
        with compat.patched(["symbolic_build_batch"]):
            found["no_metrics_fix"] = _error(lambda: train(strategy))
        with compat.patched(["symbolic_build_batch", "multi_worker_metrics"]):
            found["no_loop_fix"] = _error(lambda: train(strategy, steps_per_execution=4))
    return found


def main(argv):
    job, out = argv[1], argv[2]
    options = dict(zip(argv[3::2], argv[4::2]))
    keras.config.disable_traceback_filtering()
    results = {}
    if job == "mirrored_symptom":  # two logical CPUs, no TF_CONFIG
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        mirrored = lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])  # noqa: E731
        if options["--bug"] == "steps_per_execution":  # keras#19246
            results["error"] = _error(lambda: train(mirrored(), steps_per_execution=4))
        else:  # tensorflow#62790: a second strategy, another model
            with compat.patched(), compat.unpatched(["distinct_collective_keys"]):
                train(mirrored())
                results["error"] = _error(lambda: train(mirrored(), batch_norm=True))
    else:  # ring all-reduce of gradients packed into 256-byte chunks
        strategy = distribute.make_strategy(
            "multi_worker", collective_implementation="ring", bytes_per_pack=256
        )
        communication = strategy.extended._communication_options
        results["communication"] = (
            f"{communication.implementation.name} {communication.bytes_per_pack}"
        )
        results["replicas"] = strategy.num_replicas_in_sync
        results["chief"] = distribute.is_chief(strategy)
        if job == "train":
            results.update(_weights("spe1", train(strategy)[0]))
            results.update(_weights("spe4", train(strategy, steps_per_execution=4)[0]))
            results.update(_weights("sync_bn", train(strategy, batch_norm=True)[0]))
            results.update(_symptoms(strategy))  # last: a failed fit may break collectives
        elif job == "fault":
            callbacks = [distribute.BackupAndRestore(options["--backup-dir"])]
            if "--pause-file" in options:
                callbacks.append(_Pause(options["--pause-file"]))
            model, epochs = train(strategy, callbacks=callbacks)
            results.update(_weights("fault", model))
            results["epochs"] = np.array(epochs)
        else:
            raise ValueError(f"Unknown JOB {job!r}; expected train, fault or mirrored_symptom.")
    np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv)
