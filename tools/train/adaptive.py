"""--adaptive_batch: the global batch set by the measured noise scale
(keras_lars.AdaptiveBatchSize), as a batch schedule decided while it runs.

Every --adaptive_batch_every_epochs epochs (but at the last) the `Decide`
callback reads B_simple of those epochs from the optimizer, decides the next
batch and rate factor, and records the decision in the run's state, which the
epoch's checkpoint saves. The run so far is then a batch schedule whose phases
start where a decision changed the batch or the rate (`phases`): when it
changes, the fit stops and the loop rebuilds the run from that checkpoint at
the new batch, as a resume would (a killed run resumes the same way, so it
makes the same decisions).
"""

import math

import keras

import keras_lars
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import build
from keras_lars.tools.train import length as run_lengths

STATE = "adaptive_batch"  # the decisions' key in the run's state and summary.json
# A decision's reading in the epoch's logs (TensorBoard's epoch_*, the history);
# the batch and the learning rate are there already (BatchLog, LearningRateLog).
LOGGED = {"noise_scale": "adaptive_noise_scale", "standard_error": "adaptive_noise_scale_error"}


def check(config, replicas, num_train, flag):
    """ConfigError naming the flag unless the replicas of `flag` and the
    data fit --adaptive_batch's bounds (before any training)."""
    k = config.gradient_accumulation_steps
    if replicas == 1 and k == 1:
        raise ConfigError(
            f"--adaptive_batch={config.adaptive_batch}: measures the noise scale from two "
            f"gradient sizes, but {flag} has 1 replica: give --gradient_accumulation_steps >= 2 "
            "or several replicas."
        )
    quantum = replicas * k
    for name in ("adaptive_batch_min", "adaptive_batch_max"):
        value = getattr(config, name)
        if value % quantum:
            raise ConfigError(
                f"--{name}={value} is not divisible by the {replicas} replicas of {flag}"
                + (f" x --gradient_accumulation_steps={k}" if k > 1 else "")
                + "."
            )
    if config.adaptive_batch_max > num_train:
        raise ConfigError(
            f"--adaptive_batch_max={config.adaptive_batch_max} exceeds the {num_train} "
            "training examples: an epoch would have no step."
        )


class Decisions:
    """The run's controller and its decisions so far."""

    def __init__(self, config, replicas):
        self.config = config
        self.controller = keras_lars.AdaptiveBatchSize(
            config.global_batch_size,
            config.adaptive_batch_min or config.global_batch_size,
            config.adaptive_batch_max,
            growth_factor=config.adaptive_batch_growth,
            target_multiple=config.adaptive_batch_target,
            rate_rule=config.adaptive_batch,
            every_epochs=config.adaptive_batch_every_epochs,
            multiple_of=replicas * config.gradient_accumulation_steps,
        )
        self.changed = False  # a decision changed the phases: the fit stops

    def restore(self, state):
        """Goes on from the decisions of `state` (a checkpoint's)."""
        self.controller.set_state(state.get(STATE))
        self.changed = False

    def phases(self):
        """(keras_lars.BatchSchedule, rate factors) of the decisions so far: a
        phase from epoch 0 at --global_batch_size, and one from each decision
        that changed the batch or the rate factor, to the end of the run."""
        pairs = [(0, self.config.global_batch_size, 1.0)]
        for decision in self.controller.decisions:
            if (decision["batch_size"], decision["rate_factor"]) != pairs[-1][1:]:
                pairs.append((decision["epoch"], decision["batch_size"], decision["rate_factor"]))
        schedule = keras_lars.BatchSchedule([(epoch, batch) for epoch, batch, _ in pairs])
        return schedule, tuple(factor for _, _, factor in pairs)

    def length(self, num_train):
        return run_lengths.run_length(self.config, num_train, self.phases()[0])

    def callback(self, run, state):
        return Decide(self, run, state)


class Decide(keras.callbacks.Callback):
    """At the end of every --adaptive_batch_every_epochs-th epoch (not the
    run's last): reads B_simple of the updates since the last decision,
    decides, prints it, puts the decisions into `state` (list it before
    Checkpointing, which saves them) and the reading into the epoch's logs (before
    the log writers). Stops the fit where the phases change."""

    def __init__(self, decisions, run, state):
        super().__init__()
        self.decisions, self.run, self.state = decisions, run, state

    def on_epoch_end(self, epoch, logs=None):
        config, done = self.decisions.config, epoch + 1
        if done % config.adaptive_batch_every_epochs or done >= self.run.length.epochs:
            return
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        before = self.decisions.phases()
        reading = optimizer.noise_scale_estimator.interval_stats(reset=True)
        decision = self.decisions.controller.decide(
            int(keras.ops.convert_to_numpy(optimizer.iterations)), reading
        )
        decision["epoch"] = done
        after = self.decisions.phases()
        decision["learning_rate"] = _rate_at(self.run, after, decision["step"], self.state)
        self.state[STATE] = self.decisions.controller.get_state()
        if logs is not None and math.isfinite(decision["noise_scale"]):  # TensorBoard, history
            logs[LOGGED["noise_scale"]] = decision["noise_scale"]
            logs[LOGGED["standard_error"]] = decision["standard_error"]
        if after != before:
            self.decisions.changed = True
            self.model.stop_training = True
        if keras_lars.distribute.is_chief(self.run.runtime.strategy):
            print(describe(decision, before[0].phases[-1].global_batch_size), flush=True)


def _rate_at(run, phases, step, state):
    """The learning rate of update `step` under the decided `phases`."""
    length = run_lengths.run_length(run.config, run.data.info.num_train, phases[0])
    schedule = build.learning_rate_schedule(
        run.config, length, run.data.info.num_train, state.get("rate_factor", 1.0), phases
    )
    return float(keras.ops.convert_to_numpy(schedule(step)))


def describe(decision, previous_batch):
    """The decision's line."""
    scale, error = decision["noise_scale"], decision["standard_error"]
    measured = (
        f"B_simple {scale:.4g} +- {error:.2g}"
        if math.isfinite(scale)
        else "B_simple not resolved (|G|^2 <= 0)"
    )
    return (
        f"adaptive batch: after epoch {decision['epoch']} (step {decision['step']}), "
        f"{measured} from {decision['measurements']} measurements: batch "
        f"{previous_batch} -> {decision['batch_size']}, rate x{decision['rate_factor']:.4g} "
        f"(learning rate {decision['learning_rate']:.4g})"
    )
