"""The one place for workarounds of Keras / TensorFlow bugs (most of them
in distributed training).

Nothing is patched at import. One documented call installs every
workaround that the installed versions need:

    import keras_lars
    keras_lars.compat.apply()          # or: with keras_lars.compat.patched(): ...

`keras_lars.distribute.make_strategy` calls it for the strategies that need
it (on one device, call it yourself: `iterations_after_data` concerns every
strategy). `apply()` is idempotent; `unapply()` restores Keras's own code, and
`unpatched()` runs a block on Keras's own code (tests use it to show each
bug's symptom).

Each workaround is a small function pair (install, which returns an undo
function) registered in `WORKAROUNDS` with the upstream issue and the Keras
Keras or TensorFlow versions it is needed for (`fixed_in=None`: still open
upstream, seen on Keras 3.15.1 / TensorFlow 2.21). All of them concern the
TensorFlow backend only and are skipped on the others.

| name                     | upstream                              | symptom without it |
|--------------------------|---------------------------------------|--------------------|
| symbolic_build_batch     | keras#20585, tensorflow#72388         | fit() under MultiWorkerMirroredStrategy: "Attempt to convert a value (PerReplica...)" |
| multi_worker_metrics     | keras#20585, tensorflow#72388         | fit() under MultiWorkerMirroredStrategy fails reducing scalar metrics with axis=0 |
| steps_per_execution_loop | keras#19246                           | steps_per_execution > 1 under (MultiWorker)MirroredStrategy: "You must feed a value for placeholder tensor" |
| clip_after_all_reduce    | tensorflow#33929 (Keras 3 behaviour)  | keras_lars optimizers with clipnorm/global_clipnorm/clipvalue under several replicas clip each replica's partial gradient before the all-reduce |
| distinct_collective_keys | tensorflow#62790                      | a second MirroredStrategy in one process training another model: "Shape mismatch in the collective instance 100" |
| mean_batch_norm_statistics | keras#20601 (related), no BatchNormalization issue | BatchNormalization(synchronized=False) under several replicas: each replica keeps its own moving statistics, get_weights()/saving keep replica 0's |
| iterations_after_data    | no upstream issue found               | a dataset of unknown cardinality: optimizer.iterations (and the learning-rate schedule) one step ahead per epoch |
"""

import contextlib
import dataclasses
import functools
import itertools
import re
from typing import Callable
from typing import Optional

import keras


def _version(text):
    """'3.15.1' -> (3, 15, 1); pre-release suffixes are ignored."""
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _installed_version(package):
    if package == "keras":
        return _version(keras.__version__)
    import tensorflow as tf

    return _version(tf.__version__)


@dataclasses.dataclass(frozen=True)
class Workaround:
    """One upstream bug: where it is tracked, which versions of `package`
    ("keras" or "tensorflow") have it (`since` <= version < `fixed_in`;
    None: not fixed yet), and how to patch it (`install()` returns the
    function that undoes it)."""

    name: str
    issues: str
    install: Callable[[], Callable[[], None]]
    package: str = "keras"
    since: tuple = (3, 0)
    fixed_in: Optional[tuple] = None

    def needed(self):
        if keras.backend.backend() != "tensorflow":
            return False
        version = _installed_version(self.package)
        return version >= self.since and (self.fixed_in is None or version < self.fixed_in)


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
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0],
                    next(batches),
                )
                break
            iterator = None
        return original(self, iterator=iterator, data_batch=data_batch)

    return _swap(trainer_class, "_maybe_symbolic_build", _maybe_symbolic_build)


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
            return keras.tree.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values
            )
        return original(values, strategy, reduction)

    return _swap(trainer, "reduce_per_replica", reduce_per_replica)


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
        context = tf.distribute.get_replica_context()
        return context is not None and context.num_replicas_in_sync > 1

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

    return _swap(extended, "_make_collective_ops_with_fallbacks", _make_collective_ops_with_fallbacks)


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
                    if variable is not None and variable.synchronization == "on_read":
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


WORKAROUNDS = (
    Workaround(
        "symbolic_build_batch", "keras#20585, tensorflow#72388",
        _install_symbolic_build_batch,
    ),
    Workaround(
        "multi_worker_metrics", "keras#20585, tensorflow#72388",
        _install_multi_worker_metrics,
    ),
    Workaround("steps_per_execution_loop", "keras#19246", _install_steps_per_execution_loop),
    Workaround("clip_after_all_reduce", "tensorflow#33929", _install_clip_after_all_reduce),
    Workaround(
        "distinct_collective_keys", "tensorflow#62790", _install_distinct_collective_keys,
        package="tensorflow", since=(2, 0),
    ),
    Workaround(
        "mean_batch_norm_statistics",
        "keras#20601 (Keras 3 creates no on-read variables); no BatchNormalization issue found",
        _install_mean_batch_norm_statistics,
    ),
    Workaround(
        "iterations_after_data", "no upstream issue found", _install_iterations_after_data,
    ),
)

_UNDO = {}  # name -> undo function of each installed workaround


def _select(names):
    known = {w.name: w for w in WORKAROUNDS}
    if names is None:
        return list(WORKAROUNDS)
    names = [names] if isinstance(names, str) else list(names)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"Unknown workaround name(s) {unknown} in `names`; known: {sorted(known)}."
        )
    return [known[name] for name in names]


def apply(names=None):
    """Installs the workarounds (all by default, or those in `names`) that
    the installed Keras needs. Idempotent. Returns the installed names."""
    for workaround in _select(names):
        if workaround.name not in _UNDO and workaround.needed():
            _UNDO[workaround.name] = workaround.install()
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
