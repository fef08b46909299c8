"""The one place for workarounds of Keras / TensorFlow bugs (most of them
in distributed training).

Nothing is patched at import. One documented call installs every
workaround that the installed versions need:

    import keras_lars
    keras_lars.compat.apply()          # or: with keras_lars.compat.patched(): ...
    keras_lars.compat.apply(behaviour_changes=False)   # crash fixes only

`keras_lars.make_strategy` calls it for the strategies that need it (on one
device, call it yourself: `iterations_after_data` concerns every strategy).
`apply()` is idempotent; `unapply()` restores Keras's own code, and
`unpatched()` runs a block on Keras's own code (tests use it to show each
bug's symptom).

Each workaround is registered in `WORKAROUNDS` with its upstream issue, the
versions of Keras (or TensorFlow) that have the symptom (`since` <= version
< `fixed_in`), the versions its patch was verified on (`verified`), and a
`shape` check of the internals it replaces. It is installed only where the
symptom is, on the TensorFlow backend, and only if the installed version
is inside `verified` and its target still has the shape it was written
for. Otherwise it is not installed: `apply()` warns once (`CompatWarning`)
and the keras_lars features that need it refuse with
`UnsupportedVersionError`, via `require()`. Installing is logged once per
workaround on the "keras_lars" logger.

Two kinds: "crash" fixes make something work that fails on Keras's own
code; "behaviour" changes alter numbers Keras computes without failing
(batch-norm statistics and evaluate/predict, the step count, where
clipping happens). `apply(behaviour_changes=False)` (and
`make_strategy(..., behaviour_changes=False)`) installs the crash fixes
only. `table()` renders the registry as Markdown (the README's table).
"""

import contextlib
import dataclasses
import functools
import inspect
import itertools
import logging
import warnings
from collections.abc import Callable

import keras

from keras_lars._environment import _version

_LOG = logging.getLogger("keras_lars")

# The Keras and TensorFlow versions every patch below was verified on (the
# version matrix of noxfile.py), as inclusive (major, minor) ranges.
KERAS_VERIFIED = ((3, 8), (3, 15))
TENSORFLOW_VERIFIED = ((2, 17), (2, 21))


class CompatWarning(UserWarning):
    """A needed workaround was not installed (version or shape mismatch)."""


class UnsupportedVersionError(RuntimeError):
    """A keras_lars feature needs a workaround that is not installed."""


def _installed_version(package):
    if package == "keras":
        return _version(keras.__version__)
    import tensorflow as tf

    return _version(tf.__version__)


def _dotted(version):
    return ".".join(str(part) for part in version)


def _package_name(package):
    return "Keras" if package == "keras" else "TensorFlow"


@dataclasses.dataclass(frozen=True)
class Workaround:
    """One upstream bug and its patch.

    `install()` patches and returns the function that undoes it; `shape()`
    returns None when the patch's targets look as written for, else what
    differs. `package` ("keras" or "tensorflow") has the symptom for
    `since` <= version < `fixed_in` (None: not fixed yet); the patch was
    verified on `verified` (inclusive (major, minor) bounds of `package`).
    `reproduced`: where the symptom was seen; `kind`: "crash" or
    "behaviour"; `symptom`: what happens without it.
    """

    name: str
    issues: str
    symptom: str
    kind: str
    install: Callable[[], Callable[[], None]]
    shape: Callable[[], str | None]
    package: str = "keras"
    since: tuple = (3, 0)
    fixed_in: tuple | None = None
    verified: tuple = KERAS_VERIFIED
    reproduced: str = ""

    def needed(self):
        """Whether the installed versions have the symptom."""
        if keras.backend.backend() != "tensorflow":
            return False
        version = _installed_version(self.package)
        return version >= self.since and (self.fixed_in is None or version < self.fixed_in)

    def problem(self):
        """None if the patch can be installed here, else why not."""
        version = _installed_version(self.package)
        low, high = self.verified
        if not low <= version[:2] <= high:
            return (
                f"{_package_name(self.package)} {_dotted(version)} is outside the "
                f"versions it was verified on ({_dotted(low)} to {_dotted(high)})"
            )
        mismatch = self.shape()
        if mismatch:
            where = f"{_package_name(self.package)} {_dotted(version)}"
            return f"its target changed in {where}: {mismatch}"
        return None

    def describe_versions(self):
        """'Keras 3.8 to 3.15' style text of the verified range."""
        low, high = self.verified
        return f"{_package_name(self.package)} {_dotted(low)} to {_dotted(high)}"


def _signature_mismatch(owner, attribute, parameters):
    """None if `owner.attribute` is a function taking exactly `parameters`
    (names, in order; None: any), else a sentence saying what differs."""
    target = getattr(owner, attribute, None)
    label = f"{getattr(owner, '__name__', owner)}.{attribute}"
    if target is None:
        return f"{label} does not exist"
    if parameters is None:
        return None if callable(target) else f"{label} is not a function"
    try:
        found = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return f"{label} is not a function"
    if found != list(parameters):
        return f"{label} takes ({', '.join(found)}), expected ({', '.join(parameters)})"
    return None


def _first_mismatch(*checks):
    """The first non-None of several (owner, attribute, parameters) checks."""
    for owner, attribute, parameters in checks:
        mismatch = _signature_mismatch(owner, attribute, parameters)
        if mismatch:
            return mismatch
    return None


def _trainer_module():
    from keras.src.backend.tensorflow import trainer

    return trainer


def _swap(owner, attribute, replacement):
    """Sets `owner.attribute = replacement`; returns the undo function, which
    restores the attribute (or removes it, if `owner` only inherited it)."""
    own = attribute in vars(owner)
    original = vars(owner).get(attribute)
    setattr(owner, attribute, replacement)

    def undo():
        if own:
            setattr(owner, attribute, original)
        else:
            delattr(owner, attribute)

    return undo


def replicas_in_sync():
    """The number of replicas of the current tf.distribute context (1 on
    other backends, or outside any strategy)."""
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is not None:
        return context.num_replicas_in_sync
    return tf.distribute.get_strategy().num_replicas_in_sync


# --- keras#20585 / tensorflow#72388 (1): the symbolic build ------------------
def _install_symbolic_build_batch():
    """fit()/evaluate() build the model from a first batch, which Keras takes
    as `strategy.reduce("MEAN", batch, axis=None)` of the whole distributed
    (x, y, sample_weight) structure. Under MultiWorkerMirroredStrategy that
    reduce is a collective on a nested structure and fails; it is also
    needless, since only the shapes and dtypes are used. The patch hands
    Keras the first local replica's batch instead."""
    import tensorflow as tf

    trainer_class = _trainer_module().TensorFlowTrainer
    original = trainer_class._maybe_symbolic_build

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None and self._distribute_strategy is not None:
            strategy = self.distribute_strategy
            for item in iterator:
                # Keras 3.7-3.10 yield (step, batches), 3.11+ (begin, end, batches).
                if not isinstance(item, tuple) or len(item) not in (2, 3):
                    raise UnsupportedVersionError(
                        "keras_lars.compat's `symbolic_build_batch` expected Keras's "
                        "epoch iterator to yield (step, batches) or (begin, end, "
                        f"batches), got {type(item).__name__} on Keras {keras.__version__}; "
                        "it was verified on "
                        f"{_BY_NAME['symbolic_build_batch'].describe_versions()}."
                    )
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0],
                    next(item[-1]),
                )
                break
            iterator = None
        return original(self, iterator=iterator, data_batch=data_batch)

    return _swap(trainer_class, "_maybe_symbolic_build", _maybe_symbolic_build)


def _shape_symbolic_build_batch():
    return _signature_mismatch(
        _trainer_module().TensorFlowTrainer,
        "_maybe_symbolic_build",
        ["self", "iterator", "data_batch"],
    )


# --- keras#20585 / tensorflow#72388 (2): metric reduction ----------------------
def _install_multi_worker_metrics():
    """After each step Keras averages the per-replica logs; in multi-worker
    mode it calls `strategy.reduce("MEAN", v, axis=0)`, which fails on the
    scalar loss and metrics. The replica mean Keras means here (the one it
    computes for single-worker strategies, `reduce_mean(values, axis=0)`
    over replicas) is `strategy.reduce("MEAN", v, axis=None)`."""
    trainer = _trainer_module()
    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and (
            trainer._collective_all_reduce_multi_worker(strategy)
        ):
            return keras.tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    return _swap(trainer, "reduce_per_replica", reduce_per_replica)


def _shape_multi_worker_metrics():
    trainer = _trainer_module()
    return _first_mismatch(
        (trainer, "reduce_per_replica", ["values", "strategy", "reduction"]),
        (trainer, "_collective_all_reduce_multi_worker", ["strategy"]),
    )


# --- keras#19246: steps_per_execution > 1 ------------------------------------
def _install_steps_per_execution_loop():
    """Keras runs the steps of one execution inside a `tf.while_loop` as a
    `tf.cond` branch, carrying the outputs in an Optional whose element spec
    it sets while tracing. With several replicas (Mirrored or
    MultiWorkerMirrored) the traced graph ends up with an unfed placeholder
    in that cond: "You must feed a value for placeholder tensor
    'while/cond/Placeholder'". The patch builds the multi-step function
    without either: one step, then a while loop whose condition is "another
    batch and fewer than steps_per_execution steps" (the cond was redundant
    with it) and whose body runs the step, carrying the outputs as plain
    loop variables. Single steps and other strategies keep Keras's code."""
    import tensorflow as tf

    trainer = _trainer_module()
    trainer_class = trainer.TensorFlowTrainer
    original = trainer_class._make_function
    mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)

    def _make_function(self, step_function):
        strategy = self.distribute_strategy
        if self.steps_per_execution == 1 or not isinstance(strategy, mirrored):
            return original(self, step_function)

        def one_step_on_data(data):
            outputs = strategy.run(step_function, args=(data,))
            return trainer.reduce_per_replica(outputs, strategy, reduction="auto")

        if not self.run_eagerly:
            one_step_on_data = tf.function(
                one_step_on_data, reduce_retracing=True, jit_compile=self.jit_compile
            )
        if hasattr(self, "_autoconvert_optionals"):  # Keras 3.12+ does this too
            one_step_on_data = self._autoconvert_optionals(one_step_on_data)

        def multi_step_on_iterator(iterator):
            steps = self.steps_per_execution

            def next_or_empty(step, current):
                """The next batch as an Optional; empty once `steps` ran."""
                return tf.cond(
                    step < steps,
                    iterator.get_next_as_optional,
                    lambda: tf.experimental.Optional.empty(current.element_spec),
                )

            # The first step runs outside the loop so that the loop has the
            # outputs' structure; get_next() raises OutOfRangeError (the end
            # of the epoch for Keras) when no worker has data left.
            outputs = one_step_on_data(iterator.get_next())

            def body(step, outputs, batch):
                outputs = one_step_on_data(batch.get_value())
                return step + 1, outputs, next_or_empty(step + 1, batch)

            _, outputs, _ = tf.while_loop(
                lambda step, outputs, batch: batch.has_value(),
                body,
                (tf.constant(1), outputs, iterator.get_next_as_optional()),
            )
            return outputs

        if not self.run_eagerly:
            multi_step_on_iterator = tf.function(
                multi_step_on_iterator, reduce_retracing=True, autograph=False
            )

        def function(iterator):
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                return multi_step_on_iterator(iterator)
            for _, data in zip(range(self.steps_per_execution), iterator):
                outputs = one_step_on_data(data)
            return outputs

        return function

    return _swap(trainer_class, "_make_function", _make_function)


def _shape_steps_per_execution_loop():
    trainer = _trainer_module()
    return _first_mismatch(
        (trainer.TensorFlowTrainer, "_make_function", ["self", "step_function"]),
        (trainer, "reduce_per_replica", ["values", "strategy", "reduction"]),
    )


# --- clipping after the all-reduce (keras_lars optimizers only) ---------------
def _install_clip_after_all_reduce():
    """Keras 3 clips gradients (`clipnorm`, `global_clipnorm`, `clipvalue`)
    in `apply()`, inside each replica, before the optimizer's all-reduce: a
    replica then clips its own partial gradient (its batch's gradient over
    the number of replicas) and the clipping threshold means something else
    for every replica count (TF-Keras refused clipping under a strategy for
    this reason, tensorflow#33929). For LARS and LAMB users (LAMB runs with
    global_clipnorm=1 in the BERT recipe) the patch clips the all-reduced
    gradient g = sum_r g_r instead, as on one device:
    global_clipnorm: g_i * min(1, c / ||(g_1..g_n)||). Only
    `keras_lars.LayerwiseOptimizer` subclasses are changed."""
    import tensorflow as tf

    from keras_lars.layerwise import LayerwiseOptimizer

    clip = LayerwiseOptimizer._clip_gradients
    all_reduce = LayerwiseOptimizer._all_reduce_sum_gradients

    def several_replicas():
        return tf.distribute.get_replica_context() is not None and replicas_in_sync() > 1

    def _clip_gradients(self, grads):
        return grads if several_replicas() else clip(self, grads)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        clip_here = several_replicas()
        grads_and_vars = all_reduce(self, grads_and_vars)
        if not clip_here:
            return grads_and_vars
        grads = clip(self, [g for g, _ in grads_and_vars])
        return list(zip(grads, [v for _, v in grads_and_vars]))

    undo_clip = _swap(LayerwiseOptimizer, "_clip_gradients", _clip_gradients)
    undo_reduce = _swap(LayerwiseOptimizer, "_all_reduce_sum_gradients", _all_reduce_sum_gradients)

    def undo():
        undo_reduce()
        undo_clip()

    return undo


def _shape_clip_after_all_reduce():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return _first_mismatch(
        (keras.optimizers.Optimizer, "_clip_gradients", ["self", "grads"]),
        (TFOptimizer, "_all_reduce_sum_gradients", ["self", "grads_and_vars"]),
    )


# --- tensorflow#62790: several MirroredStrategy objects in one process --------
_KEY_RANGE = 100_000  # collective group keys reserved for each MirroredStrategy
_KEY_RANGES = itertools.count(1)  # shared by every install: keys are never reused


def _install_distinct_collective_keys():
    """Every MirroredStrategy numbers its collective groups from
    1 + MirroredStrategy._collective_key_base, which is 0, so a second
    strategy in the same process reuses the first one's group and instance
    keys: as soon as it trains another model, its all-reduces fail with
    "Shape mismatch in the collective instance 100" (TensorFlow's own tests
    raise that base before each strategy for this reason). The patch gives
    each new MirroredStrategy a key range of its own. MultiWorkerMirrored
    strategies are left alone (their workers must agree on the keys)."""
    from tensorflow.python.distribute import mirrored_strategy

    extended = mirrored_strategy.MirroredExtended
    original = extended._make_collective_ops_with_fallbacks

    def _make_collective_ops_with_fallbacks(self):
        self._collective_key_base += _KEY_RANGE * next(_KEY_RANGES)
        return original(self)

    return _swap(
        extended, "_make_collective_ops_with_fallbacks", _make_collective_ops_with_fallbacks
    )


def _shape_distinct_collective_keys():
    from tensorflow.python.distribute import mirrored_strategy

    if not isinstance(
        getattr(mirrored_strategy.MirroredStrategy, "_collective_key_base", None), int
    ):
        return "MirroredStrategy._collective_key_base is not an integer"
    return _signature_mismatch(
        mirrored_strategy.MirroredExtended, "_make_collective_ops_with_fallbacks", ["self"]
    )


# --- keras#20134: fit() on strategy.distribute_datasets_from_function ---------
def _install_distributed_datasets_from_function():
    """Keras before 3.9 does not recognise the dataset that
    `strategy.distribute_datasets_from_function` returns (its
    `is_tf_dataset` knows DatasetV2 and DistributedDataset only), so
    `fit()` on it fails with "Unrecognized data type". keras PR #20829
    (Keras 3.9) adds the class to that list; so does the patch."""
    from keras.src.trainers import data_adapters

    original = data_adapters.is_tf_dataset

    def is_tf_dataset(x):
        return original(x) or any(
            parent.__name__ == "DistributedDatasetsFromFunction"
            and parent.__module__.startswith("tensorflow.python.")
            for parent in type(x).__mro__
        )

    return _swap(data_adapters, "is_tf_dataset", is_tf_dataset)


def _shape_distributed_datasets_from_function():
    from keras.src.trainers import data_adapters

    return _signature_mismatch(data_adapters, "is_tf_dataset", ["x"])


# --- keras#21054: metric state under several replicas before Keras 3.10 -------
def _install_on_read_metric_variables():
    """Keras before 3.10 creates a metric's state variables (totals,
    counts) with the default synchronization, so under several replicas
    each replica's update is merged into every copy and the losses and
    metrics that fit() and evaluate() report are wrong (evaluate gives
    another loss and accuracy than on one device, with the same weights).
    Keras 3.10 creates them on-read (each replica accumulates its own part,
    a read from outside sums them); so does the patch, through a variable
    creator around `Metric.add_variable` (and around the later creation of
    a variable whose creation Keras defers, as for compiled metrics)."""
    import tensorflow as tf
    from keras.src.metrics.metric import Metric

    original = Metric.add_variable

    def on_read(next_creator, **kwargs):
        kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
        return next_creator(**kwargs)

    def add_variable(self, *args, **kwargs):
        with tf.variable_creator_scope(on_read):
            variable = original(self, *args, **kwargs)
        if variable._value is None:  # deferred: created on first use
            initialize = variable._initialize

            def initialize_on_read(value):
                with tf.variable_creator_scope(on_read):
                    return initialize(value)

            variable._initialize = initialize_on_read
        return variable

    return _swap(Metric, "add_variable", add_variable)


def _shape_on_read_metric_variables():
    from keras.src.backend.tensorflow.core import Variable
    from keras.src.metrics.metric import Metric

    return _first_mismatch(
        (Metric, "add_variable", ["self", "shape", "initializer", "dtype", "aggregation", "name"]),
        (Variable, "_initialize", ["self", "value"]),
    )


# --- moving statistics of unsynchronized batch norm under several replicas ----
_STATISTICS = ("moving_mean", "moving_variance", "moving_stddev", "renorm_mean", "renorm_stddev")


def _install_mean_batch_norm_statistics():
    """Keras 3 creates a BatchNormalization's moving statistics with
    aggregation "none", so under a strategy with several replicas and
    `synchronized=False` each replica updates its own copy from its own
    batches: the copies drift apart, and get_weights(), saving and
    checkpoints keep replica 0's copy only. TF-Keras 2 created them
    synchronized on read with aggregation MEAN, and so does the patch
    (moving_mean, moving_variance and the renorm statistics of layers built
    under a strategy with more than one replica; `synchronized=True` layers,
    whose copies are equal anyway, and single-replica builds are left alone).

    Semantics: in a training step replica r updates its own copy m_r as on
    one device, m_r <- momentum * m_r + (1 - momentum) * mean(batch_r),
    with no communication. Reading from outside the steps (get_weights,
    numpy(), saving .keras / .weights.h5, tf.train.Checkpoint) gives
    (1/R) sum_r m_r, which (the update being linear) is the moving average
    of the replicas' mean batch statistics. Assigning or restoring from
    outside sets every copy to the value. `evaluate()` and `predict()`
    first set every copy to that mean, so that they use the statistics a
    saved model has (TF-Keras 2 used each replica's copy there, cf.
    tensorflow#46488); this leaves the mean, and so training, unchanged.
    Under MultiWorkerMirroredStrategy reading the mean is a collective:
    every worker must save (read) together, as the chief-aware savers of
    keras_lars do."""
    import tensorflow as tf
    from keras.src.layers.normalization.batch_normalization import BatchNormalization

    original = BatchNormalization.build

    def on_read(next_creator, **kwargs):
        if kwargs.get("name") in _STATISTICS:
            kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
            kwargs["aggregation"] = tf.VariableAggregation.MEAN
        return next_creator(**kwargs)

    def build(self, input_shape):
        if self.synchronized or tf.distribute.get_strategy().num_replicas_in_sync == 1:
            return original(self, input_shape)
        with tf.variable_creator_scope(on_read):
            original(self, input_shape)
        for name in _STATISTICS:  # Keras's own record (and a deferred creation) agree
            variable = getattr(self, name, None)
            if variable is not None:
                variable._synchronization, variable._aggregation = "on_read", "mean"

    def statistics(model):
        for layer in model._flatten_layers():
            if isinstance(layer, BatchNormalization):
                for name in _STATISTICS:
                    variable = getattr(layer, name, None)
                    # `_synchronization`: set by build() above (Keras 3.8 has no
                    # Variable.synchronization; 3.10+ reads this attribute).
                    if getattr(variable, "_synchronization", None) == "on_read":
                        yield variable

    def averaging_copies_first(run):
        @functools.wraps(run)
        def method(self, *args, **kwargs):
            for variable in statistics(self):  # read: the mean; assign: every copy
                variable.assign(variable.value.read_value())
            return run(self, *args, **kwargs)

        return method

    trainer_class = _trainer_module().TensorFlowTrainer
    undo = [_swap(BatchNormalization, "build", build)]
    for name in ("evaluate", "predict"):
        method = averaging_copies_first(getattr(trainer_class, name))
        undo.append(_swap(trainer_class, name, method))

    def undo_all():
        for step in reversed(undo):
            step()

    return undo_all


def _shape_mean_batch_norm_statistics():
    from keras.src.layers.normalization.batch_normalization import BatchNormalization

    trainer_class = _trainer_module().TensorFlowTrainer
    if "synchronized" not in inspect.signature(BatchNormalization.__init__).parameters:
        return "BatchNormalization takes no `synchronized` argument"
    if not hasattr(keras.Model, "_flatten_layers"):
        return "Model._flatten_layers does not exist"
    return _first_mismatch(
        (BatchNormalization, "build", ["self", "input_shape"]),
        (trainer_class, "evaluate", None),
        (trainer_class, "predict", None),
    )


# --- optimizer.iterations counted once more at the end of a finite dataset ----
def _install_iterations_after_data():
    """When a dataset of unknown cardinality (a filter, TFRecordDataset, ...)
    ends, Keras learns it from the OutOfRangeError of `get_next()` in the
    train function. The step's ops that do not depend on the batch, above
    all the optimizer's `iterations.assign_add(1)`, may already have run
    by then (the step function is inlined into the one that calls
    `get_next`): the count gains one per epoch though no update is
    applied, and a learning-rate schedule runs one step ahead per epoch.
    This concerns every strategy with steps_per_execution=1, and the first
    step of each execution of `steps_per_execution_loop` (Keras's own loop
    for steps_per_execution > 1 reads batches as Optionals and is exact).
    The patch runs the train step under a control dependency on the
    batch's tensors, so that nothing of a step runs without its batch.
    Only the scheduling changes; the numbers a step computes do not."""
    import tensorflow as tf

    trainer_class = _trainer_module().TensorFlowTrainer

    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return self.train_function
        train_step = self.train_step

        def step_after_data(data):
            tensors = [t for t in tf.nest.flatten(data, expand_composites=True) if tf.is_tensor(t)]
            with tf.control_dependencies(tensors):
                return train_step(data)

        self.train_function = self._make_function(step_after_data)
        return self.train_function

    return _swap(trainer_class, "make_train_function", make_train_function)


def _shape_iterations_after_data():
    trainer_class = _trainer_module().TensorFlowTrainer
    return _first_mismatch(
        (trainer_class, "make_train_function", ["self", "force"]),
        (trainer_class, "_make_function", ["self", "step_function"]),
    )


_REPRODUCED = "every pair of noxfile.py (Keras 3.8 to 3.15, TensorFlow 2.17 to 2.21)"

WORKAROUNDS = (
    Workaround(
        "symbolic_build_batch",
        "keras#20585, tensorflow#72388",
        'fit() under MultiWorkerMirroredStrategy: "Attempt to convert a value (PerReplica...)"',
        "crash",
        _install_symbolic_build_batch,
        _shape_symbolic_build_batch,
        reproduced=_REPRODUCED,
    ),
    Workaround(
        "multi_worker_metrics",
        "keras#20585, tensorflow#72388",
        "fit() under MultiWorkerMirroredStrategy fails reducing scalar metrics with axis=0",
        "crash",
        _install_multi_worker_metrics,
        _shape_multi_worker_metrics,
        reproduced=_REPRODUCED,
    ),
    Workaround(
        "steps_per_execution_loop",
        "keras#19246",
        "steps_per_execution > 1 under (MultiWorker)MirroredStrategy: "
        '"You must feed a value for placeholder tensor"',
        "crash",
        _install_steps_per_execution_loop,
        _shape_steps_per_execution_loop,
        reproduced=_REPRODUCED,
    ),
    Workaround(
        "distributed_datasets_from_function",
        "keras#20134",
        'fit() on strategy.distribute_datasets_from_function(...): "Unrecognized data type"',
        "crash",
        _install_distributed_datasets_from_function,
        _shape_distributed_datasets_from_function,
        fixed_in=(3, 9),
        verified=((3, 8), (3, 8)),
        reproduced="Keras 3.8 with TensorFlow 2.17 and 2.18 (absent from 3.9 on)",
    ),
    Workaround(
        "on_read_metric_variables",
        "keras#21054",
        "losses and metrics that fit()/evaluate() report under several replicas differ "
        "from one device's (the replicas' metric states are merged on every update)",
        "behaviour",
        _install_on_read_metric_variables,
        _shape_on_read_metric_variables,
        fixed_in=(3, 10),
        verified=((3, 8), (3, 9)),
        reproduced="Keras 3.8 with TensorFlow 2.17 and 2.18 (tests), 3.9.2 with TensorFlow "
        "2.18.1 (by hand); absent from 3.10 on",
    ),
    Workaround(
        "distinct_collective_keys",
        "tensorflow#62790",
        "a second MirroredStrategy in one process training another model: "
        '"Shape mismatch in the collective instance 100"',
        "crash",
        _install_distinct_collective_keys,
        _shape_distinct_collective_keys,
        package="tensorflow",
        since=(2, 0),
        verified=TENSORFLOW_VERIFIED,
        reproduced=_REPRODUCED,
    ),
    Workaround(
        "clip_after_all_reduce",
        "tensorflow#33929 (Keras 3 behaviour)",
        "keras_lars optimizers with clipnorm/global_clipnorm/clipvalue under several "
        "replicas clip each replica's partial gradient before the all-reduce",
        "behaviour",
        _install_clip_after_all_reduce,
        _shape_clip_after_all_reduce,
        reproduced=_REPRODUCED,
    ),
    Workaround(
        "mean_batch_norm_statistics",
        "keras#20601 (Keras 3 creates no on-read variables); no BatchNormalization issue found",
        "BatchNormalization(synchronized=False) under several replicas: each replica keeps "
        "its own moving statistics, get_weights()/saving keep replica 0's",
        "behaviour",
        _install_mean_batch_norm_statistics,
        _shape_mean_batch_norm_statistics,
        reproduced=_REPRODUCED,
    ),
    Workaround(
        "iterations_after_data",
        "no upstream issue found",
        "a dataset of unknown cardinality: optimizer.iterations (and the learning-rate "
        "schedule) one step ahead per epoch",
        "behaviour",
        _install_iterations_after_data,
        _shape_iterations_after_data,
        reproduced=_REPRODUCED,
    ),
)
_BY_NAME = {w.name: w for w in WORKAROUNDS}

_UNDO = {}  # name -> undo function of each installed workaround
_UNAVAILABLE = {}  # name -> why a needed workaround was not installed
_LOGGED = set()  # names whose installation was logged


def _select(names):
    if names is None:
        return list(WORKAROUNDS)
    names = [names] if isinstance(names, str) else list(names)
    unknown = [name for name in names if name not in _BY_NAME]
    if unknown:
        raise ValueError(
            f"Unknown workaround name(s) {unknown} in `names`; known: {sorted(_BY_NAME)}."
        )
    return [_BY_NAME[name] for name in names]


def apply(names=None, behaviour_changes=True):
    """Installs the workarounds (all by default, or those in `names`) that
    the installed versions need; `behaviour_changes=False` leaves out the
    "behaviour" kind. A needed one that cannot be installed here (outside
    its verified versions, or its target changed) is left out with one
    `CompatWarning`. Idempotent. Returns the installed names."""
    for workaround in _select(names):
        name = workaround.name
        if name in _UNDO or not workaround.needed():
            continue
        if workaround.kind == "behaviour" and not behaviour_changes:
            continue
        reason = workaround.problem()
        if reason:
            if name not in _UNAVAILABLE:
                _UNAVAILABLE[name] = reason
                warnings.warn(
                    f"keras_lars.compat: not installing `{name}` ({workaround.issues}): "
                    f"{reason}. Features that need it will refuse to run.",
                    CompatWarning,
                    stacklevel=2,
                )
            continue
        _UNDO[name] = workaround.install()
        if name not in _LOGGED:
            _LOGGED.add(name)
            _LOG.info(
                "keras_lars.compat installed `%s` (%s fix, %s)",
                name,
                workaround.kind,
                workaround.issues,
            )
    return applied()


def unapply(names=None):
    """Removes installed workarounds (all by default), newest first."""
    for workaround in reversed(_select(names)):
        undo = _UNDO.pop(workaround.name, None)
        if undo is not None:
            undo()


def applied():
    """Names of the workarounds installed now, in `WORKAROUNDS` order."""
    return tuple(w.name for w in WORKAROUNDS if w.name in _UNDO)


def require(name, feature):
    """Raises UnsupportedVersionError, naming `feature`, the workaround and
    the versions, if the installed versions need workaround `name` and it
    is not installed (call `apply()` first; `make_strategy` does)."""
    workaround = _select(name)[0]
    if name in _UNDO or not workaround.needed():
        return
    reason = workaround.problem()
    if reason:
        raise UnsupportedVersionError(
            f"{feature} needs keras_lars.compat's `{name}` workaround "
            f"({workaround.issues}), which cannot be installed here: {reason}. "
            f"Use {workaround.describe_versions()}."
        )
    raise UnsupportedVersionError(
        f"{feature} needs keras_lars.compat's `{name}` workaround ({workaround.issues}): "
        f"call keras_lars.compat.apply() first (keras_lars.make_strategy does)."
    )


def table():
    """The registry as a Markdown table (name, kind, upstream, symptom,
    versions with the symptom, where it was reproduced, verified)."""
    rows = [
        "| workaround | kind | upstream | symptom without it | needed on | symptom reproduced on "
        "| patch verified on |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in WORKAROUNDS:
        needed = f"{_package_name(w.package)} {_dotted(w.since)}+" + (
            f", fixed in {_dotted(w.fixed_in)}" if w.fixed_in else " (open)"
        )
        rows.append(
            f"| `{w.name}` | {w.kind} | {w.issues} | {w.symptom} | {needed} | "
            f"{w.reproduced} | {w.describe_versions()} |"
        )
    return "\n".join(rows)


def _restore(names):
    """Makes `names` exactly the installed workarounds."""
    unapply([name for name in applied() if name not in names])
    apply(names)


@contextlib.contextmanager
def patched(names=None):
    """Runs a block with the workarounds in `names` (default: all) installed,
    then restores the installed set from before the block."""
    before = applied()
    apply(names)
    try:
        yield
    finally:
        _restore(before)


@contextlib.contextmanager
def unpatched(names=None):
    """Runs a block on Keras's own code (without the workarounds in `names`,
    default: all), then restores the installed set from before the block."""
    before = applied()
    unapply(names)
    try:
        yield
    finally:
        _restore(before)
