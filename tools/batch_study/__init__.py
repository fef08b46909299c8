"""Large-batch study: test accuracy against the global batch size, per optimizer,
at a fixed epoch budget.

    keras-lars-study          # digits, ResNet-18 at 16x16, 48 cells, ~40 min on 2 cores

    # Fashion-MNIST at 28x28 (apt-get install dataset-fashion-mnist, or --data_dir)
    keras-lars-study --dataset=fashion_mnist --batch_sizes=256,1024,4096,16384,full

    # your own ImageNet-format TFRecords (keras-lars-make-tfrecords)
    keras-lars-study --dataset=imagenet --data_dir=data/photos \\
        --image_size=64 --batch_sizes=64,256,1024,full --train_epochs=30

Also `python -m keras_lars.tools.batch_study`. Every cell (optimizer, global
batch B, seed) is one run of the training tool (`train.train_and_evaluate`)
for the same --train_epochs, so a larger batch takes fewer steps:
steps = epochs * floor(N / B) for N training examples ("full" in
--batch_sizes is B = N: one step per epoch). Every
optimizer follows `keras_lars.WarmupPolyDecay` (linear warmup over
--warmup_epochs, power-2 decay to --end_learning_rate) with the peak rate its
scaling rule gives from its base rate per 256 examples (the tool's
--lr_scaling, `train.scaled_learning_rate`): linear, sqrt or none.

Defaults (--base_learning_rates, --lr_scaling): momentum SGD and Nesterov 0.1
per 256, linear (Goyal et al. 2017); LARS 2.5 per 256, linear; LAMB 0.01 per
256, square root. Each is the best of candidates 4x apart in a one-seed probe
at batch 128 on digits (README, "Large-batch study"); Nesterov takes SGD's.
Adam (--optimizers=...,adam; not in the default list) takes 0.001 per 256,
square root, unprobed.
Nothing is tuned per batch size: the question is whether a rule chosen once
holds as the batch grows.

Each cell reports two test accuracies: the tool's (the network as trained,
batch norm using its moving averages) and one with "precise BN" (Wu & Johnson
2021): the last checkpoint with every batch-norm layer's statistics
re-estimated on training images. With a fixed epoch budget the largest
batches take only a few steps, after which the moving averages (momentum 0.9)
still hold much of their initial values; the second number separates what
the optimizer reached from that lag.

Every other setting is a flag of the training tool shared by all cells
(--model, --dataset, --data_dir, --image_size, --momentum, --weight_decay,
...); the study's own defaults: --train_epochs=10, --warmup_epochs=2 and, on
digits, --image_size=16 (other data sets keep the tool's: 28 on
fashion_mnist). The settings the study sets per cell (PER_CELL, the
fields of `CellSettings`: --optimizer, --global_batch_size,
--base_learning_rate, --seed, --model_dir, ...) are not its flags; its
--base_learning_rates and --lr_scaling give each optimizer its own value of
the tool's --base_learning_rate and --lr_scaling.

Outputs in --study_dir (a local directory):

    cells.jsonl           the store: one JSON line per finished cell, appended
                          as it finishes (its full config, key, row, history)
    cells.csv, .json      one row per (optimizer, batch, seed) cell of this study
    aggregate.csv, .json  one row per (optimizer, batch): mean, std over seeds
    accuracy_vs_batch.png test accuracy against batch size (log axis), one line
                          per optimizer, error bars = std over seeds
    batch_control.*       with --control_schedule: the fixed / ramp / grow cells
                          (cells.py), their accuracies and parameter updates
    cells/<name>/         each cell's model dir (config, summary, logs, train.log)

Resuming: rerun the same command. A cell is identified by a hash of its whole
training config (every setting of train.Config that decides its numbers,
not where and how it runs, logs and checkpoints): cells
found in the store are not rerun, a cell whose config changed (another rate,
epoch count, model, ...) gets a new key and runs, and a cell killed midway
resumes from its last epoch checkpoint. SIGTERM, SIGHUP or Ctrl-C stop the
study as they stop the training tool: the running cell checkpoints at its
next step boundary and the study exits 75 with one line `preempted: cell
[i/n] ...` naming it; the same command resumes that cell. Tables and plot
are rewritten (under a temporary name, then renamed) after every cell.

The parts, each using only those above it:

    study        StudySettings, CellSettings (PER_CELL), Study, make_study
    cells        a cell's Config, run length and key; make_cells
    precise_bn   recalibrate_batch_norm, precise_bn_evaluation
    cell_store   cells.jsonl: load_store, append_record
    results      aggregate, write_table, plot, write_outputs
    runner       run_cell, run_study
    target_search, target_results   the steps-to-target mode's grid search and its outputs
    quasi_search, quasi_results     its quasi-random search (--search=quasi_random)
    noise_along                     B_simple at fixed weights along the best trials' runs
    adaptive_arm                    the adaptive batch's arm (--adaptive_batch) beside a fixed study
    target_runner                   run_target_study: either search, trial by trial
    cli          define_flags, study_from_flags, main, run (keras-lars-study)

Importing the package imports no Keras, TensorFlow or JAX: the names below load
their module on first use (keras-lars-study checks its flags before they load).
"""

import importlib

# module -> its names, each loaded on first use (__getattr__).
_EXPORTS = {
    "cells": (
        "cell_config",
        "cell_key",
        "make_cells",
    ),
    "cli": (
        "define_flags",
        "run",
        "study_from_flags",
    ),
    "precise_bn": ("recalibrate_batch_norm",),
    "results": ("aggregate",),
    "runner": (
        "run_cell",
        "run_study",
    ),
    "cell_store": (
        "append_record",
        "load_store",
    ),
    "study": (
        "DIGITS_IMAGE_SIZE",
        "PER_CELL",
        "STUDY_DEFAULTS",
        "StudySettings",
        "make_study",
    ),
    "target_runner": ("run_target_study",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBMODULES = (
    "adaptive_arm",
    "cell_store",
    "cells",
    "cli",
    "noise_along",
    "precise_bn",
    "quasi_results",
    "quasi_search",
    "results",
    "runner",
    "study",
    "target_results",
    "target_runner",
    "target_search",
)

__all__ = [
    "DIGITS_IMAGE_SIZE",
    "PER_CELL",
    "STUDY_DEFAULTS",
    "StudySettings",
    "make_study",
    "cell_config",
    "cell_key",
    "make_cells",
    "recalibrate_batch_norm",
    "append_record",
    "load_store",
    "aggregate",
    "run_cell",
    "run_study",
    "run_target_study",
    "define_flags",
    "run",
    "study_from_flags",
]


def __getattr__(name):
    if name in _MODULE_OF:
        return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
