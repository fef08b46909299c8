"""The training tool: trains an image classifier with LARS, LAMB or momentum SGD.

    keras-lars-train           # ResNet-20 on scikit-learn's digits, 15 epochs on the CPU

With no flags it trains ResNet-20 with LARS and the warmup +
polynomial-decay schedule on scikit-learn's handwritten digits (1797 8x8
images shipped with scikit-learn, at their own 8x8; nothing is downloaded),
evaluates on a fixed held-out fifth after every epoch, and writes
checkpoints, TensorBoard logs and summary.json to runs/digits. Rerunning
the same command resumes from the last checkpoint (also after a kill) and
ends with the same result as an uninterrupted run.

    # ResNet-50 on ImageNet TFRecords, the MLPerf LARS recipe for the batch
    keras-lars-train --dataset=imagenet --data_dir=/data/imagenet \\
        --model=resnet50 --global_batch_size=1024 --recipe=mlperf \\
        --precision=bfloat16 --model_dir=runs/resnet50

(also `python -m keras_lars.tools.train`). The rooms, in the order data flows:

    cli.py                 flags in; one line and an exit status out (0, 1, 75)
    config.py              Config: every setting declared once (flags, config.json, docs)
    resolve.py             flag values -> Config: --recipe, the JAX processes' environment
    runtime.py             where it runs: TensorFlow strategy | JAX distribution (runtime_jax.py)
    process_start.py       what both runtimes' starts share: the shared settings, the watchdog
    cluster.py             --cluster: where the other workers are (TF_CONFIG, SLURM)
    length.py              RunLength: steps per epoch, in all, of the warmup
    build.py               model, optimizer, schedule, loss, metrics
    feed.py                the training stream and evaluation set as the runtime wants them
    loop.py                Run (what the rooms share), fit, rollback on divergence
    run_callbacks.py       step counter, dropout reseeding, throughput, progress, logs
    checkpoint_callback.py checkpoints at epoch ends, on request and on preemption
    adaptive.py            --adaptive_batch: the batch decided from the measured noise scale
    preemption.py          signals, exit 75, lost peers
    model_dir.py           config.json, checkpoint names, summary.json, the lock

Importing this package has no side effects and imports no TensorFlow: the
names below load their module on first use. keras-lars-train checks its flags
before Keras, TensorFlow or JAX load (cli.py, config.py and resolve.py import
none of them), so a bad flag or value answers at once.
"""

import importlib

_EXPORTS = {
    "config": ("Config", "OPTIMIZERS", "scaled_learning_rate"),
    "resolve": ("config_from_flags", "recipe_settings"),
    "length": ("RunLength", "run_length"),
    "build": ("compiled_model", "create_model", "create_optimizer", "metrics"),
    "loop": ("train_and_evaluate",),
    "preemption": ("EXIT_PREEMPTED", "Preempted", "Preemption"),
    "cli": ("main", "use_backend", "lost_peer"),
    "settings": ("ConfigError",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF) + ["run"]


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _MODULE_OF[name]
    package = "keras_lars.tools" if module == "settings" else __name__
    return getattr(importlib.import_module(f"{package}.{module}"), name)


def run(argv=None):
    """The keras-lars-train entry point (cli.run)."""
    from keras_lars.tools.train import cli

    cli.run(argv)
