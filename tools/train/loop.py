"""The run: config -> runtime -> data -> length -> model dir -> fit, rolling back
on divergence; returns the summary.

One Run object carries what the rooms share; state flows forward: each
attempt restores the latest checkpoint, fits, and either ends the run or,
after a non-finite loss, hands the next attempt a lower rate.
"""

import contextlib
import dataclasses
import sys
import time

import keras

import keras_lars
from keras_lars.tools import checkpoints
from keras_lars.tools import input_pipeline
from keras_lars.tools import storage
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import adaptive
from keras_lars.tools.train import build
from keras_lars.tools.train import feed
from keras_lars.tools.train import model_dir
from keras_lars.tools.train import run_callbacks
from keras_lars.tools.train import target
from keras_lars.tools.train.checkpoint_callback import Checkpointing
from keras_lars.tools.train.config import PRECISIONS
from keras_lars.tools.train.length import run_length
from keras_lars.tools.train.preemption import Preempted
from keras_lars.tools.train.preemption import Preemption
from keras_lars.tools.train.runtime import runtime_class
from keras_lars.tools.train.saved_weights import SavedWeights


class Diverged(Exception):
    """Training stopped at a non-finite loss or variable (DivergenceGuard);
    `state`: what was trained before it (its history and evaluations)."""

    def __init__(self, message, state=None):
        super().__init__(message)
        self.state = state or {}


@dataclasses.dataclass
class Run:
    """What the rooms of a run share."""

    config: object  # Config
    runtime: object  # runtime.TensorFlowRuntime | runtime_jax.JaxRuntime
    data: object  # input_pipeline's DataSource
    length: object  # length.RunLength
    record: dict  # config.json's content
    preemption: Preemption
    rates: list = dataclasses.field(default_factory=list)  # images/s this process measured
    adaptive: object = None  # adaptive.Decisions under --adaptive_batch


def train_and_evaluate(config):
    """Trains (or resumes) the run of `config`; returns its summary dict."""
    started = time.time()
    keras.utils.set_random_seed(config.seed)
    keras.mixed_precision.set_global_policy(PRECISIONS[config.precision])
    preemption = Preemption()
    runtime = runtime_class(config.backend)(config)
    runtime.start(preemption)
    data = input_pipeline.load(config)
    length = run_length(config, data.info.num_train)
    print(start_line(config, length), flush=True)
    runtime.place(lambda: build.variable_shapes(config, data.info.num_classes))
    replicas = runtime.strategy.num_replicas_in_sync
    _check_split(config, runtime.strategy, runtime.flag)
    for number, phase in enumerate(length.phases, 1):
        if phase.global_batch_size % replicas:
            raise ConfigError(
                f"--batch_schedule={config.batch_schedule}: phase {number} (epoch "
                f"{phase.first_epoch}) has global batch {phase.global_batch_size}, not "
                f"divisible by the {replicas} replicas of {runtime.flag}."
            )
    if config.adaptive_batch != "off":
        adaptive.check(config, replicas, data.info.num_train, runtime.flag)
    record = model_dir.prepare(config, data.info, runtime.strategy)
    run = Run(config, runtime, data, length, record, preemption)
    if config.adaptive_batch != "off":
        run.adaptive = adaptive.Decisions(config, replicas)
    chief = keras_lars.distribute.is_chief(runtime.strategy)
    with storage.exclusive(config.model_dir) if chief else contextlib.nullcontext():
        state = _train_with_rollbacks(run)
    return model_dir.write_summary(
        config, run.length, state, time.time() - started, runtime.strategy, run.rates
    )


def start_line(config, length):
    """The run's first line: what it trains on what, with which batch, for
    how many steps, where it writes and on which backend."""
    batches = sorted({phase.global_batch_size for phase in length.phases})
    batch = "/".join(map(str, batches)) if batches else config.global_batch_size
    size = "--image_size_schedule" if config.image_size_schedule else f"{config.image_size} px"
    steps = f"{length.total_steps} steps ({length.epochs} epoch{'s' * (length.epochs != 1)}"
    if length.phases:
        steps += ")"
    elif length.total_steps == length.epochs * length.steps_per_epoch:
        steps += f" x {length.steps_per_epoch})"
    else:
        steps += f" of {length.steps_per_epoch} steps)"
    return (
        f"training {config.model} with {config.optimizer} on {config.dataset} ({size}), "
        f"batch {batch}, {steps}, model_dir {config.model_dir}, backend {config.backend}"
    )


def _check_split(config, strategy, flag):
    """The global batch (a micro-batch of it under accumulation) divides
    between the replicas, accumulation runs where tf.distribute lets it, and
    the noise scale has two gradient sizes."""
    replicas = strategy.num_replicas_in_sync
    if config.micro_batch_size % replicas:
        micro = config.gradient_accumulation_steps > 1
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size}"
            + (f" / --gradient_accumulation_steps={config.gradient_accumulation_steps}" * micro)
            + f" is not divisible by the {replicas} replicas of {flag}."
        )
    accumulating = config.gradient_accumulation_steps > 1
    # Any strategy but the default and OneDeviceStrategy synchronises its
    # replicas through merge_call, one replica too (keras_lars.layerwise).
    synchronising = config.backend == "tensorflow" and not _one_device(strategy)
    if accumulating and synchronising:
        raise ConfigError(
            f"--gradient_accumulation_steps={config.gradient_accumulation_steps} with {flag} "
            f"({replicas} replica{'s' * (replicas != 1)}): Keras all-reduces inside the tf.cond "
            f"of its update step, which tf.distribute's {type(strategy).__name__} refuses, on one "
            "replica too; accumulate under --strategy=one_device or default, or on "
            "--backend=jax."
        )
    if config.noise_scale and config.backend == "jax" and replicas > 1:
        raise ConfigError(
            f"--noise_scale on the JAX backend measures on one device, not the {replicas} of "
            f"{flag}."
        )
    if config.noise_scale and not accumulating and replicas == 1:
        raise ConfigError(
            "--noise_scale on one device needs two gradient sizes: --gradient_accumulation_steps "
            ">= 2 (its micro-batches), or several TensorFlow replicas."
        )


def _one_device(strategy):
    """Whether the TensorFlow `strategy` is the default or a OneDeviceStrategy."""
    import tensorflow as tf  # the TensorFlow backend's (a JAX-only install has none)

    return strategy is tf.distribute.get_strategy() or isinstance(
        strategy, tf.distribute.OneDeviceStrategy
    )


def _train_with_rollbacks(run):
    """Fits to the end (or to --target_accuracy); on divergence rolls back to
    the last good checkpoint with the rate times --divergence_rate_factor
    (--divergence_rollbacks times at most) or raises Diverged. Returns the
    state (its history, evaluations and target)."""
    config, rollback = run.config, None  # after a divergence: {"rate_factor", "rollbacks"}
    # Handled across the rebuilds too (after a rollback, at a decided batch):
    # a signal there stops at the next fit's start. One process of a cluster
    # cannot stop alone: there the runtime's cluster preemption takes SIGTERM.
    with run.preemption.handling(enabled=run.runtime.single_process):
        while True:
            model, schedule, state = _restore(run, rollback)
            try:
                _fit(run, model, schedule, state)
                if run.adaptive and run.adaptive.changed:  # on from its checkpoint, at its batch
                    rollback = None
                    keras.backend.clear_session()
                    keras.utils.set_random_seed(config.seed)
                    continue
                return state
            except target.TargetDecided:
                return state
            except keras_lars.NonFiniteLossError as error:
                last = model_dir.last_checkpoint(config.model_dir)
                last = last and f"{last[0]} ({last[1]})"  # path (epoch e[, step s of the next])
                used = state.get("rollbacks", 0)
                if used >= config.divergence_rollbacks:
                    described = last or "none (no checkpoint yet)"
                    raise Diverged(f"{error}; last good checkpoint: {described}", state) from None
                factor = state.get("rate_factor", 1.0) * config.divergence_rate_factor
                rollback = {"rate_factor": factor, "rollbacks": used + 1}
                print(
                    f"warning: {error}; rolling back to {last or 'the start'} with "
                    f"the peak learning rate x{factor:g} (rollback {used + 1} of "
                    f"{config.divergence_rollbacks})",
                    file=sys.stderr,
                    flush=True,
                )
                keras.backend.clear_session()
                keras.utils.set_random_seed(config.seed)


def _restore(run, rollback):
    """(model, schedule, state) from the latest checkpoint; `rollback`
    overrides the restored rate factor and rollback count."""
    config = run.config

    def build_at(rate_factor, state=None):
        phases = None
        if run.adaptive:  # the phases decided by `state`'s decisions
            run.adaptive.restore(state or {})
            run.length, phases = run.adaptive.length(run.data.info.num_train), run.adaptive.phases()
        schedule = build.learning_rate_schedule(
            config, run.length, run.data.info.num_train, rate_factor, phases
        )
        with run.runtime.strategy.scope():
            model = build.compiled_model(config, run.data.info.num_classes, schedule)
            state = checkpoints.restore(model, model_dir.checkpoint_dir(config.model_dir))
        return model, schedule, state or {"epochs_done": 0, "steps_done": 0, "history": []}

    factor = rollback["rate_factor"] if rollback else 1.0
    model, schedule, state = build_at(factor)
    resumed_factor = rollback is None and state.get("rate_factor", 1.0) != factor
    if resumed_factor or state.get(adaptive.STATE):  # after a rollback, or decisions
        keras.backend.clear_session()
        keras.utils.set_random_seed(config.seed)
        factor = factor if rollback else state.get("rate_factor", 1.0)
        model, schedule, state = build_at(factor, state)
    state.update(rollback or {})
    start, skip = state["epochs_done"], state.get("steps_done", 0)
    directory = model_dir.checkpoint_dir(config.model_dir)
    layout = model_dir.layout(run.runtime.strategy)
    model_dir.check_layout(config, model, state, layout, checkpoints.stem(directory, start, skip))
    if start or skip:
        inside = f", step {skip} of epoch {start + 1}" if skip else ""
        print(f"resuming {config.model_dir} after epoch {start}{inside}", flush=True)
    return model, schedule, state


def _fit(run, model, schedule, state):
    """Trains from the state's position to the end (a resumed epoch's rest
    first), with the run's callbacks; a read failure names the bad record."""
    config, length, strategy = run.config, run.length, run.runtime.strategy
    start, skip = state["epochs_done"], state.get("steps_done", 0)
    if start >= length.epochs or target.decided(state):
        return
    fit_callbacks = make_callbacks(run, schedule, state)
    evaluations = next(c for c in fit_callbacks if isinstance(c, target.Evaluations))

    def evaluation(data):
        if not config.eval:
            return None, []
        return feed.evaluation(data, config.micro_batch_size, strategy)

    default_evaluation = evaluation(run.data)

    def fit(first_epoch, end_epoch, steps_per_epoch, skip=0, phase=None):
        if run.adaptive and run.adaptive.changed:  # decided: the loop goes on at the new batch
            return
        data, batch = run.data, config.global_batch_size
        if phase is not None:  # its batch, and its images: at its size, evaluated at it
            data, batch = phase.data, phase.global_batch_size
        micro = config.gradient_accumulation_steps  # Keras's steps are micro-batches
        train = strategy.distribute_datasets_from_function(
            feed.train_stream(data, length, first_epoch, batch, skip, end_epoch, micro)
        )
        validation, validation_steps = phase.evaluation if phase else default_evaluation
        validation_steps = validation_steps[0] if validation_steps else None
        evaluations.validation = (validation, validation_steps)
        model.fit(
            train,
            epochs=end_epoch,
            initial_epoch=first_epoch,
            steps_per_epoch=steps_per_epoch * micro,
            validation_data=validation,
            validation_steps=validation_steps,
            shuffle=False,
            callbacks=fit_callbacks,
            verbose=0,
        )

    try:
        if run.preemption.signal:  # received before (a rebuild's, or a caller's: the study's)
            last = model_dir.last_checkpoint(config.model_dir)
            resumed = f"resumed from {last[0]}" if last else "started"
            raise Preempted(
                f"stopped by {run.preemption.signal} before training {resumed}; "
                "run the same command to resume"
            )
        if length.phases:
            _fit_phases(run, model, fit, evaluation, start, skip)
            return
        if skip:  # the rest of the epoch a checkpoint was taken inside
            fit(start, start + 1, length.steps_in(start) - skip, skip)
            start += 1
        if start < length.epochs:
            fit(start, length.epochs, length.steps_per_epoch)
    except Exception as error:
        if feed.read_failed(error):
            feed.explain_data_error(run.data, config, error)
        raise


def _fit_phases(run, model, fit, evaluation, start, skip):
    """--batch_schedule / --image_size_schedule: from epoch `start` (`skip`
    steps of it done), one fit per phase, each with its batch and its
    images. In one process each phase gets a train function of its own,
    traced for its static shapes (Keras's retrace would relax the batch
    dimension). Between TensorFlow workers Keras retraces its own: a fresh
    function hung in its first collective there (TF 2.21, 2 workers).
    optimizer.iterations runs on across phases."""
    for phase in run.length.phases:
        if phase.end_epoch <= start:
            continue
        data = feed.data_at(run.data, run.config, phase.image_size)
        fed = FedPhase(phase.global_batch_size, data, evaluation(data))
        if run.runtime.single_process:  # a fresh step for this phase's static shapes
            model.train_function = None
        optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        if getattr(optimizer, "noise_scale_estimator", None):  # measured at this batch
            micro_batch = phase.global_batch_size // run.config.gradient_accumulation_steps
            optimizer.noise_scale_estimator.batch_size = micro_batch
        if skip:  # the rest of the epoch a checkpoint was taken inside
            fit(start, start + 1, phase.steps_per_epoch - skip, skip, fed)
            start, skip = start + 1, 0
        if start < phase.end_epoch:
            fit(start, phase.end_epoch, phase.steps_per_epoch, phase=fed)
            start = phase.end_epoch


@dataclasses.dataclass(frozen=True)
class FedPhase:
    """What a phase's fits read: its global batch, its DataSource and
    evaluation set (feed.evaluation's pair, or (None, []))."""

    global_batch_size: int
    data: object
    evaluation: tuple


def make_callbacks(run, schedule, state):
    """The fit's callbacks, in the order Keras calls them."""
    config = run.config
    counter = run_callbacks.StepCounter(
        run.length, (state["epochs_done"], state.get("steps_done", 0))
    )
    throughput = run_callbacks.Throughput(counter, config.global_batch_size, run.rates)
    evaluations = target.Evaluations(run, state, counter, throughput)
    if run.length.phases:  # the batch of each epoch's phase
        throughput.batch_of_epoch = lambda epoch: run.length.phase_of(epoch).global_batch_size
    found = [
        counter,
        run_callbacks.ReseedDropout(counter, state.get("seed_generators", {})),
        throughput,
        run_callbacks.ProgressLine(counter, config.log_every_seconds),
        run_callbacks.LearningRateLog(counter, schedule),
        # into the logs; each epoch's own reading too, unless the adaptive batch's decisions take it
        *([keras_lars.NoiseScaleMonitor(interval=not run.adaptive)] if config.noise_scale else []),
        *([run_callbacks.BatchLog(run.length, config.image_size)] if run.length.phases else []),
        evaluations,  # before Checkpointing, which saves the target it finds
        *([run.adaptive.callback(run, state)] if run.adaptive else []),  # and the decisions
        Checkpointing(run, state, counter, throughput),
        run_callbacks.ProgressBar(run.length),
    ]
    if config.stop_on_divergence:  # first: it raises before any checkpoint of the epoch
        found.insert(0, keras_lars.DivergenceGuard())
    if config.save_weights_at_steps:  # after the counter, before a target's stop
        strategy = run.runtime.strategy
        saved = SavedWeights(counter, config.save_weights_at_steps, config.model_dir, strategy)
        found.insert(found.index(counter) + 1, saved)
    if keras_lars.distribute.is_chief(run.runtime.strategy):  # only the chief writes logs
        found += run_callbacks.log_writers(config)
    return found
