"""Evaluations within epochs, and the steps, examples and seconds to a target
accuracy (Shallue et al. 2019's "steps to result": the first evaluation whose
top-1 accuracy on the evaluation split reaches the goal).

Keras evaluates at every epoch end (--eval); with --eval_every_steps=k the
run also evaluates at the first step boundary at or after every multiple of k
within an epoch, on the whole evaluation split (Keras's `Model.evaluate`, so
that every replica and worker computes the same number). An evaluation is

    {"step", "examples", "seconds", "evaluation_seconds", "val_accuracy", "val_loss", ...}

(with --noise_scale also the smoothed noise scale at that step: noise_scale,
noise_scale_gradient_sq, noise_scale_trace)
(and at the target, when the evaluation split is held out of the training
images by --validation_examples, the test split's test_accuracy and
test_loss: the test set is read there only)
with `examples` the training examples consumed by `step` (RunLength) and
`seconds` the training time to it: the epochs of the history, plus the
current epoch's time so far (evaluations included; an epoch cut by a
preemption counts from its resume), and `evaluation_seconds` the seconds of
the evaluations within that time (this one's included): seconds -
evaluation_seconds is the time spent training.

With --collapse_patience=n the target is out of reach, and the run decided,
once the last n evaluations all scored at most chance, a = CHANCE / classes,
after an earlier one scored above LEARNT * a: the network learnt, then
collapsed to an output that ignores its input (every ReLU off; no gradient
reaches the weights, so it stays there). Checkpointing saves when the target
is decided and raises TargetDecided; a resumed run whose target was decided
trains no further.
"""

import time

import keras

from keras_lars.tools.train import feed

CHANCE = 1.5  # accuracy at most CHANCE / classes: at chance
LEARNT = 2.0  # above LEARNT * CHANCE / classes: above chance


class TargetDecided(Exception):
    """The run reached --target_accuracy, or collapsed (--collapse_patience);
    its checkpoint is saved."""


def decided(state):
    """Whether the run of `state` reached its target or collapsed."""
    return "target" in state or "collapsed" in state


def collapsed(accuracies, num_classes, patience):
    """Whether evaluation accuracies (oldest first) end in a collapse: their
    last `patience` at most CHANCE / num_classes, an earlier one above LEARNT
    times that (module docstring)."""
    chance = CHANCE / num_classes
    before, last = accuracies[:-patience], accuracies[-patience:]
    return (
        0 < patience <= len(last)
        and all(a <= chance for a in last)
        and any(a > LEARNT * chance for a in before)
    )


class Evaluations(keras.callbacks.Callback):
    """Evaluates within epochs every --eval_every_steps steps and reads
    Keras's evaluation at epoch ends; appends each to state["evaluations"]
    and sets state["target"] to the first that reaches --target_accuracy, or
    state["collapsed"] to the one that finds a collapse (--collapse_patience).
    `validation` is (dataset, steps) of the fit under way (the loop sets it
    per phase)."""

    def __init__(self, run, state, counter, throughput):
        super().__init__()
        self.run, self.state = run, state
        self.counter, self.throughput = counter, throughput
        self.validation = (None, None)
        state.setdefault("evaluations", [])

    def on_train_begin(self, logs=None):
        self._evaluated_at = self.counter.step

    def on_train_batch_end(self, batch, logs=None):
        every = self.run.config.eval_every_steps
        step = self.counter.step
        if not every or self.counter.done >= self.counter.planned:
            return  # the epoch's end evaluates
        if step // every > self._evaluated_at // every:
            dataset, steps = self.validation
            with self.throughput.evaluation():
                found = self.model.evaluate(dataset, steps=steps, verbose=0, return_dict=True)
            self._record(step, {f"val_{k}": v for k, v in found.items()})

    def on_epoch_end(self, epoch, logs=None):
        if logs and "val_accuracy" in logs:
            self._record(self.counter.step, logs)

    def _test(self):
        """{"test_accuracy", "test_loss"} of the model now on the test split
        when the evaluation split is held out of the training images
        (--validation_examples), else {}: the test is read once, at the target."""
        test = self.run.data.test
        if test is None:
            return {}
        dataset, steps = feed.evaluation(
            test, self.run.config.micro_batch_size, self.run.runtime.strategy
        )
        with self.throughput.evaluation():
            found = self.model.evaluate(dataset, steps=steps[0], verbose=0, return_dict=True)
        return {
            f"test_{k}": float(keras.ops.convert_to_numpy(found[k])) for k in ("accuracy", "loss")
        }

    def _record(self, step, logs):
        self._evaluated_at = step
        history = self.state["history"]
        done_epochs = sum(record.get("seconds", 0.0) for record in history)
        evaluated = sum(record.get("evaluation_seconds", 0.0) for record in history)
        entry = {
            "step": step,
            "examples": self.run.length.examples_at(step),
            "seconds": round(done_epochs + time.time() - self.throughput.started, 3),
            "evaluation_seconds": round(evaluated + self.throughput.evaluation_seconds, 3),
            **{k: float(keras.ops.convert_to_numpy(v)) for k, v in logs.items() if "val_" in k},
        }
        if self.run.config.noise_scale:  # the smoothed noise scale at this step
            optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
            entry.update(optimizer.noise_scale_stats())
        self.state["evaluations"].append(entry)
        target = self.run.config.target_accuracy
        if not target or decided(self.state):
            return
        if entry["val_accuracy"] >= target:
            entry.update(self._test())
            self.state["target"] = entry
            print(
                f"target: val_accuracy={entry['val_accuracy']:.4f} >= {target} at step {step} "
                f"({entry['examples']} examples, {entry['seconds']:.1f} s of training)",
                flush=True,
            )
            return
        patience = self.run.config.collapse_patience
        accuracies = [e["val_accuracy"] for e in self.state["evaluations"]]
        if collapsed(accuracies, self.run.data.info.num_classes, patience):
            self.state["collapsed"] = entry
            print(
                f"target: out of reach at step {step}: {patience} evaluations in a row at "
                f"chance (val_accuracy <= {CHANCE / self.run.data.info.num_classes:.4g}) "
                "after learning; the network collapsed",
                flush=True,
            )


def summary(config, length, state):
    """summary.json's "target": the evaluation that reached --target_accuracy,
    or {"reached": False, "steps": the run's} when none did; None without a
    target."""
    if not config.target_accuracy:
        return None
    found = state.get("target")
    if found:
        return {"target_accuracy": config.target_accuracy, "reached": True, **found}
    missed = {
        "target_accuracy": config.target_accuracy,
        "reached": False,
        "steps": length.total_steps,
        "examples": length.examples_at(length.total_steps),
    }
    if "collapsed" in state:  # the evaluation that decided it
        missed["collapsed"] = state["collapsed"]
    return missed


def describe(found):
    """The final line's words for summary()'s dict."""
    if found["reached"]:
        return (
            f"target={found['target_accuracy']} reached at step {found['step']} "
            f"({found['examples']} examples, {found['seconds']:.1f} s)"
        )
    if "collapsed" in found:
        return (
            f"target={found['target_accuracy']} not reached: collapsed to chance, stopped at "
            f"step {found['collapsed']['step']} of {found['steps']}"
        )
    return f"target={found['target_accuracy']} not reached in {found['steps']} steps"
