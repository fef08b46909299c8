"""Trains an image classifier with LARS, LAMB or momentum SGD.

    python -m tools.train            # ResNet-18 on scikit-learn's digits, 1-1.5 min on 2 cores

With no flags it trains ResNet-18 at 32x32 with LARS and the warmup +
polynomial-decay schedule on scikit-learn's handwritten digits (1797 8x8
images shipped with scikit-learn, upsampled; nothing is downloaded),
evaluates on a fixed held-out fifth after every epoch, and writes
checkpoints, TensorBoard logs and summary.json to runs/digits. Rerunning
the same command resumes from the last checkpoint (also after a kill) and
ends with the same result as an uninterrupted run.

    # ResNet-50 on ImageNet TFRecords, the MLPerf LARS recipe for the batch
    python -m tools.train --dataset=imagenet --data_dir=/data/imagenet \\
        --model=resnet50 --global_batch_size=1024 --recipe=mlperf \\
        --precision=bfloat16 --model_dir=runs/resnet50

    # on a TPU pod slice, data and model dir in a bucket
    python -m tools.train --strategy=tpu --tpu=local --dataset=imagenet \\
        --data_dir=gs://bucket/imagenet --model_dir=gs://bucket/runs/r50 \\
        --model=resnet50 --global_batch_size=32768 --recipe=mlperf \\
        --precision=bfloat16 --steps_per_execution=39 --sync_batch_norm

The program reads top to bottom: flags -> Config (validated once) -> data,
strategy, model, optimizer -> fit with checkpoints -> summary. Flags are
parsed only in main(); everything below it takes the frozen Config.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
try:
    import tensorflow as tf
except ImportError:
    sys.exit('error: the training tool needs TensorFlow: pip install -e ".[cpu,tools]" '
             "(or .[tensorflow], .[tpu]).")

import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

import keras_lars  # noqa: E402
import models  # noqa: E402
from tools import checkpoints  # noqa: E402
from tools import input_pipeline  # noqa: E402

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
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
RECIPES = ("none", "mlperf")
DEFAULT_IMAGE_SIZE = {"digits": 32, "imagenet": 224, "synthetic": 224}

# --- flags (read only in main) --------------------------------------------------
flags.DEFINE_enum("model", "resnet18", list(MODELS), "Network (models/).")
flags.DEFINE_enum(
    "optimizer", "lars", OPTIMIZERS,
    "lars: keras_lars.LARS; lamb: keras_lars.LAMB; sgd / nesterov: momentum SGD "
    "with the same coupled weight decay (LARS with layer adaptation off).",
)
flags.DEFINE_integer("global_batch_size", 128, "Images per step over all replicas.")
flags.DEFINE_float(
    "base_learning_rate", 10.0,
    "Peak learning rate per 256 images: peak = base * global_batch_size / 256 "
    "(keras_lars.linear_scaling). Ignored with --recipe=mlperf unless given.",
)
flags.DEFINE_enum(
    "recipe", "none", RECIPES,
    "mlperf: peak rate, warmup, epochs, momentum, weight decay and label "
    "smoothing of the MLPerf ResNet-50 LARS table for the global batch "
    "(keras_lars.resnet50_lars_recipe); flags given explicitly still win.",
)
flags.DEFINE_float("end_learning_rate", 1e-4, "Rate at the end of the polynomial decay.")
flags.DEFINE_float("warmup_epochs", 2.0, "Linear warmup length in epochs (may be fractional).")
flags.DEFINE_integer("train_epochs", 15, "Training length in epochs.")
flags.DEFINE_integer("train_steps", 0, "If > 0, training length in steps (overrides --train_epochs).")
flags.DEFINE_float("momentum", 0.9, "Momentum (lars, sgd, nesterov) or LAMB's beta_1.")
flags.DEFINE_float("weight_decay", 1e-4, "Coupled L2 weight decay; biases and batch norm excluded.")
flags.DEFINE_float("trust_coefficient", 0.001, "LARS trust coefficient eta.")
flags.DEFINE_float("label_smoothing", 0.0, "Label smoothing of the cross-entropy (0.1 in MLPerf).")
flags.DEFINE_enum(
    "precision", "float32", list(PRECISIONS),
    "bfloat16 / float16: Keras mixed precision (float16 adds loss scaling); "
    "variables and logits stay float32.",
)
flags.DEFINE_enum(
    "strategy", "default", STRATEGIES,
    "default: one device; mirrored: all local GPUs; multi_worker: the cluster "
    "of TF_CONFIG; tpu: the TPU at --tpu (keras_lars.make_strategy).",
)
flags.DEFINE_string("tpu", None, "TPU name, grpc://address or 'local' (default: $TPU_NAME).")
flags.DEFINE_enum(
    "dataset", "digits", list(input_pipeline.DATASETS),
    "digits: scikit-learn's handwritten digits (nothing downloaded); imagenet: "
    "ImageNet-format TFRecords in --data_dir (train-*, validation-*); synthetic: "
    "random images of ImageNet's sizes, for throughput.",
)
flags.DEFINE_string("data_dir", None, "Directory (or bucket) of the TFRecord shards.")
flags.DEFINE_integer(
    "label_offset", 1,
    "Subtracted from image/class/label: 1 for labels 1..N (tensorflow/tpu, "
    "tools/make_tfrecords.py), 0 for 0..N-1.",
)
flags.DEFINE_integer("image_size", 0, "Input side in pixels; 0: 32 for digits, 224 otherwise.")
flags.DEFINE_integer("num_classes", 0, "Classes; 0: the data set's (dataset.json, 1000, 10).")
flags.DEFINE_integer("train_examples", 0, "Training examples per epoch; 0: the data set's.")
flags.DEFINE_integer("eval_examples", 0, "Evaluation examples; 0: the data set's.")
flags.DEFINE_bool("sync_batch_norm", False, "Batch-norm statistics over all replicas.")
flags.DEFINE_string(
    "model_dir", None,
    "Checkpoints, TensorBoard logs (logs/), summary.json; rerunning resumes. "
    "Default: runs/<dataset>.",
)
flags.DEFINE_integer("steps_per_execution", 1, "Steps per compiled call (large on TPUs).")
flags.DEFINE_bool("eval", True, "Evaluate after every epoch.")
flags.DEFINE_bool("run_eagerly", False, "Debugging: run the train step eagerly (no tracing).")
flags.DEFINE_integer("seed", 0, "Seed of the weights, data order and augmentation.")
flags.DEFINE_integer(
    "trust_ratio_log_every", 0,
    "If > 0, log LARS/LAMB per-layer trust ratios to TensorBoard every that "
    "many steps (keras_lars.TrustRatioMonitor).",
)


class ConfigError(ValueError):
    """A bad flag value; the message names the flag."""


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a run depends on, resolved from the flags."""

    model: str = "resnet18"
    optimizer: str = "lars"
    global_batch_size: int = 128
    peak_learning_rate: float = 5.0
    end_learning_rate: float = 1e-4
    warmup_epochs: float = 2.0
    train_epochs: int = 15
    train_steps: int = 0
    momentum: float = 0.9
    weight_decay: float = 1e-4
    trust_coefficient: float = 0.001
    label_smoothing: float = 0.0
    precision: str = "float32"
    strategy: str = "default"
    tpu: str = None
    dataset: str = "digits"
    data_dir: str = None
    label_offset: int = 1
    image_size: int = 32
    num_classes: int = 0
    train_examples: int = 0
    eval_examples: int = 0
    sync_batch_norm: bool = False
    model_dir: str = "runs/digits"
    steps_per_execution: int = 1
    eval: bool = True
    run_eagerly: bool = False
    seed: int = 0
    trust_ratio_log_every: int = 0

    def __post_init__(self):
        def need(condition, flag, requirement, value=None):
            if not condition:
                value = getattr(self, flag) if value is None else value
                raise ConfigError(f"--{flag}={value}: {requirement}.")

        for flag, choices in (("model", MODELS), ("optimizer", OPTIMIZERS),
                              ("strategy", STRATEGIES), ("precision", PRECISIONS),
                              ("dataset", input_pipeline.DATASETS)):
            need(getattr(self, flag) in choices, flag, f"expected one of {', '.join(choices)}")
        need(self.global_batch_size >= 1, "global_batch_size", "must be >= 1")
        need(self.peak_learning_rate > 0, "base_learning_rate",
             "the peak learning rate must be > 0", self.peak_learning_rate)
        need(self.end_learning_rate >= 0, "end_learning_rate", "must be >= 0")
        need(self.warmup_epochs >= 0, "warmup_epochs", "must be >= 0")
        need(self.train_steps > 0 or self.train_epochs >= 1, "train_epochs", "must be >= 1")
        need(self.train_steps >= 0, "train_steps", "must be >= 0 (0: use --train_epochs)")
        need(0 <= self.momentum < 1, "momentum", "must be in [0, 1)")
        need(self.optimizer != "nesterov" or self.momentum > 0, "momentum",
             "nesterov needs momentum > 0")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(self.trust_coefficient > 0, "trust_coefficient", "must be > 0")
        need(0 <= self.label_smoothing < 1, "label_smoothing", "must be in [0, 1)")
        need(self.image_size >= 8, "image_size", "must be >= 8")
        need(self.num_classes >= 0, "num_classes", "must be >= 0 (0: the data set's)")
        need(self.label_offset in (0, 1), "label_offset", "must be 0 or 1")
        need(self.steps_per_execution >= 1, "steps_per_execution", "must be >= 1")
        need(self.trust_ratio_log_every >= 0, "trust_ratio_log_every", "must be >= 0")
        need(self.trust_ratio_log_every == 0 or self.optimizer in ("lars", "lamb"),
             "trust_ratio_log_every", "trust ratios exist for lars and lamb only")
        need(self.dataset != "imagenet" or bool(self.data_dir), "data_dir",
             "--dataset=imagenet reads TFRecords from --data_dir")
        need(not (self.sync_batch_norm and self.model == "alexnet"), "sync_batch_norm",
             "alexnet has no batch norm")
        need(bool(self.model_dir), "model_dir", "must be a directory path")


def config_from_flags(values, given=()):
    """The Config of the flag values `values` (a dict); `given`: the names of
    the flags set on the command line (they win over --recipe)."""
    v = dict(values)
    dataset = v["dataset"]
    if v["global_batch_size"] < 1:
        raise ConfigError(f"--global_batch_size={v['global_batch_size']}: must be >= 1.")
    if v["base_learning_rate"] <= 0 and (v["recipe"] == "none" or "base_learning_rate" in given):
        raise ConfigError(f"--base_learning_rate={v['base_learning_rate']}: must be > 0.")
    peak = keras_lars.linear_scaling(max(v["base_learning_rate"], 0.0), v["global_batch_size"])
    if v["recipe"] == "mlperf":
        if v["optimizer"] != "lars":
            raise ConfigError(
                f"--recipe=mlperf is a LARS recipe; --optimizer={v['optimizer']} "
                "needs its own --base_learning_rate, --warmup_epochs, ..."
            )
        recipe = keras_lars.resnet50_lars_recipe(v["global_batch_size"])
        if "base_learning_rate" not in given:
            peak = recipe.peak_learning_rate
        for flag, value in (("warmup_epochs", recipe.warmup_epochs),
                            ("train_epochs", int(recipe.train_epochs)),
                            ("momentum", recipe.momentum),
                            ("weight_decay", recipe.weight_decay),
                            ("label_smoothing", recipe.label_smoothing),
                            ("end_learning_rate", recipe.end_learning_rate)):
            if flag not in given:
                v[flag] = value
    fields = {field.name for field in dataclasses.fields(Config)}
    resolved = {name: value for name, value in v.items() if name in fields}
    resolved.update(
        peak_learning_rate=peak,
        image_size=v["image_size"] or DEFAULT_IMAGE_SIZE[dataset],
        model_dir=v["model_dir"] or os.path.join("runs", dataset),
    )
    return Config(**resolved)


# --- the run's length --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Plan:
    """Steps: an epoch is one pass over the training set (drop remainder)."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int

    @property
    def epochs(self):
        return -(-self.total_steps // self.steps_per_epoch)

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
    warmup = int(math.floor(config.warmup_epochs * per_epoch + 0.5))
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
            schedule, beta_1=config.momentum, weight_decay=config.weight_decay,
            exclude_rank_one=True, record_trust_ratios=record,
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
            keras.ops.one_hot(labels, self.num_classes), logits,
            from_logits=True, label_smoothing=self.label_smoothing,
        )

    def get_config(self):
        return {"num_classes": self.num_classes, "label_smoothing": self.label_smoothing,
                "name": self.name}


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
def train_stream(data, plan, start_epoch, global_batch_size):
    """Returns fn(input_context) -> the batches of epochs start_epoch.. in
    order, each epoch `data.train(epoch)` cut to its steps."""

    def make(input_context):
        local_replicas = (input_context.num_replicas_in_sync
                          // input_context.num_input_pipelines)
        stream = None
        for epoch in range(start_epoch, plan.epochs):
            batches = data.train(epoch, global_batch_size, input_context)
            batches = batches.take(plan.steps_in(epoch) * local_replicas)
            stream = batches if stream is None else stream.concatenate(batches)
        return stream

    return make


# --- callbacks ------------------------------------------------------------------------
class RunState(keras.callbacks.Callback):
    """Per epoch: reseeds the model's random layers (dropout) from (seed,
    epoch) so that a resumed epoch draws what the uninterrupted one drew;
    adds the learning rate to the logs; keeps the history and the training
    throughput; stops at the planned step count; saves a checkpoint."""

    def __init__(self, config, plan, schedule, state, strategy):
        super().__init__()
        self.config, self.plan, self.schedule = config, plan, schedule
        self.state, self.strategy = state, strategy

    def on_epoch_begin(self, epoch, logs=None):
        for variable in self.model.variables:
            if variable.path.endswith("seed_generator_state"):
                first = keras.ops.convert_to_numpy(variable)[0]
                variable.assign([first, (epoch + 1) << 32])
        self._epoch, self._start, self._first_batch = epoch, time.time(), None
        self._epoch_start_step = self._step()

    def _step(self):
        """The optimizer's step count (the inner optimizer's under loss
        scaling: Keras 3.8's LossScaleOptimizer.iterations stays 0)."""
        optimizer = keras_lars.callbacks.inner_optimizer(self.model.optimizer)
        return int(keras.ops.convert_to_numpy(optimizer.iterations))

    def on_train_batch_end(self, batch, logs=None):
        # Steps of this epoch run so far: from the optimizer, since Keras < 3.11
        # hands an execution's first step as `batch` (3.11+: its last).
        done = self._step() - self._epoch_start_step
        if self._first_batch is None:  # excludes tracing and pipeline start
            self._first_batch = (done, time.time())
        self._last_batch = (done, time.time())
        steps = self.plan.steps_in(self._epoch)
        if steps < self.plan.steps_per_epoch and done >= steps:
            self.model.stop_training = True  # the end of a short last epoch

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        iterations = self._step()
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.schedule(iterations)))
        (first, t0), (last, t1) = self._first_batch, self._last_batch
        # convert_to_numpy: Keras 3.8 leaves a metric result that is an
        # on-read variable (compat's on_read_metric_variables) unconverted.
        record = {k: float(keras.ops.convert_to_numpy(v)) for k, v in logs.items()}
        record.update(epoch=epoch + 1, steps=iterations,
                      seconds=round(time.time() - self._start, 3))
        if last > first and t1 > t0:
            record["images_per_second"] = round(
                (last - first) * self.config.global_batch_size / (t1 - t0), 2
            )
        self.state["history"].append(record)
        self.state["epochs_done"] = epoch + 1
        checkpoints.save(self.model, os.path.join(self.config.model_dir, "checkpoints"),
                         epoch + 1, self.state, self.strategy)


class ProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar (one line per epoch when not on a terminal),
    sized to each epoch's planned steps."""

    def __init__(self, plan):
        super().__init__()
        self.plan = plan

    def set_params(self, params):
        super().set_params(params)
        self.verbose = 1 if sys.stdout.isatty() else 2

    def on_epoch_begin(self, epoch, logs=None):
        self.target = self.plan.steps_in(epoch)
        super().on_epoch_begin(epoch, logs)


def make_callbacks(config, plan, schedule, state, strategy):
    callbacks = [RunState(config, plan, schedule, state, strategy), ProgressBar(plan)]
    logs = os.path.join(config.model_dir, "logs")
    if not keras_lars.distribute.is_chief(strategy):
        return callbacks  # only the chief writes logs
    if importlib.util.find_spec("tensorboard") is None:
        print("warning: the tensorboard package is not installed "
              "(pip install tensorboard): no TensorBoard logs.", file=sys.stderr)
    else:
        callbacks.append(keras.callbacks.TensorBoard(logs, write_graph=False))
    if config.trust_ratio_log_every:
        callbacks.append(keras_lars.TrustRatioMonitor(
            os.path.join(logs, "trust_ratios"), config.trust_ratio_log_every))
    return callbacks


# --- the model directory ----------------------------------------------------------------
RUN_ONLY_FIELDS = ("model_dir", "steps_per_execution", "trust_ratio_log_every", "eval",
                   "run_eagerly", "data_dir", "tpu", "strategy")


def check_model_dir(config, strategy=None):
    """Records the config in model_dir/config.json, or checks that a run
    already there was started with the same settings (so resuming never
    mixes two runs and nothing there is overwritten)."""
    path = os.path.join(config.model_dir, "config.json")
    current = dataclasses.asdict(config)
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as f:
            stored = json.load(f)
        changed = [k for k, v in current.items()
                   if k not in RUN_ONLY_FIELDS and stored.get(k, v) != v]
        if changed:
            details = ", ".join(f"--{k}: {stored[k]!r} there, {current[k]!r} now"
                                for k in changed)
            raise ConfigError(
                f"--model_dir={config.model_dir} holds a run with other settings "
                f"({details}); resume it with its flags or use another --model_dir."
            )
        return
    if keras_lars.distribute.is_chief(strategy):
        _write_json(path, current)


def _write_json(path, value):
    """Writes `value` to `path` under a temporary name, then renames."""
    tf.io.gfile.makedirs(os.path.dirname(path) or ".")
    with tf.io.gfile.GFile(path + ".partial", "w") as f:
        json.dump(value, f, indent=1)
    tf.io.gfile.rename(path + ".partial", path, overwrite=True)


# --- the run ---------------------------------------------------------------------------
def make_strategy(config):
    """The strategy of --strategy, with the compat workarounds this run needs."""
    try:
        strategy = keras_lars.make_strategy(config.strategy, tpu_address=config.tpu)
    except (ValueError, keras_lars.compat.UnsupportedVersionError) as error:
        raise ConfigError(f"--strategy={config.strategy}: {error}") from None
    replicas = strategy.num_replicas_in_sync
    needs = []
    if strategy is not tf.distribute.get_strategy():  # its input is distributed
        needs.append(("distributed_datasets_from_function", f"--strategy={config.strategy}"))
    if replicas > 1:
        needs.append(("on_read_metric_variables", f"--strategy={config.strategy}"))
    if replicas > 1 and config.steps_per_execution > 1:
        needs.append(("steps_per_execution_loop", f"--steps_per_execution={config.steps_per_execution}"))
    if replicas > 1 and not config.sync_batch_norm:
        needs.append(("mean_batch_norm_statistics", "--nosync_batch_norm"))
    for name, flag in needs:
        try:
            keras_lars.compat.require(name, f"{flag} under {replicas} replicas")
        except keras_lars.compat.UnsupportedVersionError as error:
            raise ConfigError(str(error)) from None
    return strategy


def train_and_evaluate(config):
    """Trains (or resumes) the run of `config`; returns its summary dict."""
    started = time.time()
    keras.utils.set_random_seed(config.seed)
    keras.mixed_precision.set_global_policy(PRECISIONS[config.precision])
    strategy = make_strategy(config)
    replicas = strategy.num_replicas_in_sync
    if config.global_batch_size % replicas:
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size} is not divisible by "
            f"the {replicas} replicas of --strategy={config.strategy}."
        )
    data = input_pipeline.load(
        config.dataset, config.data_dir, config.image_size, config.num_classes,
        config.label_offset, config.seed, config.train_examples, config.eval_examples,
    )
    num_classes = data.info.num_classes
    plan = make_plan(config, data.info.num_train)
    check_model_dir(config, strategy)
    schedule = keras_lars.WarmupPolyDecay(
        config.peak_learning_rate, plan.warmup_steps, plan.total_steps,
        power=2.0, end_learning_rate=config.end_learning_rate,
    )

    with strategy.scope():
        model = compiled_model(config, num_classes, schedule)
        state = checkpoints.restore(model, os.path.join(config.model_dir, "checkpoints"))
    state = state or {"epochs_done": 0, "history": []}
    start = state["epochs_done"]
    if start:
        print(f"resuming {config.model_dir} after epoch {start}", flush=True)

    if start < plan.epochs:
        train = strategy.distribute_datasets_from_function(
            train_stream(data, plan, start, config.global_batch_size))
        validation, validation_steps = None, []
        if config.eval:

            def evaluation(context):
                validation_steps.append(data.eval_steps(
                    config.global_batch_size, context.num_input_pipelines))
                return data.eval(config.global_batch_size, context)

            validation = strategy.distribute_datasets_from_function(evaluation)
        callbacks = make_callbacks(config, plan, schedule, state, strategy)
        try:
            model.fit(
                train,
                epochs=plan.epochs,
                initial_epoch=start,
                steps_per_epoch=plan.steps_per_epoch,
                validation_data=validation,
                # Given exactly: left to find the end of a dataset from a
                # function, Keras 3.15 evaluated extra batches under
                # MirroredStrategy in our runs.
                validation_steps=validation_steps[0] if validation_steps else None,
                shuffle=False,
                callbacks=callbacks,
                verbose=0,
            )
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
            _explain_data_error(data, config, error)
            raise
    return write_summary(config, plan, state, time.time() - started, strategy)


def _explain_data_error(data, config, error):
    """Turns a failure while reading records into a DataError naming the file."""
    files = data.info.train_files + data.info.eval_files
    if not files:
        return
    print(f"reading the data failed ({input_pipeline.first_line(error)}); "
          f"looking for the bad record in {len(files)} files...", file=sys.stderr)
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
        _write_json(os.path.join(config.model_dir, "summary.json"), summary)
    shown = " ".join(f"{k}={v:.4f}" for k, v in summary["final"].items()
                     if k not in ("epoch", "steps", "learning_rate"))
    print(f"final: model={config.model} optimizer={config.optimizer} "
          f"epochs={plan.epochs} steps={plan.total_steps} {shown} "
          f"images_per_second={summary['train_images_per_second']} "
          f"model_dir={config.model_dir}", flush=True)
    return summary


def parsed_flags():
    """(every flag's value by name, the names given on the command line)."""
    values = {name: flags.FLAGS[name].value for name in flags.FLAGS}
    given = {name for name in flags.FLAGS if flags.FLAGS[name].present}
    return values, given


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if keras.backend.backend() != "tensorflow":
        sys.exit(f"error: the training tool runs on Keras's TensorFlow backend; "
                 f"KERAS_BACKEND is {keras.backend.backend()!r}: unset it or set it to tensorflow.")
    values, given = parsed_flags()
    try:
        config = config_from_flags(values, given)
        train_and_evaluate(config)
    except (ConfigError, input_pipeline.DataError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    app.run(main)
