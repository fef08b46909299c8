"""Trains an image classifier with LARS, LAMB or momentum SGD.

    keras-lars-train           # ResNet-18 on scikit-learn's digits, 1-1.5 min on 2 cores

With no flags it trains ResNet-18 at 32x32 with LARS and the warmup +
polynomial-decay schedule on scikit-learn's handwritten digits (1797 8x8
images shipped with scikit-learn, upsampled; nothing is downloaded),
evaluates on a fixed held-out fifth after every epoch, and writes
checkpoints, TensorBoard logs and summary.json to runs/digits. Rerunning
the same command resumes from the last checkpoint (also after a kill) and
ends with the same result as an uninterrupted run.

    # ResNet-50 on ImageNet TFRecords, the MLPerf LARS recipe for the batch
    keras-lars-train --dataset=imagenet --data_dir=/data/imagenet \\
        --model=resnet50 --global_batch_size=1024 --recipe=mlperf \\
        --precision=bfloat16 --model_dir=runs/resnet50

    # on a TPU pod slice, data and model dir in a bucket
    keras-lars-train --strategy=tpu --tpu=local --dataset=imagenet \\
        --data_dir=gs://bucket/imagenet --model_dir=gs://bucket/runs/r50 \\
        --model=resnet50 --global_batch_size=32768 --recipe=mlperf \\
        --precision=bfloat16 --steps_per_execution=39 --sync_batch_norm

(also `python -m keras_lars.tools.train`). The program reads top to bottom:
Config (every setting declared once; the flags are derived from it and
defined only by `run`) -> data, strategy, model, optimizer -> fit with
checkpoints -> summary. Importing this module has no side effects.
"""

import contextlib
import dataclasses
import importlib.util
import math
import os
import signal
import sys
import tempfile
import threading
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app

import keras_lars
from keras_lars import models
from keras_lars.tools import checkpoints
from keras_lars.tools import input_pipeline
from keras_lars.tools import settings
from keras_lars.tools import storage
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import between
from keras_lars.tools.settings import greater_than
from keras_lars.tools.settings import in_interval
from keras_lars.tools.settings import one_of
from keras_lars.tools.settings import setting

MODELS = {
    "resnet18": models.resnet18,
    "resnet34": models.resnet34,
    "resnet50": models.resnet50,
    "resnet101": models.resnet101,
    "resnet152": models.resnet152,
    "alexnet": models.alexnet,
    "alexnet_bn": models.alexnet_bn,
}
OPTIMIZERS = ("lars", "lamb", "sgd", "nesterov")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")
BACKENDS = ("tensorflow", "jax")
DISTRIBUTIONS = ("none", "data_parallel", "model_parallel")  # tools/jax_runtime.py
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
RECIPES = ("none", "mlperf")
SCALING_RULES = ("linear", "sqrt", "none")
REFERENCE_BATCH = 256


def scaled_learning_rate(base, global_batch_size, rule):
    """The peak learning rate from a base rate per REFERENCE_BATCH (256) images:

    linear:  base * B / 256          (keras_lars.linear_scaling, Goyal et al. 2017)
    sqrt:    base * sqrt(B / 256)    (the square-root rule of the LAMB paper)
    none:    base
    """
    if rule == "linear":
        return keras_lars.linear_scaling(base, global_batch_size, REFERENCE_BATCH)
    if rule == "sqrt":
        return base * math.sqrt(global_batch_size / REFERENCE_BATCH)
    if rule == "none":
        return base
    raise ValueError(f"`rule` must be one of {SCALING_RULES}; got {rule!r}.")


def _needs(condition, requirement):
    """A check of a setting against the rest of the config."""
    return lambda value, config: None if condition(value, config) else requirement


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of a training run: one declaration each (name, type,
    default, help, check). Flags, config.json, the study's cell keys and
    docs/flags.md are derived from these fields. Checked on construction
    (ConfigError naming the flag); image_size=0 and model_dir="" resolve to
    the data set's defaults. `--recipe` is applied by `config_from_flags`."""

    model: str = setting("resnet18", "Network (keras_lars.models).", choices=MODELS)
    optimizer: str = setting(
        "lars",
        "lars: keras_lars.LARS; lamb: keras_lars.LAMB; sgd / nesterov: momentum "
        "SGD with the same coupled weight decay (LARS with layer adaptation off).",
        choices=OPTIMIZERS,
    )
    global_batch_size: int = setting(128, "Images per step over all replicas.", check=at_least(1))
    base_learning_rate: float = setting(
        10.0,
        "Peak learning rate per 256 images, scaled to the batch by --lr_scaling. "
        "With --recipe=mlperf and not given: the recipe's peak for the batch, unscaled.",
        check=greater_than(0),
    )
    lr_scaling: str = setting(
        "linear",
        "Peak rate from the base rate for batch B: linear: base * B / 256; "
        "sqrt: base * sqrt(B / 256); none: base.",
        choices=SCALING_RULES,
    )
    recipe: str = setting(
        "none",
        "mlperf: peak rate, warmup, epochs, momentum, weight decay and label "
        "smoothing of the MLPerf ResNet-50 LARS table for the global batch "
        "(keras_lars.resnet50_lars_recipe); flags given explicitly still win.",
        choices=RECIPES,
        check=lambda value, c: (
            None
            if value == "none" or c.optimizer == "lars"
            else (
                f"a LARS recipe; --optimizer={c.optimizer} needs its own --base_learning_rate, "
                "--warmup_epochs, ..."
            )
        ),
    )
    end_learning_rate: float = setting(
        1e-4, "Rate at the end of the polynomial decay.", check=at_least(0)
    )
    warmup_epochs: float = setting(
        2.0, "Linear warmup length in epochs (may be fractional).", check=at_least(0)
    )
    train_epochs: int = setting(
        15,
        "Training length in epochs.",
        check=_needs(lambda value, c: value >= 1 or c.train_steps > 0, "must be >= 1"),
    )
    train_steps: int = setting(
        0,
        "If > 0, training length in steps (overrides --train_epochs).",
        check=_needs(lambda value, c: value >= 0, "must be >= 0 (0: use --train_epochs)"),
    )
    momentum: float = setting(
        0.9,
        "Momentum (lars, sgd, nesterov) or LAMB's beta_1.",
        check=_needs(
            lambda value, c: 0 <= value < 1 and (value > 0 or c.optimizer != "nesterov"),
            "must be in [0, 1) (and > 0 for nesterov)",
        ),
    )
    weight_decay: float = setting(
        1e-4, "Coupled L2 weight decay; biases and batch norm excluded.", check=at_least(0)
    )
    trust_coefficient: float = setting(0.001, "LARS trust coefficient eta.", check=greater_than(0))
    label_smoothing: float = setting(
        0.0, "Label smoothing of the cross-entropy (0.1 in MLPerf).", check=in_interval(0, 1)
    )
    precision: str = setting(
        "float32",
        "bfloat16 / float16: Keras mixed precision (float16 adds loss "
        "scaling); variables and logits stay float32.",
        choices=PRECISIONS,
    )
    strategy: str = setting(
        "default",
        "default: one device; mirrored: all local GPUs; multi_worker: the "
        "cluster of TF_CONFIG; tpu: the TPU at --tpu (keras_lars.make_strategy).",
        choices=STRATEGIES,
        check=_needs(
            lambda value, c: value == "default" or c.backend == "tensorflow",
            "needs --backend=tensorflow (on JAX use --distribution)",
        ),
        resumable=True,
    )
    backend: str = setting(
        None,
        "Keras backend: tensorflow or jax (default: KERAS_BACKEND's, else "
        "~/.keras/keras.json's); the program restarts itself on the one asked for.",
        choices=BACKENDS,
    )
    distribution: str = setting(
        "none",
        "--backend=jax: none: one device; data_parallel: every device of every "
        "process; model_parallel: a (batch, model) device mesh, the convolutions' "
        "output channels and the dense kernels' inputs sharded over --model_axis_size "
        "devices (keras.distribution; tools/jax_runtime.py).",
        choices=DISTRIBUTIONS,
        check=_needs(
            lambda value, c: value == "none" or c.backend == "jax",
            "needs --backend=jax (on TensorFlow use --strategy)",
        ),
        resumable=True,
    )
    model_axis_size: int = setting(
        2,
        "--distribution=model_parallel: devices along the mesh's model axis (the "
        "batch axis gets the rest).",
        check=at_least(1),
        resumable=True,
    )
    coordinator_address: str = setting(
        None,
        "--backend=jax with several processes: host:port of process 0 (jax.distributed); "
        "default: $JAX_COORDINATOR_ADDRESS.",
        resumable=True,
    )
    num_processes: int = setting(
        1,
        "--backend=jax: processes of the run (jax.distributed; each reads its share of "
        "every batch); 0: detected by JAX on Cloud TPU, SLURM or Open MPI; default: "
        "$JAX_NUM_PROCESSES, else 1.",
        check=_needs(
            lambda value, c: (
                value == 1
                or (c.backend == "jax" and (value == 0 or (value > 1 and c.coordinator_address)))
            ),
            "needs --backend=jax, and > 1 needs --coordinator_address (0: detected by JAX)",
        ),
        resumable=True,
    )
    process_id: int = setting(
        0,
        "--backend=jax: this process's index, 0 to --num_processes - 1; default: "
        "$JAX_PROCESS_ID, else 0.",
        check=_needs(
            lambda value, c: c.num_processes < 1 or 0 <= value < c.num_processes,
            "must be in [0, --num_processes)",
        ),
        resumable=True,
    )
    allreduce_dtype: str = setting(
        "float32",
        "Precision of the gradients' cross-replica sum (Jia et al. 2018): bfloat16 and "
        "float16 halve the bytes on the wire; float16 scales each gradient by a power of "
        "two first (keras_lars.LARS/LAMB `allreduce_dtype`).",
        choices=("float32", "bfloat16", "float16"),
        check=_needs(
            lambda value, c: value == "float32" or c.backend == "tensorflow",
            "needs --backend=tensorflow (on JAX, XLA chooses the collectives)",
        ),
    )
    tpu: str = setting(
        None, "TPU name, grpc://address or 'local' (default: $TPU_NAME).", resumable=True
    )
    dataset: str = setting(
        "digits",
        "digits: scikit-learn's handwritten digits (nothing downloaded); "
        "imagenet: ImageNet-format TFRecords in --data_dir (train-*, validation-*); "
        "synthetic: random images of ImageNet's sizes, for throughput.",
        choices=input_pipeline.SOURCES,
    )
    data_dir: str = setting(None, "Directory (or bucket) of the TFRecord shards.", resumable=True)
    label_offset: int = setting(
        1,
        "Subtracted from image/class/label: 1 for labels 1..N (tensorflow/tpu, "
        "keras-lars-make-tfrecords), 0 for 0..N-1.",
        check=one_of(0, 1),
    )
    image_size: int = setting(
        0,
        "Input side in pixels (8 to 4096); 0: the data set's (32 for digits, 224 otherwise).",
        check=between(8, 4096),
    )
    num_classes: int = setting(
        0, "Classes; 0: the data set's (dataset.json, 1000, 10).", check=at_least(0)
    )
    train_examples: int = setting(
        0, "Training examples per epoch; 0: the data set's.", check=at_least(0)
    )
    eval_examples: int = setting(0, "Evaluation examples; 0: the data set's.", check=at_least(0))
    sync_batch_norm: bool = setting(
        False,
        "Batch-norm statistics over all replicas.",
        check=_needs(
            lambda value, c: not (value and c.model == "alexnet"), "alexnet has no batch norm"
        ),
    )
    model_dir: str = setting(
        "",
        "Checkpoints, TensorBoard logs (logs/), summary.json; rerunning resumes. "
        "Empty: runs/<dataset>.",
        resumable=True,
    )
    checkpoint_every_steps: int = setting(
        0,
        "If > 0, also checkpoint within epochs every that many steps (at the next "
        "execution boundary); a resume continues from the step exactly.",
        check=at_least(0),
        resumable=True,
    )
    checkpoint_every_minutes: float = setting(
        0.0,
        "If > 0, also checkpoint within epochs once that many minutes have passed since "
        "the last checkpoint.",
        check=at_least(0),
        resumable=True,
    )
    log_every_seconds: float = setting(
        60.0,
        "Off a terminal (batch jobs, log files), a progress line within each epoch at most "
        "every that many seconds; 0: a line per epoch only.",
        check=at_least(0),
        resumable=True,
    )
    worker_start_timeout_minutes: float = setting(
        10.0,
        "--strategy=multi_worker: how long to wait for the other tasks of TF_CONFIG to start "
        "(a 'waiting for' line every 30 s; SIGTERM/Ctrl-C stop the wait).",
        check=greater_than(0),
        resumable=True,
    )
    steps_per_execution: int = setting(
        1, "Steps per compiled call (large on TPUs).", check=at_least(1), resumable=True
    )
    eval: bool = setting(True, "Evaluate after every epoch.", resumable=True)
    run_eagerly: bool = setting(
        False, "Debugging: run the train step eagerly (no tracing).", resumable=True
    )
    seed: int = setting(
        0, "Seed of the weights, data order and augmentation.", check=between(0, 2**31 - 1)
    )
    stop_on_divergence: bool = setting(
        True,
        "Stop with an error at the first non-finite loss or variable "
        "(keras_lars.DivergenceGuard); nothing non-finite is checkpointed.",
        resumable=True,
    )
    divergence_rollbacks: int = setting(
        0,
        "With --stop_on_divergence: instead of stopping, roll back to the last good "
        "checkpoint (or the start) with the learning rate times --divergence_rate_factor, "
        "at most that many times in the run.",
        check=_needs(
            lambda value, c: value >= 0 and (value == 0 or c.stop_on_divergence),
            "must be >= 0, and rollbacks need --stop_on_divergence",
        ),
        resumable=True,
    )
    divergence_rate_factor: float = setting(
        0.5,
        "What each rollback multiplies the whole learning-rate schedule by.",
        check=_needs(lambda value, c: 0 < value < 1, "must be in (0, 1)"),
        resumable=True,
    )
    trust_ratio_log_every: int = setting(
        0,
        "If > 0, log LARS/LAMB per-layer trust ratios to TensorBoard every that many "
        "steps (keras_lars.TrustRatioMonitor).",
        check=_needs(
            lambda value, c: value >= 0 and (value == 0 or c.optimizer in ("lars", "lamb")),
            "must be >= 0, and trust ratios exist for lars and lamb only",
        ),
        resumable=True,
    )

    def __post_init__(self):
        if self.backend is None:
            object.__setattr__(self, "backend", keras.backend.backend())
        if self.image_size == 0 and self.dataset in input_pipeline.SOURCES:
            default = input_pipeline.SOURCES[self.dataset].default_image_size
            object.__setattr__(self, "image_size", default)
        if not self.model_dir:
            object.__setattr__(self, "model_dir", os.path.join("runs", str(self.dataset)))
        settings.check(self)
        for name in input_pipeline.SOURCES[self.dataset].required_settings:
            if not getattr(self, name):
                raise ConfigError(f"--{name} is required with --dataset={self.dataset}.")

    @property
    def peak_learning_rate(self):
        return scaled_learning_rate(
            self.base_learning_rate, self.global_batch_size, self.lr_scaling
        )


# On JAX, the processes' settings not given as flags come from these variables.
JAX_ENVIRONMENT = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


def config_from_flags(values, given=()):
    """The Config of the flag values `values` (a dict) with --recipe applied
    to the settings not in `given` (the names set on the command line), and
    on JAX the processes' settings not given from JAX_ENVIRONMENT."""
    values = dict(values)
    setting_of = lambda name: values.get(name, getattr(Config, name))  # noqa: E731
    if (setting_of("backend") or keras.backend.backend()) == "jax":
        for name, variable in JAX_ENVIRONMENT.items():
            if name in given or variable not in os.environ:
                continue
            text = os.environ[variable]
            try:
                values[name] = text if name == "coordinator_address" else int(text)
            except ValueError:
                raise ConfigError(f"{variable}={text!r} (for --{name}): not an integer") from None
    if setting_of("recipe") == "mlperf" and setting_of("optimizer") == "lars":
        recipe = keras_lars.resnet50_lars_recipe(max(setting_of("global_batch_size"), 1))
        from_recipe = {
            "base_learning_rate": recipe.peak_learning_rate,
            "lr_scaling": "none",
            "warmup_epochs": recipe.warmup_epochs,
            "train_epochs": int(recipe.train_epochs),
            "momentum": recipe.momentum,
            "weight_decay": recipe.weight_decay,
            "label_smoothing": recipe.label_smoothing,
            "end_learning_rate": recipe.end_learning_rate,
        }
        if "base_learning_rate" in given:
            del from_recipe["base_learning_rate"], from_recipe["lr_scaling"]
        values.update({k: v for k, v in from_recipe.items() if k not in given})
    return Config(**values)


# --- the run's length --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Plan:
    """Steps: an epoch is one pass over the training set (drop remainder)."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int

    @property
    def epochs(self):
        return math.ceil(self.total_steps / self.steps_per_epoch)

    def steps_in(self, epoch):
        return min(self.steps_per_epoch, self.total_steps - epoch * self.steps_per_epoch)


def make_plan(config, num_train):
    if config.global_batch_size > num_train:
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size} exceeds the "
            f"{num_train} training examples: an epoch would have no step."
        )
    per_epoch = keras_lars.steps_per_epoch(num_train, config.global_batch_size)
    total = config.train_steps or config.train_epochs * per_epoch
    warmup = keras_lars.epochs_to_steps(config.warmup_epochs, num_train, config.global_batch_size)
    plan = Plan(per_epoch, total, warmup)
    k = config.steps_per_execution
    for steps in sorted({plan.steps_in(e) for e in range(plan.epochs)}):
        if steps % k:
            raise ConfigError(
                f"--steps_per_execution={k} must divide the steps of every epoch "
                f"({steps} here; {per_epoch} per full epoch), since checkpoints and "
                "evaluation happen at epoch ends."
            )
    if warmup > total:
        raise ConfigError(
            f"--warmup_epochs={config.warmup_epochs} ({warmup} steps) is longer than "
            f"the training ({total} steps): lower it or train longer."
        )
    return plan


# --- model, optimizer, loss ----------------------------------------------------------
def create_model(config, num_classes):
    kwargs = {}
    if config.model != "alexnet":
        kwargs["sync_batch_norm"] = config.sync_batch_norm
    return MODELS[config.model](
        num_classes=num_classes,
        input_shape=(config.image_size, config.image_size, 3),
        **kwargs,
    )


def create_optimizer(config, schedule):
    """LARS / LAMB / momentum SGD with coupled weight decay. Rank-1 variables
    (biases, batch norm) get no weight decay and no layer adaptation."""
    record = config.trust_ratio_log_every > 0
    if config.optimizer == "lamb":
        return keras_lars.LAMB(
            schedule,
            beta_1=config.momentum,
            weight_decay=config.weight_decay,
            exclude_rank_one=True,
            record_trust_ratios=record,
            allreduce_dtype=config.allreduce_dtype,
        )
    # Momentum SGD is LARS with every variable excluded from layer adaptation:
    # v = m*v + lr*(g + wd*w), w -= v, the form of Goyal et al. and MLPerf.
    sgd = config.optimizer in ("sgd", "nesterov")
    return keras_lars.LARS(
        schedule,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        trust_coefficient=config.trust_coefficient,
        nesterov=config.optimizer == "nesterov",
        exclude_from_layer_adaptation=[".*"] if sgd else None,
        record_trust_ratios=record,
        name=config.optimizer,
        allreduce_dtype=config.allreduce_dtype,
    )


class CrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy of logits against integer labels, with targets
    (1 - s) * one_hot + s / num_classes, averaged over the examples' weights
    (evaluation batches are padded with weight-0 examples)."""

    def __init__(self, num_classes, label_smoothing=0.0, name="cross_entropy"):
        super().__init__(name=name, reduction="mean_with_sample_weight")
        self.num_classes, self.label_smoothing = num_classes, label_smoothing

    def call(self, labels, logits):
        labels = keras.ops.reshape(keras.ops.cast(labels, "int32"), (-1,))
        return keras.losses.categorical_crossentropy(
            keras.ops.one_hot(labels, self.num_classes),
            logits,
            from_logits=True,
            label_smoothing=self.label_smoothing,
        )

    def get_config(self):
        return {
            "num_classes": self.num_classes,
            "label_smoothing": self.label_smoothing,
            "name": self.name,
        }


def metrics(num_classes):
    found = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if num_classes > 5:
        found.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5_accuracy"))
    return found


def compiled_model(config, num_classes, schedule):
    """The model of `config`, compiled with its optimizer, loss and metrics
    (call inside the strategy's scope)."""
    model = create_model(config, num_classes)
    model.compile(
        optimizer=create_optimizer(config, schedule),
        loss=CrossEntropy(num_classes, config.label_smoothing),
        weighted_metrics=metrics(num_classes),  # evaluation padding has weight 0
        steps_per_execution=config.steps_per_execution,
        run_eagerly=config.run_eagerly,
    )
    return model


# --- data as the strategy wants it -------------------------------------------------
def train_stream(data, plan, start_epoch, global_batch_size, skip=0, end_epoch=None):
    """Returns fn(input_context) -> the batches of epochs start_epoch ..
    end_epoch - 1 (default: to the end) in order, each epoch `data.train(epoch)`
    cut to its steps, the first without its first `skip` steps."""

    def make(input_context):
        local_replicas = input_context.num_replicas_in_sync // input_context.num_input_pipelines
        stream = None
        for epoch in range(start_epoch, end_epoch or plan.epochs):
            done = skip if epoch == start_epoch else 0
            batches = data.train(epoch, global_batch_size, input_context, done * local_replicas)
            batches = batches.take((plan.steps_in(epoch) - done) * local_replicas)
            stream = batches if stream is None else stream.concatenate(batches)
        return stream

    return make


# --- callbacks ------------------------------------------------------------------------
EXIT_PREEMPTED = 75  # the exit status after SIGTERM / SIGINT (EX_TEMPFAIL: run it again)


class Preempted(Exception):
    """Training stopped by SIGTERM or SIGINT after saving a checkpoint."""


class Preemption:
    """Turns SIGTERM and SIGINT into a request that training honours at the
    next step boundary (a checkpoint, then Preempted). A second SIGINT
    stops at once (KeyboardInterrupt)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signal = None

    def _handle(self, number, frame):
        if self.signal is not None and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(number).name
        print(f"{self.signal} received: {self._action}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def handling(self, enabled=True, action="saving a checkpoint at the next step boundary"):
        """Handles the signals for the block (only in the main thread)."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._action = action
        previous = {number: signal.getsignal(number) for number in self.SIGNALS}
        for number in self.SIGNALS:
            signal.signal(number, self._handle)
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


def processes(strategy):
    """The processes of a JAX run (tools/jax_runtime.py); 1 on TensorFlow."""
    return getattr(strategy, "processes", 1)


class RunState(keras.callbacks.Callback):
    """Per epoch: reseeds the model's random layers (dropout) from (seed,
    epoch) so that a resumed epoch draws what the uninterrupted one drew;
    adds the learning rate to the logs; keeps the history and the training
    throughput; stops at the planned step count; saves a checkpoint at every
    epoch end, within epochs as --checkpoint_every_steps/_minutes ask, and
    on SIGTERM/SIGINT (then raises Preempted)."""

    def __init__(self, config, plan, schedule, state, strategy, record, preemption):
        super().__init__()
        self.config, self.plan, self.schedule = config, plan, schedule
        self.state, self.strategy, self.record = state, strategy, record
        self.preemption = preemption
        self._cluster = None  # TensorFlow's PreemptionCheckpointHandler, under multi_worker
        self._traced = False  # an epoch ran in this process (its functions are traced)
        # A resume inside an epoch: (epoch, steps already done in it).
        self._inside = (state["epochs_done"], state.get("steps_done", 0))

    def on_train_begin(self, logs=None):
        self._saved_at = (self._step(), time.time())  # (step, time) of the last checkpoint
        if self.config.strategy == "multi_worker" and self._cluster is None:
            self._cluster = self._cluster_preemption_handler()

    def _cluster_preemption_handler(self):
        """A SIGTERM to any worker makes every worker save at the same step
        (tf.distribute.experimental.PreemptionCheckpointHandler agrees on it
        through the coordination service); `save_fn` writes our checkpoint,
        `exit_fn` turns into Preempted at this step boundary."""
        return tf.distribute.experimental.PreemptionCheckpointHandler(
            self.strategy.cluster_resolver,
            tf.train.Checkpoint(),  # restores only its own counter; nothing saved
            checkpoint_dir=tempfile.mkdtemp(prefix="keras_lars_preemption_"),
            termination_config=tf.distribute.experimental.TerminationConfig(
                exit_fn=self._cluster_stop, save_fn=self._cluster_save
            ),
        )

    def _cluster_save(self):
        if self._done < self.plan.steps_in(self._epoch):  # else on_epoch_end saves
            self._save(self._epoch, self._done)

    def _cluster_stop(self):
        self.preemption.signal = "SIGTERM"
        print(
            "a process of the cluster received SIGTERM: every process stops at this step",
            file=sys.stderr,
            flush=True,
        )

    def on_epoch_begin(self, epoch, logs=None):
        resumed_steps = self._inside[1] if epoch == self._inside[0] else 0
        self._inside = (None, 0)
        # Keras's save_weights leaves out the generators' state: an epoch starts
        # from (seed, epoch); an epoch resumed inside, from the state saved.
        saved = self.state.get("seed_generators", {}) if resumed_steps else {}
        for variable in self._seed_generators():
            if variable.path in saved:
                variable.assign(saved[variable.path])
            else:
                # The counter of epoch e starts at (e + 1) << 32 (int64 state, on
                # TensorFlow) or (e + 1) << 20 (uint32, on JAX: 2^20 draws an
                # epoch, 4095 epochs).
                state = keras.ops.convert_to_numpy(variable)
                shift = 32 if state.dtype.itemsize == 8 else 20
                variable.assign(np.array([state[0], (epoch + 1) << shift], state.dtype))
        self._epoch, self._start, self._first_batch = epoch, time.time(), None
        self._logged_at = self._start
        self._epoch_start_step = self._step() - resumed_steps

    def _step(self):
        """The optimizer's step count (the inner optimizer's under loss
        scaling: Keras 3.8's LossScaleOptimizer.iterations stays 0)."""
        optimizer = keras_lars.callbacks.inner_optimizer(self.model.optimizer)
        return int(keras.ops.convert_to_numpy(optimizer.iterations))

    def on_train_batch_end(self, batch, logs=None):
        # Steps of this epoch run so far: from the optimizer, since Keras < 3.11
        # hands an execution's first step as `batch` (3.11+: its last).
        step = self._step()  # one read of the device counter per batch
        done = step - self._epoch_start_step
        if self._first_batch is None:  # excludes tracing and pipeline start
            self._first_batch = (done, time.time())
        self._last_batch = (done, time.time())
        steps = self.plan.steps_in(self._epoch)
        if steps < self.plan.steps_per_epoch and done >= steps:
            self.model.stop_training = True  # the end of a short last epoch
        every = self.config.log_every_seconds
        if every and not sys.stdout.isatty() and time.time() - self._logged_at >= every:
            self._logged_at = time.time()
            loss = (logs or {}).get("loss")
            shown = "" if loss is None else f", loss {float(keras.ops.convert_to_numpy(loss)):.4f}"
            print(
                f"epoch {self._epoch + 1}/{self.plan.epochs}: step {done}/{steps}{shown}",
                flush=True,
            )
        if processes(self.strategy) > 1 and not self.preemption.signal:
            from keras_lars.tools import jax_runtime

            if jax_runtime.preempted_at(step):  # every process stops at this step
                self._cluster_stop()
        if self._cluster is not None:
            self._done = done
            self._cluster.save_checkpoint_if_preempted()
            if self.preemption.signal and done < steps:
                self._stop_if_preempted(done)  # saved by _cluster_save
        if done < steps and self._checkpoint_due(step):
            self._save(self._epoch, done)
            self._stop_if_preempted(done)

    def _checkpoint_due(self, step):
        if self.preemption.signal:
            return True
        last_step, last_time = self._saved_at
        every = self.config.checkpoint_every_steps
        if every and step // every > last_step // every:
            return True
        minutes = self.config.checkpoint_every_minutes
        return bool(minutes) and time.time() - last_time >= 60 * minutes

    def _seed_generators(self):
        return [v for v in self.model.variables if v.path.endswith("seed_generator_state")]

    def _save(self, epochs_done, steps_done):
        state = dict(self.state, epochs_done=epochs_done, steps_done=steps_done)
        state["seed_generators"] = {
            v.path: keras.ops.convert_to_numpy(v).tolist() for v in self._seed_generators()
        }
        config_path = os.path.join(self.config.model_dir, CONFIG_FILE)
        first = keras_lars.distribute.is_chief(self.strategy) and not tf.io.gfile.exists(
            config_path
        )
        if first:
            storage.write_json(config_path, self.record)  # with the first checkpoint
        directory = os.path.join(self.config.model_dir, "checkpoints")
        try:
            checkpoints.save(self.model, directory, epochs_done, state, self.strategy, steps_done)
        except storage.StorageError:
            if first:  # no checkpoint: the directory stays open to other settings
                tf.io.gfile.remove(config_path)
            raise
        self._saved_at = (self._step(), time.time())
        self._saved_stem = checkpoints.stem(directory, epochs_done, steps_done)

    def _stop_if_preempted(self, done):
        if self.preemption.signal:
            raise Preempted(
                f"stopped by {self.preemption.signal} at step {self._step()} (epoch "
                f"{self._epoch + 1}, {done} of its {self.plan.steps_in(self._epoch)} steps); "
                f"checkpoint {self._saved_stem}; run the same command to resume"
            )

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        iterations = self._step()
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.schedule(iterations)))
        (first, t0), (last, t1) = self._first_batch, self._last_batch
        # convert_to_numpy: Keras 3.8 leaves a metric result that is an
        # on-read variable (compat's on_read_metric_variables) unconverted.
        record = {k: float(keras.ops.convert_to_numpy(v)) for k, v in logs.items()}
        record.update(
            epoch=epoch + 1, steps=iterations, seconds=round(time.time() - self._start, 3)
        )
        if last > first and t1 > t0:
            record["images_per_second"] = round(
                (last - first) * self.config.global_batch_size / (t1 - t0), 2
            )
        elif self._traced and t1 > self._start:
            # One execution per epoch (steps_per_execution = the epoch's
            # steps): the whole epoch's steps over its time to the last step,
            # from the second epoch of this process on (the first traces).
            record["images_per_second"] = round(
                last * self.config.global_batch_size / (t1 - self._start), 2
            )
        self._traced = True
        self.state["history"].append(record)
        self.state["epochs_done"], self.state["steps_done"] = epoch + 1, 0
        self._save(epoch + 1, 0)
        if epoch + 1 < self.plan.epochs:
            self._stop_if_preempted(self.plan.steps_in(epoch))


class ProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar (one line per epoch when not on a terminal),
    sized to each epoch's planned steps."""

    def __init__(self, plan):
        super().__init__()
        self.plan = plan

    def set_params(self, params):
        super().set_params(params)
        self.verbose = 1 if sys.stdout.isatty() else 2
        self._fit_steps = params.get("steps") or self.plan.steps_per_epoch

    def on_epoch_begin(self, epoch, logs=None):
        # The fit's own steps: fewer in an epoch resumed from inside.
        self.target = min(self.plan.steps_in(epoch), self._fit_steps)
        super().on_epoch_begin(epoch, logs)


def make_callbacks(config, plan, schedule, state, strategy, record, preemption):
    run_state = RunState(config, plan, schedule, state, strategy, record, preemption)
    callbacks = [run_state, ProgressBar(plan)]
    if config.stop_on_divergence:  # first: it raises before any checkpoint of the epoch
        callbacks.insert(0, keras_lars.DivergenceGuard())
    logs = os.path.join(config.model_dir, "logs")
    if not keras_lars.distribute.is_chief(strategy):
        return callbacks  # only the chief writes logs
    if importlib.util.find_spec("tensorboard") is None:
        print(
            "warning: the tensorboard package is not installed "
            "(pip install tensorboard): no TensorBoard logs.",
            file=sys.stderr,
        )
    else:
        callbacks.append(keras.callbacks.TensorBoard(logs, write_graph=False))
    if config.trust_ratio_log_every:
        callbacks.append(
            keras_lars.TrustRatioMonitor(
                os.path.join(logs, "trust_ratios"), config.trust_ratio_log_every
            )
        )
    return callbacks


# --- the model directory ----------------------------------------------------------------
CONFIG_FILE = "config.json"


def prepare_model_dir(config, info, strategy=None):
    """Checks that the model dir can hold this run before anything is
    trained; returns the record of the run (its settings and the data set's
    identity) that is written as config.json with the first checkpoint.

    The chief checks that the directory and checkpoints/ are writable and
    removes temporary files a killed write left there. A run already there
    must have the same settings (but the resumable ones) and data, so that
    resuming never mixes two runs."""
    record = dataclasses.asdict(config)
    record["data"] = {
        "num_classes": info.num_classes,
        "num_train": info.num_train,
        "num_eval": info.num_eval,
    }
    if keras_lars.distribute.is_chief(strategy):
        for directory in (config.model_dir, os.path.join(config.model_dir, "checkpoints")):
            storage.check_writable(directory)
            storage.remove_partials(directory)
    path = os.path.join(config.model_dir, CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        return record
    stored = storage.read_json(path)
    resumable = {f.name for f in settings.fields(config) if f.metadata["resumable"]}
    changed = [k for k, v in record.items() if k not in resumable and stored.get(k, v) != v]
    if changed:
        details = ", ".join(
            f"data: {stored[k]} there, {record[k]} now"
            if k == "data"
            else f"--{k}: {stored[k]!r} there, {record[k]!r} now"
            for k in changed
        )
        raise ConfigError(
            f"--model_dir={config.model_dir} holds a run with other settings "
            f"({details}); resume it with its flags or use another --model_dir."
        )
    return record


# --- the run ---------------------------------------------------------------------------
def make_strategy(config):
    """The strategy of --strategy, with the compat workarounds this run needs."""
    try:
        strategy = keras_lars.make_strategy(config.strategy, tpu_address=config.tpu)
    except (ValueError, keras_lars.compat.UnsupportedVersionError) as error:
        raise ConfigError(f"--strategy={config.strategy}: {error}") from None
    except (RuntimeError, tf.errors.OpError) as error:  # e.g. no TPU at --tpu
        where = f" --tpu={config.tpu}" if config.strategy == "tpu" else ""
        raise ConfigError(
            f"--strategy={config.strategy}{where}: cannot start it: {storage.first_line(error)}"
        ) from None
    replicas = strategy.num_replicas_in_sync
    needs = []
    if strategy is not tf.distribute.get_strategy():  # its input is distributed
        needs.append(("distributed_datasets_from_function", f"--strategy={config.strategy}"))
    if replicas > 1:
        needs.append(("on_read_metric_variables", f"--strategy={config.strategy}"))
    if replicas > 1 and config.steps_per_execution > 1:
        needs.append(
            ("steps_per_execution_loop", f"--steps_per_execution={config.steps_per_execution}")
        )
    if replicas > 1 and not config.sync_batch_norm:
        needs.append(("mean_batch_norm_statistics", "--nosync_batch_norm"))
    for name, flag in needs:
        try:
            keras_lars.compat.require(name, f"{flag} under {replicas} replicas")
        except keras_lars.compat.UnsupportedVersionError as error:
            raise ConfigError(str(error)) from None
    return strategy


class Diverged(Exception):
    """Training stopped at a non-finite loss or variable (DivergenceGuard)."""


def train_and_evaluate(config):
    """Trains (or resumes) the run of `config`; returns its summary dict."""
    started = time.time()
    keras.utils.set_random_seed(config.seed)
    keras.mixed_precision.set_global_policy(PRECISIONS[config.precision])
    preemption = Preemption()
    if config.backend == "jax":
        from keras_lars.tools import jax_runtime

        try:
            with preemption.handling(action="stopping the wait for the other processes"):
                jax_runtime.meet_processes(config, stop=lambda: preemption.signal)
        except InterruptedError as error:
            raise Preempted(f"{error}; nothing was trained; run the same command") from None
        jax_runtime.start_processes(config)
        data = input_pipeline.load(config)
        strategy = jax_runtime.make_devices(config, lambda: variable_shapes(config, data.info))
        where = f"--distribution={config.distribution}"
        print(f"{where}: {strategy.description}", flush=True)
    else:
        if config.strategy == "multi_worker":
            wait_for_workers(config, preemption)
        strategy, where = make_strategy(config), f"--strategy={config.strategy}"
        data = input_pipeline.load(config)
    replicas = strategy.num_replicas_in_sync
    if config.global_batch_size % replicas:
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size} is not divisible by "
            f"the {replicas} replicas of {where}."
        )
    plan = make_plan(config, data.info.num_train)
    record = prepare_model_dir(config, data.info, strategy)
    chief = keras_lars.distribute.is_chief(strategy)
    with storage.exclusive(config.model_dir) if chief else contextlib.nullcontext():
        return _train(config, strategy, data, plan, record, started, preemption)


def variable_shapes(config, info):
    """{path: shape} of the model's variables (a model built and dropped)."""
    shapes = {v.path: tuple(v.shape) for v in create_model(config, info.num_classes).weights}
    keras.backend.clear_session()
    keras.utils.set_random_seed(config.seed)
    return shapes


def wait_for_workers(config, preemption):
    """Waits for the other tasks of TF_CONFIG, interruptible (TensorFlow's own
    wait, in the strategy's start, is neither logged nor interruptible)."""
    try:
        with preemption.handling(action="stopping the wait for the other workers"):
            keras_lars.distribute.wait_for_workers(
                60 * config.worker_start_timeout_minutes,
                log=lambda line: print(line, flush=True),
                stop=lambda: preemption.signal,
            )
    except ValueError as error:  # TF_CONFIG
        raise ConfigError(f"--strategy=multi_worker: {error}") from None
    except InterruptedError as error:
        raise Preempted(f"{error}; nothing was trained; run the same command to start") from None
    except TimeoutError as error:
        raise ConfigError(
            f"--worker_start_timeout_minutes={config.worker_start_timeout_minutes:g}: {error}"
        ) from None
    except OSError as error:  # this task's own address is taken
        raise ConfigError(f"--strategy=multi_worker: {error}") from None


def _train(config, strategy, data, plan, record, started, preemption):
    """Fits, and on divergence rolls back to the last good checkpoint with a
    lower rate (--divergence_rollbacks) or raises Diverged."""
    checkpoint_dir = os.path.join(config.model_dir, "checkpoints")
    rollback = None  # after a divergence: {"rate_factor": f, "rollbacks": n}
    while True:
        try:
            state = _fit(config, strategy, data, plan, record, preemption, rollback)
            return write_summary(config, plan, state, time.time() - started, strategy)
        except keras_lars.NonFiniteLossError as error:
            state = error.run_state
            saved = checkpoints.saved(checkpoint_dir)
            last = (
                f"{checkpoints.stem(checkpoint_dir, *saved[-1])} (epoch {saved[-1][0]}"
                + (f", step {saved[-1][1]} of the next)" if saved[-1][1] else ")")
                if saved
                else "none (no checkpoint yet)"
            )
            used = state.get("rollbacks", 0)
            if used >= config.divergence_rollbacks:
                raise Diverged(f"{error}; last good checkpoint: {last}") from None
            factor = state.get("rate_factor", 1.0) * config.divergence_rate_factor
            rollback = {"rate_factor": factor, "rollbacks": used + 1}
            print(
                f"warning: {error}; rolling back to {last if saved else 'the start'} with "
                f"the peak learning rate x{factor:g} (rollback {used + 1} of "
                f"{config.divergence_rollbacks})",
                file=sys.stderr,
                flush=True,
            )
            keras.backend.clear_session()
            keras.utils.set_random_seed(config.seed)


def _fit(config, strategy, data, plan, record, preemption, rollback=None):
    """Builds the model, restores the latest checkpoint and trains to the
    end; returns the run's state. `rollback` overrides the restored rate
    factor and rollback count."""
    checkpoint_dir = os.path.join(config.model_dir, "checkpoints")

    def build(rate_factor):
        schedule = keras_lars.WarmupPolyDecay(
            config.peak_learning_rate * rate_factor,
            plan.warmup_steps,
            plan.total_steps,
            power=2.0,
            end_learning_rate=config.end_learning_rate * rate_factor,
        )
        with strategy.scope():
            model = compiled_model(config, data.info.num_classes, schedule)
            state = checkpoints.restore(model, checkpoint_dir)
        return schedule, model, state or {"epochs_done": 0, "steps_done": 0, "history": []}

    factor = rollback["rate_factor"] if rollback else 1.0
    schedule, model, state = build(factor)
    if not rollback and state.get("rate_factor", 1.0) != factor:  # resumed after a rollback
        keras.backend.clear_session()
        keras.utils.set_random_seed(config.seed)
        schedule, model, state = build(state["rate_factor"])
    state.update(rollback or {})
    start, skip = state["epochs_done"], state.get("steps_done", 0)
    if start or skip:
        inside = f", step {skip} of epoch {start + 1}" if skip else ""
        print(f"resuming {config.model_dir} after epoch {start}{inside}", flush=True)

    if start < plan.epochs:
        validation, validation_steps = None, []
        if config.eval:

            def evaluation(context):
                validation_steps.append(
                    data.eval_steps(config.global_batch_size, context.num_input_pipelines)
                )
                return data.eval(config.global_batch_size, context)

            validation = strategy.distribute_datasets_from_function(evaluation)
        callbacks = make_callbacks(config, plan, schedule, state, strategy, record, preemption)

        def fit(first_epoch, end_epoch, steps_per_epoch, skip=0):
            train = strategy.distribute_datasets_from_function(
                train_stream(data, plan, first_epoch, config.global_batch_size, skip, end_epoch)
            )
            model.fit(
                train,
                epochs=end_epoch,
                initial_epoch=first_epoch,
                steps_per_epoch=steps_per_epoch,
                validation_data=validation,
                # Given exactly: left to find the end of a dataset from a
                # function, Keras 3.15 evaluated extra batches under
                # MirroredStrategy in our runs.
                validation_steps=validation_steps[0] if validation_steps else None,
                shuffle=False,
                callbacks=callbacks,
                verbose=0,
            )

        # One process of a cluster cannot stop alone: there TensorFlow's
        # PreemptionCheckpointHandler or JAX's preemption sync point (RunState)
        # takes SIGTERM.
        single_process = config.strategy != "multi_worker" and processes(strategy) == 1
        try:
            with preemption.handling(enabled=single_process):
                if skip:  # the rest of the epoch a checkpoint was taken inside
                    fit(start, start + 1, plan.steps_in(start) - skip, skip)
                    start += 1
                if start < plan.epochs:
                    fit(start, plan.epochs, plan.steps_per_epoch)
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
            _explain_data_error(data, config, error)
            raise
        except keras_lars.NonFiniteLossError as error:
            error.run_state = state  # the rate factor and rollbacks used
            raise
    return state


def _explain_data_error(data, config, error):
    """Turns a failure while reading records into a DataError naming the file."""
    files = data.info.train_files + data.info.eval_files
    if not files:
        return
    print(
        f"reading the data failed ({storage.first_line(error)}); "
        f"looking for the bad record in {len(files)} files...",
        file=sys.stderr,
    )
    bad = input_pipeline.find_bad_record(files, config.label_offset, data.info.num_classes)
    if bad is not None:
        path, index, message = bad
        raise input_pipeline.DataError(f"{path}: record {index}: {message}") from None


def write_summary(config, plan, state, wall_seconds, strategy=None):
    history = state["history"]
    final = dict(history[-1]) if history else {}
    rates = [h["images_per_second"] for h in history if "images_per_second" in h]
    summary = {
        "final": {k: v for k, v in final.items() if k not in ("seconds", "images_per_second")},
        "epochs": plan.epochs,
        "steps": plan.total_steps,
        "steps_per_epoch": plan.steps_per_epoch,
        "warmup_steps": plan.warmup_steps,
        "train_images_per_second": round(sorted(rates)[len(rates) // 2], 2) if rates else None,
        "wall_seconds_this_process": round(wall_seconds, 2),
        "history": history,
        "config": dataclasses.asdict(config),
    }
    if keras_lars.distribute.is_chief(strategy):
        storage.write_json(os.path.join(config.model_dir, "summary.json"), summary)
    shown = " ".join(
        f"{k}={v:.4f}"
        for k, v in summary["final"].items()
        if k not in ("epoch", "steps", "learning_rate")
    )
    print(
        f"final: model={config.model} optimizer={config.optimizer} "
        f"epochs={plan.epochs} steps={plan.total_steps} {shown} "
        f"images_per_second={summary['train_images_per_second']} "
        f"model_dir={config.model_dir}",
        flush=True,
    )
    return summary


def use_backend(wanted, module):
    """Makes sure Keras runs on `wanted` (None: the configured backend): the
    program restarts itself (`python -m module` with the same arguments)
    with KERAS_BACKEND=wanted if Keras was loaded with another one, and exits
    with one error line on a backend the tools do not run on."""
    loaded = keras.backend.backend()
    if wanted and wanted != loaded:
        sys.stdout.flush(), sys.stderr.flush()
        command = [sys.executable, "-m", module, *sys.argv[1:]]
        os.execve(sys.executable, command, dict(os.environ, KERAS_BACKEND=wanted))
    if loaded not in BACKENDS:
        sys.exit(
            f"error: Keras's backend is {loaded!r} (KERAS_BACKEND or ~/.keras/keras.json); "
            f"the tools run on {' or '.join(BACKENDS)}: set --backend or KERAS_BACKEND."
        )


def lost_peer(error, values):
    """The one line for `error` when it says that another worker or process
    of the run died (a collective failed: TensorFlow's Unavailable or
    Aborted under --strategy=multi_worker, a JAX runtime error with several
    processes), naming the checkpoint a rerun resumes from; None otherwise."""
    causes = [error]  # and what failed a checkpoint's write (Keras's fit drops __cause__)
    while (causes[-1].__cause__ or causes[-1].__context__) and len(causes) < 8:
        causes.append(causes[-1].__cause__ or causes[-1].__context__)
    if keras.backend.backend() == "jax":
        from keras_lars.tools import jax_runtime

        found = [c for c in causes if jax_runtime.collective_failed(c)]
        who = "processes"
    else:
        collective = (tf.errors.UnavailableError, tf.errors.AbortedError)
        cluster = values["strategy"] == "multi_worker"
        found = [c for c in causes if cluster and isinstance(c, collective)]
        who = "workers"
    if not found:
        return None
    directory = os.path.join(values["model_dir"], "checkpoints")
    saved = checkpoints.saved(directory)
    resumes = (
        f"its last checkpoint, {checkpoints.stem(directory, *saved[-1])}" if saved else "the start"
    )
    cause = storage.first_line(found[0])[:300].rstrip(":")
    return (
        f"a step across the run's {who} failed, most likely because another one stopped "
        f"({cause}); run every one again with the same command: the run resumes from {resumes}"
    )


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    values, given = settings.from_flags(Config)
    use_backend(values["backend"], "keras_lars.tools.train")
    try:
        train_and_evaluate(config_from_flags(values, given))
    except Preempted as error:
        print(f"preempted: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_PREEMPTED)
    except Exception as error:
        line = lost_peer(error, values)
        if line:
            sys.stdout.flush()
            print(f"error: {line}", file=sys.stderr, flush=True)
            if keras.backend.backend() == "jax":
                # jax.distributed's shutdown at exit would wait for the lost
                # process until its heartbeat timeout, then abort.
                os._exit(EXIT_PREEMPTED)
            sys.exit(EXIT_PREEMPTED)
        known = (
            ConfigError,
            Diverged,
            input_pipeline.DataError,
            storage.StorageError,
            checkpoints.CheckpointError,
        )
        if isinstance(error, known):
            sys.exit(f"error: {error}")
        raise


def run(argv=None):
    """The keras-lars-train entry point."""
    settings.define_flags(Config)
    app.run(main, argv)


if __name__ == "__main__":
    run()
