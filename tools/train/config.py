"""What the run is: every setting of the training tool, declared once.

`Config` is the settings table (name, type, default, help, check); the flags,
config.json, the study's cell keys and docs/flags.md derive from it.
`config_from_flags` (resolve.py) turns flag values into a Config.

Nothing here imports Keras, TensorFlow or JAX (the names, facts and checks
it needs are plain Python), so that keras-lars-train checks its flags before
they load (cli.py).
"""

import dataclasses
import math
import os

from keras_lars import models
from keras_lars.scaling import linear_scaling
from keras_lars.tools import settings
from keras_lars.tools.datasets import DATASETS
from keras_lars.tools.schedule_flags import batch_schedule
from keras_lars.tools.schedule_flags import schedule_settings
from keras_lars.tools.schedule_flags import take_first_phases
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import between
from keras_lars.tools.settings import greater_than
from keras_lars.tools.settings import in_interval
from keras_lars.tools.settings import one_of
from keras_lars.tools.settings import setting
from keras_lars.tools.train.cluster import CLUSTERS
from keras_lars.tools.train.cluster import PORTS_PER_JOB
from keras_lars.validation import ALLREDUCE_DTYPES

MODELS = models.NAMES
OPTIMIZERS = ("lars", "lamb", "sgd", "nesterov", "adam")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")
BACKENDS = ("tensorflow", "jax")
DISTRIBUTIONS = ("none", "data_parallel", "model_parallel")
PRECISIONS = {
    "float32": "float32",
    "float64": "float64",
    "bfloat16": "mixed_bfloat16",
    "float16": "mixed_float16",
}
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
        return linear_scaling(base, global_batch_size, REFERENCE_BATCH)
    if rule == "sqrt":
        return base * math.sqrt(global_batch_size / REFERENCE_BATCH)
    if rule == "none":
        return base
    raise ValueError(f"`rule` must be one of {SCALING_RULES}; got {rule!r}.")


def _needs(condition, requirement):
    """A check of a setting against the rest of the config."""
    return lambda value, config: None if condition(value, config) else requirement


def _evaluation_problem(value, config, valid, requirement):
    """--eval_every_steps / --target_accuracy: `requirement` unless `valid`;
    any nonzero value needs --eval."""
    if not valid:
        return requirement
    if value and not config.eval:
        return "needs --eval (it is read on the evaluation split)"
    return None


def _accumulation_problem(value, config):
    """--gradient_accumulation_steps: >= 1, dividing the global batch, one
    batch for the whole run, and no loss scaling."""
    if value < 1:
        return "must be >= 1"
    if value == 1:
        return None
    if config.global_batch_size % value:
        return f"does not divide --global_batch_size={config.global_batch_size}"
    if config.batch_schedule or config.image_size_schedule:
        return "takes one batch for the whole run: leave --batch_schedule and --image_size_schedule"
    if config.precision == "float16":
        return "is not combined with --precision=float16 (loss scaling); use bfloat16"
    return None


ADAPTIVE_BATCH = ("off", "adascale", "linear", "sqrt", "none")


def _adaptive_problem(value, config):
    """--adaptive_batch: a noise-scale source, one batch flag, epochs."""
    if value == "off":
        return None
    if config.backend == "jax" and config.distribution != "none":
        return (
            "measures the noise scale on one device on --backend=jax: leave --distribution at none"
        )
    if config.backend == "jax" and config.gradient_accumulation_steps == 1:
        return (
            "measures the noise scale from two gradient sizes: give "
            "--gradient_accumulation_steps >= 2 on --backend=jax"
        )
    if config.strategy == "default" and config.gradient_accumulation_steps == 1:
        return (
            "measures the noise scale from two gradient sizes: give "
            "--gradient_accumulation_steps >= 2 on one device, or --strategy=mirrored / "
            "multi_worker with >= 2 replicas"
        )
    if config.batch_schedule or config.image_size_schedule:
        return "decides the batch itself: leave --batch_schedule and --image_size_schedule"
    if config.steps_per_execution != 1:
        return "needs --steps_per_execution=1 (the steps of an epoch change with the batch)"
    if not config.adaptive_batch_max:
        return "needs --adaptive_batch_max, the largest global batch to grow to"
    return _counted_in_epochs(config)


def _adaptive_bound(name):
    """--adaptive_batch_min / _max: 0 (min: --global_batch_size) or a batch
    that --gradient_accumulation_steps divides, min <= the start <= max."""

    def problem(value, config):
        if value < 0:
            return "must be >= 0"
        k = config.gradient_accumulation_steps
        if value % k:
            return f"is not divisible by --gradient_accumulation_steps={k}"
        low, high = config.adaptive_batch_min, config.adaptive_batch_max
        if name == "min" and high and low > high:
            return f"exceeds --adaptive_batch_max={high}"
        if name == "min" and low > config.global_batch_size:
            return f"exceeds --global_batch_size={config.global_batch_size}, the batch to start at"
        if name == "max" and value and value < config.global_batch_size:
            return f"is below --global_batch_size={config.global_batch_size}, the batch to start at"
        return None

    return problem


def _end_rate(value, config):
    """The end rate: >= 0 and at most the peak the schedule decays from."""
    problem = at_least(0)(value, config)
    if problem is None and value > config.peak_learning_rate:
        problem = (
            f"must be <= the peak rate {config.peak_learning_rate:g} (--base_learning_rate="
            f"{config.base_learning_rate:g} scaled by --lr_scaling={config.lr_scaling} for "
            f"--global_batch_size={config.global_batch_size})"
        )
    return problem


def _counted_in_epochs(config):
    if config.train_steps:
        return "counts epochs: leave --train_steps at 0 and give --train_epochs"
    return None


_BATCH_SCHEDULE, _IMAGE_SIZE_SCHEDULE = schedule_settings(
    epochs_flag="train_epochs",
    batch_phase="each phase feeds its own batches to its own compiled step and the rate "
    "follows the epochs done (keras_lars.EpochWarmupPolyDecay)",
    size_phase="each phase reads its images at its size",
    size_problem=between(8, 4096),
    counting_problem=_counted_in_epochs,
)


def _cluster_check(value, config):
    """--cluster other than auto: multi-worker TensorFlow, or SLURM's JAX processes."""
    if value == "auto" or (config.backend == "tensorflow" and config.strategy == "multi_worker"):
        return None
    if config.backend == "jax":
        return None if value == "slurm" else "needs --backend=tensorflow --strategy=multi_worker"
    return f"needs --strategy=multi_worker, not --strategy={config.strategy}"


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of a training run: one declaration each (name, type,
    default, help, check). Flags, config.json, the study's cell keys and
    docs/flags.md are derived from these fields. Checked on construction
    (ConfigError naming the flag); image_size=0 and model_dir="" resolve to
    the data set's defaults. `--recipe` is applied by `config_from_flags`."""

    model: str = setting("resnet20", "Network (keras_lars.models).", choices=MODELS)
    optimizer: str = setting(
        "lars",
        "lars: keras_lars.LARS; lamb: keras_lars.LAMB; sgd / nesterov: momentum "
        "SGD with the same coupled weight decay (LARS with layer adaptation off); adam: "
        "Adam with LAMB's decoupled weight decay, i.e. AdamW (LAMB with layer adaptation "
        "off; --momentum is its beta_1).",
        choices=OPTIMIZERS,
    )
    global_batch_size: int = setting(
        128,
        "Images per step over all replicas. With --batch_schedule: the first phase's batch "
        "(left at its default it takes it).",
        check=at_least(1),
    )
    gradient_accumulation_steps: int = setting(
        1,
        "Micro-batches per update: each step feeds --global_batch_size / this images and "
        "the optimizer applies the mean gradient of this many (Keras's "
        "gradient_accumulation_steps); steps, the schedule and checkpoints count updates. "
        "Batch norm normalises each micro-batch by its own statistics.",
        check=lambda value, c: _accumulation_problem(value, c),
    )
    noise_scale: bool = setting(
        False,
        "Measure the gradient noise scale B_simple (McCandlish et al. 2018) from each "
        "replica's gradient and the all-reduced one, or from the micro-batches of "
        "--gradient_accumulation_steps (keras_lars.NoiseScaleMonitor): noise_scale, "
        "noise_scale_gradient_sq and noise_scale_trace (moving averages, lagged) in the "
        "history and TensorBoard, and each epoch's own B_simple, noise_scale_interval, with "
        "its standard error noise_scale_interval_error (not with --adaptive_batch, whose "
        "decisions log theirs as adaptive_noise_scale).",
    )
    adaptive_batch: str = setting(
        "off",
        "Let the measured gradient noise scale set the global batch "
        "(keras_lars.AdaptiveBatchSize): every --adaptive_batch_every_epochs epochs the batch "
        "becomes --adaptive_batch_target x B_simple of those epochs, within "
        "--adaptive_batch_min, --adaptive_batch_max and a factor --adaptive_batch_growth, and "
        "the rate the schedule's times the rule named here: adascale: AdaScale's gain ratio; "
        "linear / sqrt: B / --global_batch_size or its root; none: unchanged. Measured like "
        "--noise_scale (replicas, or the micro-batches of --gradient_accumulation_steps, "
        "whose number stays: the micro-batch grows with the batch).",
        choices=ADAPTIVE_BATCH,
        check=lambda value, c: _adaptive_problem(value, c),
    )
    adaptive_batch_every_epochs: int = setting(
        1, "With --adaptive_batch: epochs between decisions.", check=at_least(1)
    )
    adaptive_batch_min: int = setting(
        0,
        "With --adaptive_batch: the smallest global batch (0: --global_batch_size).",
        check=lambda value, c: _adaptive_bound("min")(value, c),
    )
    adaptive_batch_max: int = setting(
        0,
        "With --adaptive_batch: the largest global batch (the device memory bounds it: at "
        "most what fits, times --gradient_accumulation_steps, times the replicas).",
        check=lambda value, c: _adaptive_bound("max")(value, c),
    )
    adaptive_batch_growth: float = setting(
        2.0,
        "With --adaptive_batch: the most one decision changes the batch by, up or down.",
        check=greater_than(1),
    )
    adaptive_batch_target: float = setting(
        1.0,
        "With --adaptive_batch: the target batch as a multiple of the measured B_simple.",
        check=greater_than(0),
    )
    batch_schedule: str = _BATCH_SCHEDULE
    image_size_schedule: str = _IMAGE_SIZE_SCHEDULE
    batch_coupling: str = setting(
        "grow",
        "With --batch_schedule, the rate where the batch changes: grow: the curve of the "
        "epochs done, unchanged (growth replaces decay, Smith et al. 2018); linear / sqrt: "
        "scaled by B_k / B_0 or its root (B_0 the first phase's batch).",
        choices=("grow", "linear", "sqrt"),
    )
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
        1e-4, "Rate at the end of the polynomial decay.", check=_end_rate
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
        "scaling); variables and logits stay float32. float64: everything in "
        "float64 but the optimizers' norms (float32), where summation order "
        "flips a ReLU far more rarely: for checking a distribution against "
        "one device (docs/jax.md says where float64 still parted).",
        choices=PRECISIONS,
        check=_needs(
            lambda value, c: (
                value != "float64" or (c.backend == "jax" and c.distribution != "model_parallel")
            ),
            "float64 runs on --backend=jax only, and not with --distribution=model_parallel "
            "(there its sharded variables start from other initial values than on one device)",
        ),
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
        "devices (keras.distribution; tools/train/runtime_jax.py).",
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
    layout: str = setting(
        "",
        "--distribution=model_parallel: a layout file of keras-lars-plan --layout_out (the "
        "mesh and each variable's sharding; tools/layout_file.py), in place of "
        "--model_axis_size's rule.",
        check=_needs(
            lambda value, c: not value or c.distribution == "model_parallel",
            "needs --backend=jax --distribution=model_parallel",
        ),
        resumable=True,
    )
    coordinator_address: str = setting(
        None,
        "--backend=jax with several processes: host:port of process 0 (jax.distributed); "
        "default: $JAX_COORDINATOR_ADDRESS.",
        resumable=True,
        per_process=True,
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
        per_process=True,
    )
    allreduce_dtype: str = setting(
        "float32",
        "Precision of the gradients' cross-replica sum (Jia et al. 2018): bfloat16 and "
        "float16 halve the bytes on the wire; float16 scales each gradient by a power of "
        "two first (keras_lars.LARS/LAMB `allreduce_dtype`).",
        choices=tuple(dtype for dtype in ALLREDUCE_DTYPES if dtype),
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
        "fashion_mnist: Fashion-MNIST's IDX files (apt-get install dataset-fashion-mnist, "
        "or --data_dir); "
        "imagenet: ImageNet-format TFRecords in --data_dir (train-*, validation-*); "
        "synthetic: random images of ImageNet's sizes, for throughput.",
        choices=DATASETS,
    )
    data_dir: str = setting(
        None,
        "Directory (or bucket) of the TFRecord shards, or of Fashion-MNIST's four .gz files "
        "(default /usr/share/datasets/fashion-mnist).",
        resumable=True,
    )
    label_offset: int = setting(
        1,
        "Subtracted from image/class/label: 1 for labels 1..N (tensorflow/tpu, "
        "keras-lars-make-tfrecords), 0 for 0..N-1.",
        check=one_of(0, 1),
    )
    image_size: int = setting(
        0,
        "Input side in pixels (8 to 4096); 0: the data set's (8 for digits, 28 for "
        "fashion_mnist, 224 otherwise).",
        check=between(8, 4096),
    )
    num_classes: int = setting(
        0, "Classes; 0: the data set's (dataset.json, 1000, 10).", check=at_least(0)
    )
    train_examples: int = setting(
        0,
        "Training examples per epoch; 0: the data set's (digits, fashion_mnist: its first N).",
        check=at_least(0),
    )
    eval_examples: int = setting(
        0,
        "Evaluation examples; 0: the data set's (digits, fashion_mnist: its first N).",
        check=at_least(0),
    )
    validation_examples: int = setting(
        0,
        "digits, fashion_mnist: hold out this many training images, drawn by "
        "--validation_seed, as the evaluation split (--train_examples then cuts the rest): "
        "every evaluation, --target_accuracy and --collapse_patience read them, and the test "
        "split (--eval_examples) is evaluated once, where the target is reached "
        "(summary.json's target: test_accuracy). 0: evaluate on the test split.",
        check=_needs(
            lambda value, c: value >= 0 and (not value or c.dataset in ("digits", "fashion_mnist")),
            "must be >= 0, and held out of an in-memory data set (digits, fashion_mnist)",
        ),
    )
    validation_seed: int = setting(
        0,
        "The seed of --validation_examples' draw: fixed, not --seed, so every run holds out "
        "the same images.",
        check=between(0, 2**31 - 1),
    )
    sync_batch_norm: bool = setting(
        False,
        "Batch-norm statistics over all replicas.",
        check=_needs(
            lambda value, c: not value or models.has_batch_norm(c.model),
            "the --model has no batch norm",
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
    save_weights_at_steps: tuple = setting(
        (),
        "Also save the model's weights after these optimizer steps (0: before the first) as "
        "weights/step-<n>.weights.h5 in --model_dir, kept (unlike the checkpoints): for "
        "measurements at fixed weights, e.g. keras_lars.measure_noise_scale. Empty: none.",
        check=lambda value, c: next(
            (f"{v!r} is not a step (an integer >= 0)" for v in value if not str(v).isdigit()), None
        ),
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
        per_process=True,
    )
    cluster: str = setting(
        "auto",
        "Where the other workers are (tools/train/cluster.py, docs/launchers.md): tf_config: "
        "TF_CONFIG (by hand, Kubeflow, Vertex AI; a chief task writes the model dir); slurm: the "
        "tasks of this srun step (TensorFlow's SlurmClusterResolver; on --backend=jax, the "
        "processes as jax.distributed detects them); auto: TF_CONFIG if set, else SLURM.",
        choices=CLUSTERS,
        check=_cluster_check,
        resumable=True,
        per_process=True,
    )
    cluster_port_base: int = setting(
        0,
        "--cluster=slurm on TensorFlow: the first port of the tasks on each node (a task "
        "listens on it plus its index on the node); 0: 12000 + 16 * (SLURM_JOB_ID mod 1250).",
        check=_needs(
            lambda value, c: value == 0 or 1024 <= value <= 65535 - PORTS_PER_JOB,
            f"must be 0 or in [1024, {65535 - PORTS_PER_JOB}]",
        ),
        resumable=True,
    )
    worker_start_timeout_minutes: float = setting(
        10.0,
        "--strategy=multi_worker (and JAX's processes): how long to wait for the other tasks "
        "to start (a 'waiting for' line every 30 s; SIGTERM/Ctrl-C stop the wait), and then "
        "for TensorFlow's or jax.distributed's own start of them (past it, one line and the "
        "tool ends; SIGINT/SIGHUP, or SIGTERM to the process group, end that start at once).",
        check=greater_than(0),
        resumable=True,
        per_process=True,
    )
    steps_per_execution: int = setting(
        1, "Steps per compiled call (large on TPUs).", check=at_least(1), resumable=True
    )
    eval: bool = setting(True, "Evaluate after every epoch.", resumable=True)
    eval_every_steps: int = setting(
        0,
        "If > 0, also evaluate within epochs every that many steps (at the next execution "
        "boundary), on the whole evaluation split; each evaluation goes to summary.json's "
        "evaluations. 0: at epoch ends only.",
        check=lambda value, c: _evaluation_problem(value, c, value >= 0, "must be >= 0"),
    )
    target_accuracy: float = setting(
        0.0,
        "If > 0, stop once the evaluation split's top-1 accuracy reaches it (checked at "
        "every evaluation: epoch ends and --eval_every_steps); summary.json and the final "
        "line record the steps, examples and seconds to it, or that it was not reached. "
        "0: no target.",
        check=lambda value, c: _evaluation_problem(
            value, c, 0 <= value <= 1, "must be in (0, 1] (0: no target)"
        ),
    )
    collapse_patience: int = setting(
        0,
        "With --target_accuracy: stop as not reached once this many evaluations in a row "
        "score at most chance (1.5 / classes) after one scored above twice that: the network "
        "collapsed (its output the same for every input, so no gradient brings it back). "
        "Chance assumes balanced classes in the evaluation split. 0: train on to the end.",
        check=_needs(
            lambda value, c: value >= 0 and (value == 0 or c.target_accuracy),
            "must be >= 0, and it needs --target_accuracy",
        ),
        resumable=True,
    )
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
        take_first_phases(self)
        if self.backend is None:
            object.__setattr__(self, "backend", settings.keras_backend())
        if self.image_size == 0 and self.dataset in DATASETS:
            default = DATASETS[self.dataset].default_image_size
            object.__setattr__(self, "image_size", default)
        if not self.model_dir:
            object.__setattr__(self, "model_dir", os.path.join("runs", str(self.dataset)))
        settings.check(self)
        for name in DATASETS[self.dataset].required_settings:
            if not getattr(self, name):
                raise ConfigError(f"--{name} is required with --dataset={self.dataset}.")

    @property
    def batch_phases(self):
        """The keras_lars.BatchSchedule of --batch_schedule and
        --image_size_schedule, or None when neither is given."""
        return batch_schedule(self, self.global_batch_size)

    @property
    def micro_batch_size(self):
        """Images per step (per micro-batch) over all replicas."""
        return self.global_batch_size // self.gradient_accumulation_steps

    @property
    def peak_learning_rate(self):
        return scaled_learning_rate(
            self.base_learning_rate, self.global_batch_size, self.lr_scaling
        )


# On JAX, the processes' settings not given as flags come from these variables.
