"""Running a study: each cell the store lacks is trained with the training
tool, evaluated with precise BN and appended to the store, and the results
are rewritten after it."""

import contextlib
import dataclasses
import gc
import os
import shutil
import sys
import time

import keras

from keras_lars.tools import input_pipeline
from keras_lars.tools import train
from keras_lars.tools.batch_study.cell_store import append_record
from keras_lars.tools.batch_study.cell_store import load_store
from keras_lars.tools.batch_study.cells import make_cells
from keras_lars.tools.batch_study.precise_bn import precise_bn_evaluation
from keras_lars.tools.batch_study.results import ROW_FIELDS
from keras_lars.tools.batch_study.results import write_outputs
from keras_lars.tools.model_dir_names import CHECKPOINTS


def train_logged(config, then):
    """train.train_and_evaluate(config) (or its resume) with the tool's output
    in the model dir's train.log; its summary. SIGTERM, SIGHUP or SIGINT
    (also one received by the study's handler before) stops the training at
    a checkpoint, or, after it, raises train.Preempted before `then` (what
    the caller does next) rather than after."""
    os.makedirs(config.model_dir, exist_ok=True)
    preemption = train.Preemption()
    with preemption.handling(action="stopping the cell at its next step boundary"):
        with open(os.path.join(config.model_dir, "train.log"), "a") as log:
            with contextlib.redirect_stdout(log):
                summary = train.train_and_evaluate(config)
        if preemption.signal:
            raise train.Preempted(
                f"stopped by {preemption.signal} after its training, before {then}; "
                "run the same command to go on"
            )
    return summary


def run_cell(cell, data):
    """Trains one cell (or resumes it) with the training tool, then
    evaluates it with precise BN; its record. The tool's output goes to the
    cell's train.log; the cell's checkpoints stay for a rerun after a
    preemption (train_logged)."""
    started = time.time()
    summary = train_logged(cell.config, "its precise-BN evaluation")
    wall = time.time() - started
    keras.backend.clear_session()
    precise_accuracy, precise_loss = precise_bn_evaluation(cell.config, data)
    keras.backend.clear_session()
    gc.collect()
    shutil.rmtree(os.path.join(cell.config.model_dir, CHECKPOINTS), ignore_errors=True)
    final = summary["final"]
    num_train = data.info.num_train
    row = {
        "optimizer": cell.optimizer,
        "batch_size": cell.batch_size,
        "seed": cell.seed,
        "test_accuracy": final["val_accuracy"],
        "test_loss": final["val_loss"],
        "test_accuracy_precise_bn": precise_accuracy,
        "test_loss_precise_bn": precise_loss,
        "train_accuracy": final["accuracy"],
        "train_loss": final["loss"],
        "steps": int(final["steps"]),  # the optimizer's iterations at the end
        "epochs": summary["epochs"],
        "steps_per_epoch": summary["steps_per_epoch"],
        "warmup_steps": summary["warmup_steps"],
        "peak_learning_rate": cell.config.peak_learning_rate,
        "full_batch": cell.batch_size == num_train,
        "wall_seconds": round(wall, 2),
        "key": cell.key,
    }
    if row["steps"] != cell.length.total_steps:
        print(
            f"warning: {cell.name} ran {row['steps']} optimizer steps, "
            f"{cell.length.total_steps} planned.",
            file=sys.stderr,
        )
    return {
        "key": cell.key,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "config": dataclasses.asdict(cell.config),
        "row": row,
        "history": summary["history"],
    }


def run_study(study):
    """Runs the cells of `study` that the store lacks; returns (rows of the
    study's cells, keys of the cells trained by this call). SIGTERM, SIGHUP
    or SIGINT stops it as it stops the training tool (train.Preempted naming
    the cell; a rerun resumes that cell from its checkpoint)."""
    preemption = train.Preemption()
    action = "stopping the study at its running cell's next step boundary"
    with preemption.handling(action=action):
        return _run_cells(study, preemption)


def _stop_if_preempted(preemption, where):
    if preemption.signal:
        raise train.Preempted(
            f"stopped by {preemption.signal} {where}; run the same command to go on"
        )


def _run_cells(study, preemption):
    data = input_pipeline.load(study.shared)
    num_train = data.info.num_train
    cells = make_cells(study, num_train)
    os.makedirs(study.study_dir, exist_ok=True)
    store_path = os.path.join(study.study_dir, "cells.jsonl")
    records = load_store(store_path, ROW_FIELDS)
    trained = []
    for i, cell in enumerate(cells, 1):
        where = f"[{i}/{len(cells)}] {cell.label}"
        if cell.key in records:
            print(f"{where}: done before ({cell.name})", flush=True)
            continue
        _stop_if_preempted(preemption, f"before cell {where} ({cell.name})")
        print(
            f"{where}: peak rate {cell.config.peak_learning_rate:.4g}, "
            f"{cell.length.total_steps} steps ...",
            flush=True,
        )
        try:
            record = run_cell(cell, data)
        except train.Preempted as error:
            raise train.Preempted(f"cell {where} ({cell.name}) {error}") from None
        append_record(store_path, record)
        records[cell.key] = record
        trained.append(cell.key)
        row = record["row"]
        print(
            f"{where}: test_accuracy={row['test_accuracy']:.4f} "
            f"(precise BN {row['test_accuracy_precise_bn']:.4f}) "
            f"train_accuracy={row['train_accuracy']:.4f} steps={row['steps']} "
            f"({row['wall_seconds']:.0f} s)",
            flush=True,
        )
        write_outputs(study, cells, records, num_train)
        _stop_if_preempted(preemption, f"after cell {where} ({cell.name}), which is stored")
    write_outputs(study, cells, records, num_train)
    print(
        f"study: {len(trained)} cell(s) trained, {len(cells) - len(trained)} found done; "
        f"tables and plot in {study.study_dir}",
        flush=True,
    )
    return [records[c.key]["row"] for c in cells], trained
