"""The gradient noise scale along the chosen run, at fixed weights
(--search=quasi_random --noise_batch_sizes).

At each batch of --noise_batch_sizes, each optimizer's best trial (seed 0,
quasi_search.best_trial) that reached the goal in S steps trains once more,
the same Config in a model dir of its own, saving its weights after
round(f * S) steps for each f of --noise_fractions (the training tool's
--save_weights_at_steps; 0 is the start). At each saved point
keras_lars.measure_noise_scale measures B_simple on the trial's training
images: --noise_groups groups of --noise_micro_batches micro-batches of
--noise_micro_batch_size, no moving average, with a jackknife 95% interval.
Without batch norm the rerun is the trial's own run, to float rounding (which
training then amplifies). Each measurement is appended to noise_scales.jsonl
as it is taken (a rerun of the study measures only what is missing), and
noise_scales.csv / .json are rewritten from it.
"""

import dataclasses
import os
import shutil

import keras
import numpy as np

import keras_lars
from keras_lars.tools.batch_study.cell_store import append_record
from keras_lars.tools.batch_study.cell_store import load_store
from keras_lars.tools.batch_study.quasi_search import best_trial
from keras_lars.tools.batch_study.results import write_table
from keras_lars.tools.batch_study.runner import train_logged
from keras_lars.tools.batch_study.study import batch_examples
from keras_lars.tools.batch_study.target_results import trial_rows
from keras_lars.tools.model_dir_names import CHECKPOINTS
from keras_lars.tools.study_files import NOISE_STORE
from keras_lars.tools.study_files import NOISE_TABLE
from keras_lars.tools.train import build
from keras_lars.tools.train.saved_weights import weights_path

NOISE_FIELDS = (
    "optimizer",
    "batch_size",
    "trial",
    "fraction",
    "step",
    "steps_to_goal",
    "noise_scale",
    "low",
    "high",
    "standard_error",
    "gradient_sq",
    "trace",
    "small_batch",
    "big_batch",
    "groups",
)
CONFIDENCE = 0.95


class TrainingImages:
    """The training split of an in-memory DataSource as measure_noise_scale's
    x: its images decoded (the source's preprocess) only as they are drawn."""

    def __init__(self, data):
        (images, labels), _ = data.arrays
        self.images, self.labels = images.numpy(), labels.numpy()
        self.preprocess = data.preprocess

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        batch = self.images[index]
        return batch if self.preprocess is None else np.asarray(self.preprocess(batch))


def points(steps, fractions):
    """{step: fraction} of the saved points of a run of `steps` to the goal."""
    return {round(f * steps): f for f in fractions}


def best_trials(study, trials, records, num_train):
    """[(Trial, its row)] of each optimizer's best seed-0 trial at the
    batches of --noise_batch_sizes, where it reached the goal."""
    wanted = {batch_examples(b, num_train) for b in study.search.noise_batch_sizes}
    search = {}
    for t, row in zip(trials, trial_rows(trials, records)):
        if t.seed == 0 and t.batch_size in wanted:
            search.setdefault((t.optimizer, t.batch_size), {})[t.rate_step] = (t, row)
    found = []
    for mine in search.values():
        t, row = mine[best_trial({i: r for i, (_, r) in mine.items()})]
        if row["reached"]:
            found.append((t, row))
    return found


def train_weights(t, steps):
    """Trains Trial `t` once more, saving its weights after `steps`; its model dir."""
    config = dataclasses.replace(
        t.config,
        model_dir=f"{t.config.model_dir}-weights",
        save_weights_at_steps=tuple(str(s) for s in sorted(steps)),
    )
    train_logged(config, "its noise scales were measured")
    keras.backend.clear_session()
    shutil.rmtree(os.path.join(config.model_dir, CHECKPOINTS), ignore_errors=True)
    return config.model_dir


def measure(t, directory, step, examples, num_classes, search):
    """keras_lars.measure_noise_scale at the weights `t` saved after `step`."""
    model = build.create_model(t.config, num_classes)
    model.load_weights(weights_path(directory, step))
    return keras_lars.measure_noise_scale(
        model,
        examples,
        examples.labels,
        build.CrossEntropy(num_classes, t.config.label_smoothing),
        search.noise_micro_batch_size,
        search.noise_micro_batches,
        search.noise_groups,
        seed=step,
        confidence=CONFIDENCE,
    )


def measure_along(study, trials, records, num_train, data):
    """Measures what noise_scales.jsonl lacks of the points of the best
    trials (module docstring); rewrites noise_scales.csv / .json. Returns
    the rows of this plan's measurements."""
    search = study.search
    path = os.path.join(study.study_dir, NOISE_STORE)
    stored = load_store(path, NOISE_FIELDS)
    examples, found = None, []
    for t, row in best_trials(study, trials, records, num_train):
        at = points(row["steps"], search.noise_fractions)
        keys = {step: measurement_key(t, step, search) for step in at}
        missing = [step for step in sorted(at) if keys[step] not in stored]
        if missing:
            print(f"noise scale of {t.label} at steps {missing} ...", flush=True)
            directory = train_weights(t, at)
            examples = examples or TrainingImages(data)
        for step in sorted(at):
            if keys[step] not in stored:
                m = measure(t, directory, step, examples, data.info.num_classes, search)
                values = {
                    "optimizer": t.optimizer,
                    "batch_size": t.batch_size,
                    "trial": t.rate_step,
                    "fraction": at[step],
                    "step": step,
                    "steps_to_goal": row["steps"],
                    "noise_scale": m.noise_scale,
                    "low": m.interval[0],
                    "high": m.interval[1],
                    "standard_error": m.standard_error,
                    "gradient_sq": m.gradient_sq,
                    "trace": m.trace,
                    "small_batch": m.small_batch,
                    "big_batch": m.big_batch,
                    "groups": search.noise_groups,
                }
                stored[keys[step]] = {"key": keys[step], "row": values}
                append_record(path, stored[keys[step]])
            found.append(stored[keys[step]]["row"])
    if found:
        header = {"noise": {"confidence": CONFIDENCE, "trials_key": "best trial, seed 0"}}
        write_table(os.path.join(study.study_dir, NOISE_TABLE), NOISE_FIELDS, found, header)
    return found


def measurement_key(t, step, search):
    """The store key of Trial `t`'s measurement after `step` steps."""
    size = f"{search.noise_micro_batch_size}x{search.noise_micro_batches}x{search.noise_groups}"
    return f"{t.key}-{step}-{size}"
