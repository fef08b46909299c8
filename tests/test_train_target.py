"""The training tool's evaluations within epochs (--eval_every_steps) and its
stop at a target accuracy (--target_accuracy): tools/train/target.py.

Runs in this process: Shallue et al.'s simple CNN with LAMB on 256 digits at
16x16, batch 32 (8 steps an epoch), 2 epochs, 64 evaluated."""

import json
import types

import numpy as np
import pytest

from keras_lars.tools import checkpoints
from keras_lars.tools import input_pipeline
from keras_lars.tools import train
from keras_lars.tools.train import build
from keras_lars.tools.train import run_callbacks
from keras_lars.tools.train import target
from tests.train_tool import assert_same_weights
from tests.train_tool import fingerprint
from tests.train_tool import untimed

RUN = dict(
    model="simple_cnn",
    optimizer="lamb",
    base_learning_rate=0.01,
    lr_scaling="none",
    image_size=16,
    global_batch_size=32,
    train_examples=256,
    eval_examples=64,
    train_epochs=2,
    warmup_epochs=0,
)
STEPS_PER_EPOCH = 8
TOTAL_STEPS = 16


def run(model_dir, **settings):
    """(config, summary) of RUN with `settings`, trained (or resumed) here."""
    config = train.Config(**{**RUN, **settings, "model_dir": str(model_dir)})
    return config, train.train_and_evaluate(config)


@pytest.fixture(scope="module")
def every_two_steps(tmp_path_factory):
    """RUN evaluated every 2 steps, no target: (model_dir, summary)."""
    model_dir = tmp_path_factory.mktemp("every_two") / "run"
    _, summary = run(model_dir, eval_every_steps=2)
    return model_dir, summary


def _first_new_best(evaluations, at_epoch_end):
    """The first evaluation (before the last) whose accuracy beats every
    earlier one, at an epoch end or within an epoch: (index, evaluation)."""
    best = -1.0
    for index, found in enumerate(evaluations[:-1]):
        end = found["step"] % STEPS_PER_EPOCH == 0
        if found["val_accuracy"] > best and end == at_epoch_end and index > 0:
            return index, found
        best = max(best, found["val_accuracy"])
    raise AssertionError(f"no new best {'at' if at_epoch_end else 'within'}: {evaluations}")


def test_evaluations_within_epochs_change_no_number(every_two_steps, tmp_path):
    model_dir, summary = every_two_steps
    evaluations = summary["evaluations"]
    assert [e["step"] for e in evaluations] == list(range(2, TOTAL_STEPS + 1, 2))
    assert [e["examples"] for e in evaluations] == [32 * e["step"] for e in evaluations]
    seconds = [e["seconds"] for e in evaluations]
    assert seconds == sorted(seconds) and seconds[0] > 0
    assert "target" not in summary  # no target asked for
    # The same run evaluated at epoch ends only: the same epoch-end numbers
    # and the same weights (an evaluation draws nothing and changes no variable).
    plain = tmp_path / "plain"
    _, alone = run(plain)
    ends = [e for e in evaluations if e["step"] % STEPS_PER_EPOCH == 0]
    keys = ("val_accuracy", "val_loss", "val_top5_accuracy")
    assert [{k: e[k] for k in keys} for e in ends] == [
        {k: h[k] for k in keys} for h in alone["history"]
    ]
    assert [e["step"] for e in alone["evaluations"]] == [8, 16]
    name = "ckpt-0002.weights.h5"
    assert_same_weights(model_dir / "checkpoints" / name, plain / "checkpoints" / name, 5)


def test_each_evaluation_counts_the_seconds_spent_evaluating_to_it(every_two_steps):
    _, summary = every_two_steps
    evaluations, history = summary["evaluations"], summary["history"]
    spent = [e["evaluation_seconds"] for e in evaluations]
    # Each evaluation adds its own time: within an epoch (timed around
    # Model.evaluate) and at its end (Keras's on_test_begin / on_test_end).
    assert all(later > earlier for earlier, later in zip([0.0, *spent], spent)), spent
    assert all(0 < e["evaluation_seconds"] < e["seconds"] for e in evaluations), evaluations
    # An epoch's record holds its evaluations': the run's last evaluation, at
    # its end, counts them all.
    assert sum(h["evaluation_seconds"] for h in history) == pytest.approx(spent[-1], abs=2e-3)
    # The final numbers are the last epoch's, without its times.
    assert {"seconds", "evaluation_seconds"} <= set(history[-1])
    assert not {"seconds", "evaluation_seconds", "images_per_second"} & set(summary["final"])


def test_an_epochs_images_per_second_leave_out_the_evaluations_within_it(monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 7.0, 8.0, 9.0])
    monkeypatch.setattr(run_callbacks.time, "time", lambda: next(clock))
    counter = types.SimpleNamespace(done=0)
    throughput = run_callbacks.Throughput(counter, global_batch_size=30)
    throughput.on_epoch_begin(0)  # 0 s
    counter.done = 1
    throughput.on_train_batch_end(0)  # 1 s
    with throughput.evaluation():  # 2 s to 7 s
        pass
    for done in (2, 3):  # 8 s, 9 s
        counter.done = done
        throughput.on_train_batch_end(done - 1)
    # 2 steps of 30 images after the first in 8 s, 5 s of them evaluating.
    assert throughput.epoch_rate() == 20.0 and throughput.evaluation_seconds == 5.0


@pytest.mark.parametrize("at_epoch_end", [False, True], ids=["within_an_epoch", "at_epoch_end"])
def test_the_run_stops_at_the_first_evaluation_that_reaches_the_target(
    every_two_steps, tmp_path, capsys, at_epoch_end
):
    _, whole = every_two_steps
    index, reached = _first_new_best(whole["evaluations"], at_epoch_end)
    target = reached["val_accuracy"]
    model_dir = tmp_path / "target"
    capsys.readouterr()
    _, summary = run(model_dir, eval_every_steps=2, target_accuracy=target)
    step = reached["step"]
    assert untimed([summary["target"]]) == untimed(
        [{"target_accuracy": target, "reached": True, **reached}]
    )
    assert summary["target"]["examples"] == 32 * step
    assert untimed(summary["evaluations"]) == untimed(whole["evaluations"][: index + 1])
    output = capsys.readouterr().out
    final = [line for line in output.splitlines() if line.startswith("final:")]
    assert len(final) == 1 and f"target={target} reached at step {step} ({32 * step} " in final[0]
    # The checkpoint of the stop, and nothing after it.
    epochs, inside = divmod(step, STEPS_PER_EPOCH)
    assert checkpoints.saved(str(model_dir / "checkpoints"))[-1] == (epochs, inside)
    written = json.loads((model_dir / "summary.json").read_text())
    assert written["target"] == summary["target"]
    # A rerun resumes at the stop and trains no further.
    before = fingerprint(model_dir / "checkpoints")
    _, again = run(model_dir, eval_every_steps=2, target_accuracy=target)
    assert "resuming" in capsys.readouterr().out
    assert again["target"] == summary["target"]
    assert fingerprint(model_dir / "checkpoints") == before


def test_a_target_not_reached_is_a_result(every_two_steps, tmp_path, capsys):
    _, whole = every_two_steps
    best = max(e["val_accuracy"] for e in whole["evaluations"])
    target = min(1.0, best + 1e-6)
    assert best < target
    capsys.readouterr()
    _, summary = run(tmp_path / "run", eval_every_steps=2, target_accuracy=target)
    assert summary["target"] == {
        "target_accuracy": target,
        "reached": False,
        "steps": TOTAL_STEPS,
        "examples": 32 * TOTAL_STEPS,
    }
    assert untimed(summary["evaluations"]) == untimed(whole["evaluations"])
    assert f"target={target} not reached in {TOTAL_STEPS} steps" in capsys.readouterr().out


def test_with_a_validation_split_the_target_is_read_there_and_the_test_at_the_target(tmp_path):
    # 64 training images held out: every evaluation and the target read them;
    # the test split (its first 64) is evaluated once, at the target.
    model_dir = tmp_path / "run"
    config, summary = run(
        model_dir,
        eval_every_steps=2,
        target_accuracy=0.01,
        validation_examples=64,
        save_weights_at_steps=("0", "2", "5"),
    )
    found = summary["target"]
    assert (found["reached"], found["step"], len(summary["evaluations"])) == (True, 2, 1)
    assert summary["evaluations"][0] == {
        k: v for k, v in found.items() if k in summary["evaluations"][0]
    }
    # The test accuracy is the checkpoint of the stop's on the test split.
    data = input_pipeline.load(config)
    assert (data.info.num_eval, data.test.info.num_eval) == (64, 64)
    model = build.compiled_model(config, data.info.num_classes, 0.0)
    model.load_weights(checkpoints.stem(str(model_dir / "checkpoints"), 0, 2) + ".weights.h5")
    expected = model.evaluate(data.test.eval(32), verbose=0, return_dict=True)
    assert (found["test_accuracy"], found["test_loss"]) == pytest.approx(
        (expected["accuracy"], expected["loss"]), rel=1e-5
    )
    validation = model.evaluate(data.eval(32), verbose=0, return_dict=True)
    assert found["val_accuracy"] == pytest.approx(validation["accuracy"], rel=1e-5)
    # --save_weights_at_steps: the weights before training and at the stop (step 5
    # never came); the latter are the checkpoint's.
    saved = sorted(p.name for p in (model_dir / "weights").iterdir())
    assert saved == ["step-000000.weights.h5", "step-000002.weights.h5"]
    at_stop = build.create_model(config, data.info.num_classes)
    at_stop.load_weights(model_dir / "weights" / "step-000002.weights.h5")
    for mine, theirs in zip(at_stop.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    initial = build.create_model(config, data.info.num_classes)
    initial.load_weights(model_dir / "weights" / "step-000000.weights.h5")
    assert not np.array_equal(initial.get_weights()[0], model.get_weights()[0])


@pytest.mark.parametrize(
    "settings, line",
    [
        ({"target_accuracy": 1.5}, "--target_accuracy=1.5: must be in (0, 1] (0: no target)."),
        ({"target_accuracy": -0.2}, "--target_accuracy=-0.2: must be in (0, 1] (0: no target)."),
        (
            {"target_accuracy": 0.9, "eval": False},
            "--target_accuracy=0.9: needs --eval (it is read on the evaluation split).",
        ),
        ({"eval_every_steps": -1}, "--eval_every_steps=-1: must be >= 0."),
        (
            {"save_weights_at_steps": ("0", "-2")},
            "--save_weights_at_steps=0,-2: '-2' is not a step (an integer >= 0).",
        ),
        (
            {"target_accuracy": 0.9, "collapse_patience": -1},
            "--collapse_patience=-1: must be >= 0, and it needs --target_accuracy.",
        ),
        (
            {"collapse_patience": 3},
            "--collapse_patience=3: must be >= 0, and it needs --target_accuracy.",
        ),
        (
            {"eval_every_steps": 10, "eval": False},
            "--eval_every_steps=10: needs --eval (it is read on the evaluation split).",
        ),
    ],
)
def test_bad_target_settings_are_one_line_naming_the_flag(settings, line):
    with pytest.raises(train.ConfigError) as raised:
        train.Config(**settings)
    assert str(raised.value) == line


# Nesterov at a peak rate of 0.1 warmed up over 3 of 6 epochs: the network
# learns in the warmup (above 3 / 10 accuracy), then collapses as the rate
# rises; its output then ignores its input and scores the evaluation set's
# share of one class (at most 9 of the 64) to the end.
COLLAPSING = dict(
    optimizer="nesterov",
    base_learning_rate=0.1,
    train_epochs=6,
    warmup_epochs=3,
    eval_every_steps=2,
    target_accuracy=0.99,
)
PATIENCE = 4


def _first_collapse(accuracies, patience, chance=0.15, learnt=0.3):
    """The index of the evaluation ending the first run of `patience` at
    most `chance` after one above `learnt`, written out here from the
    definition in --collapse_patience's help."""
    for end in range(patience - 1, len(accuracies)):
        window = accuracies[end - patience + 1 : end + 1]
        if (
            all(a <= chance for a in window)
            and max(accuracies[: end - patience + 1] + [0]) > learnt
        ):
            return end
    raise AssertionError(f"no collapse in {accuracies}")


@pytest.mark.parametrize(
    "accuracies, patience, expected",
    [
        ([0.1, 0.1, 0.1, 0.1], 2, False),  # at chance from the start: not learnt yet
        ([0.5, 0.1, 0.15], 2, True),  # 0.15 = 1.5 / 10 is at chance
        ([0.5, 0.1, 0.16], 2, False),
        ([0.5, 0.1], 2, False),  # the learnt evaluation is inside the window
        ([0.3, 0.1, 0.1], 2, False),  # 0.3 is not above 2 x 0.15
        ([0.31, 0.1, 0.1], 2, True),
        ([0.9, 0.1, 0.1, 0.1], 0, False),  # 0: never
        ([0.9, 0.1, 0.1, 0.1], 5, False),  # fewer evaluations than the patience
        ([0.9, 0.1, 0.5, 0.1, 0.1], 2, True),  # the last two count, after a recovery
    ],
)
def test_a_collapse_is_the_last_evaluations_at_chance_after_learning(
    accuracies, patience, expected
):
    assert target.collapsed(accuracies, 10, patience) is expected


def test_a_collapsed_run_stops_there_not_reached(tmp_path, capsys):
    _, whole = run(tmp_path / "whole", **{**COLLAPSING, "target_accuracy": 0.0})
    accuracies = [e["val_accuracy"] for e in whole["evaluations"]]
    end = _first_collapse(accuracies, PATIENCE)
    assert end < len(accuracies) - 1, accuracies  # it would have trained on
    model_dir = tmp_path / "stopped"
    capsys.readouterr()
    _, summary = run(model_dir, **COLLAPSING, collapse_patience=PATIENCE)
    # Stopping changes no number before the stop.
    assert untimed(summary["evaluations"]) == untimed(whole["evaluations"][: end + 1])
    step = whole["evaluations"][end]["step"]
    found = summary["target"]
    assert untimed([found["collapsed"]]) == untimed([whole["evaluations"][end]])
    assert {k: v for k, v in found.items() if k != "collapsed"} == {
        "target_accuracy": 0.99,
        "reached": False,
        "steps": 48,
        "examples": 32 * 48,
    }
    output = capsys.readouterr().out
    assert f"target: out of reach at step {step}: {PATIENCE} evaluations in a row" in output
    final = [line for line in output.splitlines() if line.startswith("final:")]
    assert len(final) == 1
    assert f"target=0.99 not reached: collapsed to chance, stopped at step {step} of 48" in final[0]
    epochs, inside = divmod(step, STEPS_PER_EPOCH)
    assert checkpoints.saved(str(model_dir / "checkpoints"))[-1] == (epochs, inside)
    # A rerun resumes at the stop and trains no further.
    before = fingerprint(model_dir / "checkpoints")
    _, again = run(model_dir, **COLLAPSING, collapse_patience=PATIENCE)
    assert "resuming" in capsys.readouterr().out
    assert again["target"] == summary["target"]
    assert fingerprint(model_dir / "checkpoints") == before
