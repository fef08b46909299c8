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
from keras_lars.tools.batch_study.cells import cell_config
from keras_lars.tools.batch_study.cells import make_cells
from keras_lars.tools.batch_study.precise_bn import precise_bn_evaluation
from keras_lars.tools.batch_study.results import write_outputs
from keras_lars.tools.batch_study.store import append_record
from keras_lars.tools.batch_study.store import load_store


def run_cell(cell, data):
    """Trains one cell (or resumes it) with the training tool, then
    evaluates it with precise BN; its record. The tool's output goes to the
    cell's train.log."""
    os.makedirs(cell.config.model_dir, exist_ok=True)
    started = time.time()
    with open(os.path.join(cell.config.model_dir, "train.log"), "a") as log:
        with contextlib.redirect_stdout(log):
            summary = train.train_and_evaluate(cell.config)
    wall = time.time() - started
    keras.backend.clear_session()
    precise_accuracy, precise_loss = precise_bn_evaluation(cell.config, data)
    keras.backend.clear_session()
    gc.collect()
    shutil.rmtree(os.path.join(cell.config.model_dir, "checkpoints"), ignore_errors=True)
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
    study's cells, keys of the cells trained by this call)."""
    config = cell_config(study, study.optimizers[0], 1, 0)
    data = input_pipeline.load(config)
    num_train = data.info.num_train
    cells = make_cells(study, num_train)
    os.makedirs(study.study_dir, exist_ok=True)
    store_path = os.path.join(study.study_dir, "cells.jsonl")
    records = load_store(store_path)
    trained = []
    for i, cell in enumerate(cells, 1):
        where = f"[{i}/{len(cells)}] {cell.optimizer} batch={cell.batch_size} seed={cell.seed}"
        if cell.key in records:
            print(f"{where}: done before ({cell.name})", flush=True)
            continue
        print(
            f"{where}: peak rate {cell.config.peak_learning_rate:.4g}, "
            f"{cell.length.total_steps} steps ...",
            flush=True,
        )
        record = run_cell(cell, data)
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
    write_outputs(study, cells, records, num_train)
    print(
        f"study: {len(trained)} cell(s) trained, {len(cells) - len(trained)} found done; "
        f"tables and plot in {study.study_dir}",
        flush=True,
    )
    return [records[c.key]["row"] for c in cells], trained
