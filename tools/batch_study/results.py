"""The study's results: the per-cell and aggregate tables (CSV and JSON) and
the plot of test accuracy against batch size, rewritten after every cell."""

import csv
import json
import math
import os

import numpy as np

from keras_lars.tools import storage
from keras_lars.tools.batch_study.cells import GRID

ROW_FIELDS = (
    "optimizer",
    "batch_size",
    "seed",
    "test_accuracy",
    "test_loss",
    "test_accuracy_precise_bn",
    "test_loss_precise_bn",
    "train_accuracy",
    "train_loss",
    "steps",
    "epochs",
    "steps_per_epoch",
    "warmup_steps",
    "peak_learning_rate",
    "full_batch",
    "wall_seconds",
    "key",
)


ACCURACIES = ("test_accuracy", "test_accuracy_precise_bn")

# The batch-control table: one row per fixed / ramp / grow cell.
CONTROL_FIELDS = (
    "optimizer",
    "kind",
    "batch_schedule",
    "seed",
    "test_accuracy",
    "test_accuracy_precise_bn",
    "train_accuracy",
    "steps",
    "peak_learning_rate",
    "wall_seconds",
    "key",
)


AGGREGATE_FIELDS = (
    "optimizer",
    "batch_size",
    "seeds",
    *(f"{m}_{s}" for m in ACCURACIES for s in ("mean", "std", "min", "max")),
    "train_accuracy_mean",
    "test_loss_mean",
    "test_loss_precise_bn_mean",
    "steps",
    "peak_learning_rate",
    "full_batch",
    "wall_seconds_mean",
)


def aggregate(rows):
    """One row per (optimizer, batch size), in first-seen order: for both
    test accuracies the mean, sample standard deviation (ddof=1; 0 for one
    seed), min and max over seeds; means of the training accuracy, the test
    losses (nan if a seed diverged) and the wall time."""
    groups = {}
    for row in rows:
        groups.setdefault((row["optimizer"], row["batch_size"]), []).append(row)
    found = []
    for (optimizer, batch), group in groups.items():
        entry = {"optimizer": optimizer, "batch_size": batch, "seeds": len(group)}
        for metric in ACCURACIES:
            values = np.array([r[metric] for r in group], dtype=np.float64)
            entry.update(
                {
                    f"{metric}_mean": float(values.mean()),
                    f"{metric}_std": float(values.std(ddof=1)) if len(group) > 1 else 0.0,
                    f"{metric}_min": float(values.min()),
                    f"{metric}_max": float(values.max()),
                }
            )
        for metric in ("train_accuracy", "test_loss", "test_loss_precise_bn", "wall_seconds"):
            entry[f"{metric}_mean"] = float(np.mean([r[metric] for r in group]))
        entry.update(
            steps=group[0]["steps"],
            peak_learning_rate=group[0]["peak_learning_rate"],
            full_batch=group[0]["full_batch"],
        )
        found.append(entry)
    return found


def _finite(value):
    """JSON has no nan / inf: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_table(stem, fields, rows, header):
    """stem.csv and stem.json (`header` plus the rows)."""

    def write_csv(f):
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: row[k] for k in fields} for row in rows)

    def write_json(f):
        clean = [{k: _finite(row[k]) for k in fields} for row in rows]
        json.dump(dict(header, rows=clean), f, indent=1, allow_nan=False)

    for path, write in ((stem + ".csv", write_csv), (stem + ".json", write_json)):
        with storage.atomic_file(path) as f:
            write(f)


def plot(aggregated, path, title, num_train):
    """Test accuracy (mean, error bars = std over seeds) against batch size
    on a log axis, one line per optimizer: as the tool measures it (batch-norm
    moving averages) and with precise BN; written with Matplotlib's Agg
    canvas (no display, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.6), dpi=100)
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, 2, sharey=True)
    optimizers = list(dict.fromkeys(row["optimizer"] for row in aggregated))
    batches = sorted({row["batch_size"] for row in aggregated})
    subtitles = (
        "test accuracy (batch-norm moving averages)",
        "test accuracy, batch-norm statistics re-estimated (precise BN)",
    )
    for axes, metric, subtitle in zip(panels, ACCURACIES, subtitles):
        for i, optimizer in enumerate(optimizers):
            rows = sorted(
                (r for r in aggregated if r["optimizer"] == optimizer),
                key=lambda r: r["batch_size"],
            )
            # A small horizontal offset per optimizer keeps the error bars apart.
            shift = 2 ** (0.05 * (i - (len(optimizers) - 1) / 2))
            axes.errorbar(
                [r["batch_size"] * shift for r in rows],
                [r[f"{metric}_mean"] for r in rows],
                yerr=[r[f"{metric}_std"] for r in rows],
                marker="o",
                capsize=3,
                label=optimizer,
            )
        axes.set_xscale("log")
        axes.set_xticks(batches)
        axes.set_xticklabels([f"{b}\n(full)" if b == num_train else str(b) for b in batches])
        axes.minorticks_off()
        axes.set_xlabel("global batch size (log scale)")
        axes.set_title(subtitle, fontsize=9)
        axes.set_ylim(0, 1.02)
        axes.grid(True, alpha=0.3)
    panels[0].set_ylabel("test accuracy")
    panels[0].legend(title="optimizer", loc="lower left")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    with storage.atomic_file(path, "wb") as f:
        figure.savefig(f, format="png")


def control_rows(cells, records):
    """The CONTROL_FIELDS rows of the batch-control cells found in `records`
    (a fixed cell's schedule is its one batch, "0:B")."""
    found = []
    for cell in cells:
        if cell.kind == GRID or cell.key not in records:
            continue
        schedule = cell.config.batch_schedule or f"0:{cell.batch_size}"
        row = dict(records[cell.key]["row"], kind=cell.kind, batch_schedule=schedule)
        found.append({field: row[field] for field in CONTROL_FIELDS})
    return found


def plot_control(rows, path, title):
    """Test accuracy (precise BN) of each batch-control cell as a bar, one
    group per optimizer, labelled with its parameter updates."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    optimizers = list(dict.fromkeys(row["optimizer"] for row in rows))
    kinds = list(dict.fromkeys(row["kind"] for row in rows))
    width = 0.8 / len(kinds)
    for j, kind in enumerate(kinds):
        for i, optimizer in enumerate(optimizers):
            group = [r for r in rows if r["optimizer"] == optimizer and r["kind"] == kind]
            if not group:
                continue
            accuracy = float(np.mean([r["test_accuracy_precise_bn"] for r in group]))
            x = i + (j - (len(kinds) - 1) / 2) * width
            axes.bar(x, accuracy, width, color=f"C{j}", label=kind if i == 0 else None)
            axes.annotate(
                f"{group[0]['steps']} steps", (x, accuracy), ha="center", va="bottom", fontsize=7
            )
    axes.set_xticks(range(len(optimizers)))
    axes.set_xticklabels(optimizers)
    axes.set_ylim(0, 1.05)
    axes.set_ylabel("test accuracy (precise BN)")
    axes.legend(title="cell", loc="lower right")
    axes.grid(True, axis="y", alpha=0.3)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    with storage.atomic_file(path, "wb") as f:
        figure.savefig(f, format="png")


def write_outputs(study, cells, records, num_train):
    """Tables and plots of the cells of `study` found in `records`: the
    grid's (cells, aggregate, accuracy_vs_batch.png) and the batch-control
    cells' (batch_control, batch_control.png)."""
    grid = [c for c in cells if c.kind == GRID]
    rows = [records[c.key]["row"] for c in grid if c.key in records]
    if not rows:
        return
    any_config = cells[0].config
    header = {
        "study": {
            "model": any_config.model,
            "dataset": any_config.dataset,
            "data_dir": any_config.data_dir,
            "image_size": any_config.image_size,
            "train_examples": num_train,
            "train_epochs": any_config.train_epochs,
            "warmup_epochs": any_config.warmup_epochs,
            "end_learning_rate": any_config.end_learning_rate,
            "momentum": any_config.momentum,
            "weight_decay": any_config.weight_decay,
            "optimizers": list(study.optimizers),
            "base_learning_rates": {k: v[0] for k, v in study.rates.items()},
            "lr_scaling": {k: v[1] for k, v in study.rates.items()},
            "batch_sizes": sorted({c.batch_size for c in cells}),
            "seeds": study.seeds,
            "control_schedule": study.control_schedule,
            "cells_done": len({c.key for c in cells if c.key in records}),
            "cells_total": len({c.key for c in cells}),
        }
    }
    aggregated = aggregate(rows)
    write_table(os.path.join(study.study_dir, "cells"), ROW_FIELDS, rows, header)
    write_table(os.path.join(study.study_dir, "aggregate"), AGGREGATE_FIELDS, aggregated, header)
    title = (
        f"{any_config.model} on {any_config.dataset} ({num_train} training images, "
        f"{any_config.image_size}x{any_config.image_size}), {any_config.train_epochs} "
        f"epochs, {study.seeds} seed(s); mean ± std over seeds"
    )
    plot(aggregated, os.path.join(study.study_dir, "accuracy_vs_batch.png"), title, num_train)
    control = control_rows(cells, records)
    if control:
        write_table(os.path.join(study.study_dir, "batch_control"), CONTROL_FIELDS, control, header)
        plot_control(
            control,
            os.path.join(study.study_dir, "batch_control.png"),
            f"{title}\nbatch control: {study.control_schedule}",
        )
