"""Large-batch study: test accuracy against the global batch size, per optimizer,
at a fixed epoch budget.

    keras-lars-study          # digits, ResNet-18 at 16x16, 48 cells, ~40 min on 2 cores

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
digits, --image_size=16. The settings the study sets per cell (PER_CELL:
--optimizer, --global_batch_size, --base_learning_rate, --seed, --model_dir,
...) are not its flags.

Outputs in --study_dir (a local directory):

    cells.jsonl           the store: one JSON line per finished cell, appended
                          as it finishes (its full config, key, row, history)
    cells.csv, .json      one row per (optimizer, batch, seed) cell of this study
    aggregate.csv, .json  one row per (optimizer, batch): mean, std over seeds
    accuracy_vs_batch.png test accuracy against batch size (log axis), one line
                          per optimizer, error bars = std over seeds
    cells/<name>/         each cell's model dir (config, summary, logs, train.log)

Resuming: rerun the same command. A cell is identified by a hash of its whole
training config (every field of train.Config but its model dir): cells
found in the store are not rerun, a cell whose config changed (another rate,
epoch count, model, ...) gets a new key and runs, and a cell killed midway
resumes from its last epoch checkpoint. Tables and plot are rewritten (under
a temporary name, then renamed) after every cell.
"""

import contextlib
import csv
import dataclasses
import gc
import hashlib
import json
import math
import os
import shutil
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app
from absl import flags

import keras_lars
from keras_lars.tools import checkpoints
from keras_lars.tools import input_pipeline
from keras_lars.tools import settings
from keras_lars.tools import storage
from keras_lars.tools import train
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import setting

DEFAULT_RATES = {"sgd": 0.1, "nesterov": 0.1, "lars": 2.5, "lamb": 0.01}
DEFAULT_SCALING = {"sgd": "linear", "nesterov": "linear", "lars": "linear", "lamb": "sqrt"}
# The study's defaults for settings of the training tool.
STUDY_DEFAULTS = {"train_epochs": 10, "warmup_epochs": 2.0}
DIGITS_IMAGE_SIZE = 16
FULL = "full"
# Part of every cell's key: bump it when what a cell measures changes, so
# that stored cells measured the old way are not reused.
PROTOCOL = 3
RECALIBRATION_BATCH = 256
RECALIBRATION_EXAMPLES = 8192
# Settings of the training tool that the study sets per cell (they are not
# its flags): the grid, the cell's model dir, and what every cell must do.
PER_CELL = (
    "optimizer",
    "global_batch_size",
    "base_learning_rate",
    "lr_scaling",
    "seed",
    "model_dir",
    "recipe",
    "train_steps",
    "eval",
    "trust_ratio_log_every",
    "stop_on_divergence",  # off: a cell that diverges is a result (chance accuracy)
    "divergence_rollbacks",  # so no rollback either
    "divergence_rate_factor",
)


def _pairs_check(parse):
    """Checks 'optimizer=value' entries, parse(value) -> problem or None."""

    def check(entries, config):
        for entry in entries:
            name, sep, value = entry.partition("=")
            if not sep or name not in train.OPTIMIZERS:
                return (
                    f"expected optimizer=value pairs with optimizer one of "
                    f"{', '.join(train.OPTIMIZERS)}; got {entry!r}"
                )
            problem = parse(value)
            if problem:
                return f"{entry!r}: {problem}"
        return None

    return check


def _rate_problem(value):
    try:
        rate = float(value)
    except ValueError:
        rate = float("nan")
    return None if rate > 0 and not math.isinf(rate) else "the rate must be a number > 0"


def _rule_problem(value):
    return (
        None
        if value in train.SCALING_RULES
        else f"the rule must be one of {', '.join(train.SCALING_RULES)}"
    )


def _batch_sizes_problem(entries, config):
    if not entries:
        return "name at least one batch size"
    for entry in entries:
        if entry != FULL and not (entry.isdigit() and int(entry) >= 1):
            return f"{entry!r} is neither a positive integer nor {FULL!r}"
    return None


def _optimizers_problem(names, config):
    if not names:
        return "name at least one optimizer"
    if len(set(names)) < len(names):
        return "an optimizer is listed twice"
    return None


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """The study's own settings (its other flags are the training tool's)."""

    optimizers: tuple = setting(
        tuple(DEFAULT_RATES),
        "Optimizers to compare.",
        choices=train.OPTIMIZERS,
        check=_optimizers_problem,
    )
    batch_sizes: tuple = setting(
        ("32", "128", "512", FULL),
        "Global batch sizes; 'full' is the whole training set (one step per epoch).",
        check=_batch_sizes_problem,
    )
    seeds: int = setting(
        3, "Seeds per (optimizer, batch): 0, 1, ..., seeds - 1.", check=at_least(1)
    )
    base_learning_rates: tuple = setting(
        tuple(f"{k}={v}" for k, v in DEFAULT_RATES.items()),
        "optimizer=rate pairs: peak rate per 256 examples, scaled by --lr_scaling; "
        "optimizers not listed keep their default.",
        check=_pairs_check(_rate_problem),
    )
    lr_scaling: tuple = setting(
        tuple(f"{k}={v}" for k, v in DEFAULT_SCALING.items()),
        "optimizer=rule pairs, rule one of linear (base * B / 256), sqrt "
        "(base * sqrt(B / 256)), none (base); optimizers not listed keep their default.",
        check=_pairs_check(_rule_problem),
    )
    study_dir: str = setting(
        "runs/batch_study",
        "Store, tables, plot and cell model dirs (a local directory).",
        check=lambda value, config: None if value else "must be a directory path",
    )

    def __post_init__(self):
        settings.check(self)


@dataclasses.dataclass(frozen=True)
class Study:
    """A sweep: the training settings every cell shares, and the grid."""

    shared: train.Config  # its per-cell settings are overwritten by each cell
    optimizers: tuple
    batch_sizes: tuple  # ints and/or FULL
    seeds: int
    rates: dict  # optimizer -> (base rate per 256 examples, scaling rule)
    study_dir: str


@dataclasses.dataclass(frozen=True)
class Cell:
    optimizer: str
    batch_size: int
    seed: int
    config: train.Config
    plan: train.Plan
    key: str

    @property
    def name(self):
        return f"{self.optimizer}-b{self.batch_size}-s{self.seed}-{self.key[:10]}"


# --- flags -> Study ---------------------------------------------------------------------
def define_flags(flag_values=flags.FLAGS):
    """The study's flags: its own settings and the training tool's shared ones."""
    settings.define_flags(StudySettings, flag_values)
    settings.define_flags(train.Config, flag_values, exclude=PER_CELL, defaults=STUDY_DEFAULTS)


def make_study(own, shared):
    """The Study of `own` (StudySettings) and `shared`: values of the
    training tool's settings but PER_CELL (STUDY_DEFAULTS where absent;
    image size 0 on digits: DIGITS_IMAGE_SIZE)."""
    per_cell = sorted(set(shared) & set(PER_CELL))
    if per_cell:
        raise ConfigError(f"--{per_cell[0]} is set per cell by the study.")
    shared = {**STUDY_DEFAULTS, **shared}
    if not shared.get("image_size") and shared.get("dataset", train.Config.dataset) == "digits":
        shared["image_size"] = DIGITS_IMAGE_SIZE

    def pairs(entries, defaults, parse):
        found = dict(defaults)
        found.update(
            (name, parse(value)) for name, _, value in (entry.partition("=") for entry in entries)
        )
        return found

    bases = pairs(own.base_learning_rates, DEFAULT_RATES, float)
    rules = pairs(own.lr_scaling, DEFAULT_SCALING, str)
    batches = tuple(FULL if b == FULL else int(b) for b in own.batch_sizes)
    base = train.Config(**shared)  # checks the shared settings (names the flag)
    if base.strategy == "multi_worker" or base.num_processes != 1:
        culprit = (
            "--strategy=multi_worker"
            if base.strategy == "multi_worker"
            else f"--num_processes={base.num_processes}"
        )
        raise ConfigError(
            f"{culprit}: the study trains its cells one after another in one process; "
            "give it the devices of one machine (--strategy=mirrored or --distribution)."
        )
    return Study(
        base,
        own.optimizers,
        batches,
        own.seeds,
        {name: (bases[name], rules[name]) for name in own.optimizers},
        own.study_dir,
    )


def study_from_flags(flag_values=flags.FLAGS):
    own, _ = settings.from_flags(StudySettings, flag_values)
    shared, _ = settings.from_flags(train.Config, flag_values, exclude=PER_CELL)
    return make_study(StudySettings(**own), shared)


# --- the cells ---------------------------------------------------------------------------
def cell_key(config):
    """A hash of the settings of `config` that decide its numbers (all but
    the resumable ones: where and how it runs, logs and checkpoints) and
    PROTOCOL."""
    fields = {
        f.name: getattr(config, f.name)
        for f in settings.fields(config)
        if not f.metadata["resumable"]
    }
    fields["study_protocol"] = PROTOCOL
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cell_config(study, optimizer, batch_size, seed):
    """The training Config of one cell (its model dir: the study dir)."""
    base, rule = study.rates[optimizer]
    return dataclasses.replace(
        study.shared,
        optimizer=optimizer,
        global_batch_size=batch_size,
        seed=seed,
        base_learning_rate=base,
        lr_scaling=rule,
        model_dir=study.study_dir,
        stop_on_divergence=False,
    )


def resolve_batch_sizes(study, num_train):
    """The study's batch sizes as sorted integers (FULL -> num_train)."""
    listed = ",".join(str(b) for b in study.batch_sizes)
    sizes = [num_train if b == FULL else b for b in study.batch_sizes]
    for size in sizes:
        if size > num_train:
            raise ConfigError(
                f"--batch_sizes={listed}: {size} exceeds the {num_train} "
                "training examples (an epoch would have no step)."
            )
    if len(set(sizes)) < len(sizes):
        raise ConfigError(
            f"--batch_sizes={listed}: a batch size is listed twice ({FULL} is {num_train} here)."
        )
    return sorted(sizes)


def make_cells(study, num_train):
    """Every cell, seed by seed (an interrupted study has whole seeds first);
    each cell's plan is checked before anything is trained."""
    cells = []
    for seed in range(study.seeds):
        for optimizer in study.optimizers:
            for batch in resolve_batch_sizes(study, num_train):
                config = cell_config(study, optimizer, batch, seed)
                key = cell_key(config)
                cell = Cell(optimizer, batch, seed, config, train.make_plan(config, num_train), key)
                config = dataclasses.replace(
                    config, model_dir=os.path.join(study.study_dir, "cells", cell.name)
                )
                cells.append(dataclasses.replace(cell, config=config))
    return cells


# --- the store of finished cells -------------------------------------------------------
def load_store(path):
    """{key: record} of the finished cells in the JSON-lines file `path`; a
    torn last line (a kill while appending) is ignored."""
    records = {}
    if not os.path.exists(path):
        return records
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            records[record["key"]] = record
    return records


def append_record(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _sublayers(layer):
    for sub in getattr(layer, "layers", ()):
        yield sub
        yield from _sublayers(sub)


def recalibrate_batch_norm(model, batches):
    """Re-estimates the moving statistics of every batch-norm layer of `model`
    from `batches` (images), as precise BN does (Wu & Johnson 2021): with the
    per-batch means m_k and (biased) variances v_k of each layer's input over
    the K batches,

        moving_mean = (1/K) sum_k m_k,    moving_variance = (1/K) sum_k v_k,

    accumulated by a training-mode forward pass of batch k with momentum
    k / (k + 1). Returns the number of layers recalibrated."""
    layers = [
        layer for layer in _sublayers(model) if isinstance(layer, keras.layers.BatchNormalization)
    ]
    momentum = [layer.momentum for layer in layers]
    try:
        for k, images in enumerate(batches if layers else ()):
            for layer in layers:
                layer.momentum = k / (k + 1)
            model(images, training=True)
    finally:
        for layer, value in zip(layers, momentum):
            layer.momentum = value
    return len(layers)


def precise_bn_evaluation(config, data):
    """(test accuracy, test loss) of the run's last checkpoint after
    `recalibrate_batch_norm` on training batches (RECALIBRATION_BATCH images,
    at most RECALIBRATION_EXAMPLES in all). After only a few steps the moving
    averages (momentum 0.9) still hold much of their initial values (0.9^10
    = 35% after 10 steps), which the tool's test accuracy measures along with
    the weights."""
    # Restored, never stepped: any schedule will do (a float rate would add a
    # variable that the checkpoint's optimizer lacks).
    stand_in = keras_lars.WarmupPolyDecay(config.peak_learning_rate, 0, 1)
    model = train.compiled_model(config, data.info.num_classes, stand_in)
    checkpoints.restore(model, os.path.join(config.model_dir, "checkpoints"))
    batch = min(RECALIBRATION_BATCH, data.info.num_train)
    steps = max(1, min(data.info.num_train, RECALIBRATION_EXAMPLES) // batch)
    recalibrate_batch_norm(model, (images for images, _ in data.train(0, batch).take(steps)))
    results = model.evaluate(
        data.eval(batch), steps=data.eval_steps(batch), verbose=0, return_dict=True
    )
    return results["accuracy"], results["loss"]


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
    if row["steps"] != cell.plan.total_steps:
        print(
            f"warning: {cell.name} ran {row['steps']} optimizer steps, "
            f"{cell.plan.total_steps} planned.",
            file=sys.stderr,
        )
    return {
        "key": cell.key,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "config": dataclasses.asdict(cell.config),
        "row": row,
        "history": summary["history"],
    }


# --- tables and plot ---------------------------------------------------------------------
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


def write_outputs(study, cells, records, num_train):
    """Tables and plot of the cells of `study` found in `records`."""
    rows = [records[c.key]["row"] for c in cells if c.key in records]
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
            "cells_done": len(rows),
            "cells_total": len(cells),
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


# --- the study ----------------------------------------------------------------------------
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
            f"{cell.plan.total_steps} steps ...",
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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    train.use_backend(flags.FLAGS.backend, "keras_lars.tools.batch_study")
    # Every cell builds a new model, which TensorFlow reports as "retracing".
    tf.get_logger().setLevel("ERROR")
    try:
        run_study(study_from_flags())
    except train.Preempted as error:
        print(f"preempted: {error}", file=sys.stderr, flush=True)
        sys.exit(train.EXIT_PREEMPTED)
    except (ConfigError, input_pipeline.DataError, storage.StorageError) as error:
        sys.exit(f"error: {error}")


def run(argv=None):
    """The keras-lars-study entry point."""
    define_flags()
    app.run(main, argv)


if __name__ == "__main__":
    run()
