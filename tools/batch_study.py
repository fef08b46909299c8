"""Large-batch study: test accuracy against the global batch size, per optimizer,
at a fixed epoch budget.

    python -m tools.batch_study    # digits, ResNet-18 at 16x16, 48 cells, ~40 min on 2 cores

    # your own ImageNet-format TFRecords (tools/make_tfrecords.py)
    python -m tools.batch_study --dataset=imagenet --data_dir=data/photos \\
        --image_size=64 --batch_sizes=64,256,1024,full --train_epochs=30

Every cell (optimizer, global batch B, seed) is one run of the training tool
(`tools.train.train_and_evaluate`) for the same --train_epochs, so a larger
batch takes fewer steps: steps = epochs * floor(N / B) for N training
examples ("full" in --batch_sizes is B = N: one step per epoch). Every
optimizer follows `keras_lars.WarmupPolyDecay` (linear warmup over
--warmup_epochs, power-2 decay to --end_learning_rate) with the peak rate its
scaling rule gives from its base rate per 256 examples:

    linear:  peak = base * B / 256          (keras_lars.linear_scaling, Goyal et al. 2017)
    sqrt:    peak = base * sqrt(B / 256)    (the square-root rule of the LAMB paper)
    none:    peak = base

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

Every other setting is a flag of tools/train.py shared by all cells (--model,
--dataset, --data_dir, --image_size, --momentum, --weight_decay, ...); the
study's own defaults: --train_epochs=10, --warmup_epochs=2 and, on digits,
--image_size=16. The flags the study sets per cell (--optimizer,
--global_batch_size, --base_learning_rate, --seed, --model_dir, ...) are
refused.

Outputs in --study_dir (a local directory):

    cells.jsonl           the store: one JSON line per finished cell, appended
                          as it finishes (its full config, key, row, history)
    cells.csv, .json      one row per (optimizer, batch, seed) cell of this study
    aggregate.csv, .json  one row per (optimizer, batch): mean, std over seeds
    accuracy_vs_batch.png test accuracy against batch size (log axis), one line
                          per optimizer, error bars = std over seeds
    cells/<name>/         each cell's model dir (config, summary, logs, train.log)

Resuming: rerun the same command. A cell is identified by a hash of its whole
training config (every field of tools.train.Config but its model dir): cells
found in the store are not rerun, a cell whose config changed (another rate,
epoch count, model, ...) gets a new key and runs, and a cell killed midway
resumes from its last epoch checkpoint. Tables and plot are rewritten (under
a temporary name, then renamed) after every cell.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import contextlib  # noqa: E402
import csv  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from tools import train  # noqa: E402  (defines the shared flags; imports TensorFlow)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_lars  # noqa: E402
from tools import checkpoints  # noqa: E402
from tools import input_pipeline  # noqa: E402

DEFAULT_RATES = {"sgd": 0.1, "nesterov": 0.1, "lars": 2.5, "lamb": 0.01}
DEFAULT_SCALING = {"sgd": "linear", "nesterov": "linear", "lars": "linear", "lamb": "sqrt"}
SCALING_RULES = ("linear", "sqrt", "none")
REFERENCE_BATCH = 256
STUDY_DEFAULTS = {"train_epochs": 10, "warmup_epochs": 2.0}
DIGITS_IMAGE_SIZE = 16
FULL = "full"
# Part of every cell's key: bump it when what a cell measures changes, so
# that stored cells measured the old way are not reused.
PROTOCOL = 2
RECALIBRATION_BATCH = 256
RECALIBRATION_EXAMPLES = 8192
# Flags of tools/train.py that the study sets per cell, with what to use instead.
PER_CELL_FLAGS = {
    "optimizer": "--optimizers",
    "global_batch_size": "--batch_sizes",
    "base_learning_rate": "--base_learning_rates",
    "seed": "--seeds",
    "model_dir": "--study_dir",
    "recipe": "--base_learning_rates and --lr_scaling",
    "train_steps": "--train_epochs (the budget is in epochs)",
    "eval": "nothing (every cell is evaluated)",
    "trust_ratio_log_every": "tools.train for a single run",
}

flags.DEFINE_list("optimizers", list(DEFAULT_RATES), f"Any of {', '.join(train.OPTIMIZERS)}.")
flags.DEFINE_list(
    "batch_sizes", ["32", "128", "512", FULL],
    "Global batch sizes; 'full' is the whole training set (one step per epoch).",
)
flags.DEFINE_integer("seeds", 3, "Seeds per (optimizer, batch): 0, 1, ..., seeds - 1.")
flags.DEFINE_list(
    "base_learning_rates", [f"{k}={v}" for k, v in DEFAULT_RATES.items()],
    "optimizer=rate pairs: peak rate per 256 examples, scaled by --lr_scaling; "
    "optimizers not listed keep their default.",
)
flags.DEFINE_list(
    "lr_scaling", [f"{k}={v}" for k, v in DEFAULT_SCALING.items()],
    "optimizer=rule pairs, rule one of linear (base * B / 256), sqrt "
    "(base * sqrt(B / 256)), none (base); optimizers not listed keep their default.",
)
flags.DEFINE_string("study_dir", "runs/batch_study", "Store, tables, plot and cell model dirs.")
flags.adopt_module_key_flags(train)

ConfigError = train.ConfigError


@dataclasses.dataclass(frozen=True)
class Study:
    """A sweep: the shared tools.train flag values and the grid."""

    shared: dict  # tools.train flag values (per-cell ones are overwritten)
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
def _pairs(flag, entries, defaults, parse):
    """{optimizer: parse(value)} from 'optimizer=value' entries over `defaults`."""
    found = dict(defaults)
    for entry in entries:
        name, sep, value = entry.partition("=")
        if not sep or name not in train.OPTIMIZERS:
            raise ConfigError(
                f"--{flag}={','.join(entries)}: expected optimizer=value pairs with "
                f"optimizer one of {', '.join(train.OPTIMIZERS)}; got {entry!r}.")
        found[name] = parse(value, entry)
    return found


def study_from_flags(values, given=()):
    """The Study of the flag values `values` (a dict: the study's flags and
    tools/train.py's); `given`: names of the flags set on the command line."""
    for name, instead in PER_CELL_FLAGS.items():
        if name in given:
            raise ConfigError(f"--{name} is set per cell by the study; use {instead}.")

    optimizers = tuple(values["optimizers"])
    if not optimizers:
        raise ConfigError("--optimizers: name at least one optimizer.")
    for name in optimizers:
        if name not in train.OPTIMIZERS:
            raise ConfigError(f"--optimizers={','.join(optimizers)}: unknown optimizer "
                              f"{name!r}; expected any of {', '.join(train.OPTIMIZERS)}.")
    if len(set(optimizers)) < len(optimizers):
        raise ConfigError(f"--optimizers={','.join(optimizers)}: an optimizer is listed twice.")

    batches = []
    for entry in values["batch_sizes"]:
        if entry == FULL:
            batches.append(FULL)
            continue
        try:
            batch = int(entry)
        except ValueError:
            batch = 0
        if batch < 1:
            raise ConfigError(f"--batch_sizes={','.join(values['batch_sizes'])}: {entry!r} is "
                              f"neither a positive integer nor {FULL!r}.")
        batches.append(batch)
    if not batches:
        raise ConfigError("--batch_sizes: name at least one batch size.")
    if values["seeds"] < 1:
        raise ConfigError(f"--seeds={values['seeds']}: must be >= 1.")

    def rate(value, entry):
        try:
            rate = float(value)
        except ValueError:
            rate = float("nan")
        if not rate > 0 or math.isinf(rate):
            raise ConfigError(f"--base_learning_rates: {entry!r}: the rate must be a number > 0.")
        return rate

    def rule(value, entry):
        if value not in SCALING_RULES:
            raise ConfigError(f"--lr_scaling: {entry!r}: the rule must be one of "
                              f"{', '.join(SCALING_RULES)}.")
        return value

    bases = _pairs("base_learning_rates", values["base_learning_rates"], DEFAULT_RATES, rate)
    rules = _pairs("lr_scaling", values["lr_scaling"], DEFAULT_SCALING, rule)
    if not values["study_dir"]:
        raise ConfigError("--study_dir: must be a directory path.")

    shared = dict(values)
    for name, value in STUDY_DEFAULTS.items():
        if name not in given:
            shared[name] = value
    if "image_size" not in given and shared["dataset"] == "digits":
        shared["image_size"] = DIGITS_IMAGE_SIZE
    shared.update(recipe="none", train_steps=0, eval=True, trust_ratio_log_every=0,
                  base_learning_rate=1.0)
    study = Study(shared, optimizers, tuple(batches), values["seeds"],
                  {name: (bases[name], rules[name]) for name in optimizers},
                  values["study_dir"])
    cell_config(study, optimizers[0], 1, 0)  # checks the shared flags (names the flag)
    return study


# --- the cells ---------------------------------------------------------------------------
def peak_learning_rate(base, rule, batch_size):
    """The peak rate of `rule` (see the module docstring) for `batch_size`."""
    if rule == "linear":
        return keras_lars.linear_scaling(base, batch_size, REFERENCE_BATCH)
    if rule == "sqrt":
        return base * math.sqrt(batch_size / REFERENCE_BATCH)
    if rule == "none":
        return base
    raise ValueError(f"`rule` must be one of {SCALING_RULES}; got {rule!r}.")


def cell_key(config):
    """A hash of every field of `config` but its model dir, and PROTOCOL."""
    fields = dataclasses.asdict(config)
    fields.pop("model_dir")
    fields["study_protocol"] = PROTOCOL
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cell_config(study, optimizer, batch_size, seed):
    """The tools.train Config of one cell (model dir still unset)."""
    base, rule = study.rates[optimizer]
    values = dict(study.shared, optimizer=optimizer, global_batch_size=batch_size, seed=seed,
                  model_dir=study.study_dir)
    config = train.config_from_flags(values)
    return dataclasses.replace(config, peak_learning_rate=peak_learning_rate(base, rule,
                                                                             batch_size))


def resolve_batch_sizes(study, num_train):
    """The study's batch sizes as sorted integers (FULL -> num_train)."""
    listed = ",".join(str(b) for b in study.batch_sizes)
    sizes = [num_train if b == FULL else b for b in study.batch_sizes]
    for size in sizes:
        if size > num_train:
            raise ConfigError(f"--batch_sizes={listed}: {size} exceeds the {num_train} "
                              "training examples (an epoch would have no step).")
    if len(set(sizes)) < len(sizes):
        raise ConfigError(f"--batch_sizes={listed}: a batch size is listed twice "
                          f"({FULL} is {num_train} here).")
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
                cell = Cell(optimizer, batch, seed, config, train.make_plan(config, num_train),
                            key)
                config = dataclasses.replace(
                    config, model_dir=os.path.join(study.study_dir, "cells", cell.name))
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
    layers = [layer for layer in _sublayers(model)
              if isinstance(layer, keras.layers.BatchNormalization)]
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
    results = model.evaluate(data.eval(batch), steps=data.eval_steps(batch), verbose=0,
                             return_dict=True)
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
        print(f"warning: {cell.name} ran {row['steps']} optimizer steps, "
              f"{cell.plan.total_steps} planned.", file=sys.stderr)
    return {"key": cell.key, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "config": dataclasses.asdict(cell.config), "row": row,
            "history": summary["history"]}


# --- tables and plot ---------------------------------------------------------------------
ROW_FIELDS = ("optimizer", "batch_size", "seed", "test_accuracy", "test_loss",
              "test_accuracy_precise_bn", "test_loss_precise_bn", "train_accuracy",
              "train_loss", "steps", "epochs", "steps_per_epoch", "warmup_steps",
              "peak_learning_rate", "full_batch", "wall_seconds", "key")
ACCURACIES = ("test_accuracy", "test_accuracy_precise_bn")
AGGREGATE_FIELDS = ("optimizer", "batch_size", "seeds",
                    *(f"{m}_{s}" for m in ACCURACIES for s in ("mean", "std", "min", "max")),
                    "train_accuracy_mean", "test_loss_mean", "test_loss_precise_bn_mean",
                    "steps", "peak_learning_rate", "full_batch", "wall_seconds_mean")


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
            entry.update({
                f"{metric}_mean": float(values.mean()),
                f"{metric}_std": float(values.std(ddof=1)) if len(group) > 1 else 0.0,
                f"{metric}_min": float(values.min()),
                f"{metric}_max": float(values.max()),
            })
        for metric in ("train_accuracy", "test_loss", "test_loss_precise_bn", "wall_seconds"):
            entry[f"{metric}_mean"] = float(np.mean([r[metric] for r in group]))
        entry.update(steps=group[0]["steps"], peak_learning_rate=group[0]["peak_learning_rate"],
                     full_batch=group[0]["full_batch"])
        found.append(entry)
    return found


def _finite(value):
    """JSON has no nan / inf: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _replace(path, write, mode="w"):
    """Writes `path` through write(file) under a temporary name, then renames."""
    partial = path + ".partial"
    with open(partial, mode) as f:
        write(f)
    os.replace(partial, path)


def write_table(stem, fields, rows, header):
    """stem.csv and stem.json (`header` plus the rows)."""

    def write_csv(f):
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: row[k] for k in fields} for row in rows)

    def write_json(f):
        clean = [{k: _finite(row[k]) for k in fields} for row in rows]
        json.dump(dict(header, rows=clean), f, indent=1, allow_nan=False)

    _replace(stem + ".csv", write_csv)
    _replace(stem + ".json", write_json)


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
    subtitles = ("test accuracy (batch-norm moving averages)",
                 "test accuracy, batch-norm statistics re-estimated (precise BN)")
    for axes, metric, subtitle in zip(panels, ACCURACIES, subtitles):
        for i, optimizer in enumerate(optimizers):
            rows = sorted((r for r in aggregated if r["optimizer"] == optimizer),
                          key=lambda r: r["batch_size"])
            # A small horizontal offset per optimizer keeps the error bars apart.
            shift = 2 ** (0.05 * (i - (len(optimizers) - 1) / 2))
            axes.errorbar([r["batch_size"] * shift for r in rows],
                          [r[f"{metric}_mean"] for r in rows],
                          yerr=[r[f"{metric}_std"] for r in rows],
                          marker="o", capsize=3, label=optimizer)
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
    _replace(path, lambda f: figure.savefig(f, format="png"), mode="wb")


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
    write_table(os.path.join(study.study_dir, "aggregate"), AGGREGATE_FIELDS, aggregated,
                header)
    title = (f"{any_config.model} on {any_config.dataset} ({num_train} training images, "
             f"{any_config.image_size}x{any_config.image_size}), {any_config.train_epochs} "
             f"epochs, {study.seeds} seed(s); mean ± std over seeds")
    plot(aggregated, os.path.join(study.study_dir, "accuracy_vs_batch.png"), title, num_train)


# --- the study ----------------------------------------------------------------------------
def run(study):
    """Runs the cells of `study` that the store lacks; returns (rows of the
    study's cells, keys of the cells trained by this call)."""
    config = cell_config(study, study.optimizers[0], 1, 0)
    data = input_pipeline.load(
        config.dataset, config.data_dir, config.image_size, config.num_classes,
        config.label_offset, config.seed, config.train_examples, config.eval_examples)
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
        print(f"{where}: peak rate {cell.config.peak_learning_rate:.4g}, "
              f"{cell.plan.total_steps} steps ...", flush=True)
        record = run_cell(cell, data)
        append_record(store_path, record)
        records[cell.key] = record
        trained.append(cell.key)
        row = record["row"]
        print(f"{where}: test_accuracy={row['test_accuracy']:.4f} "
              f"(precise BN {row['test_accuracy_precise_bn']:.4f}) "
              f"train_accuracy={row['train_accuracy']:.4f} steps={row['steps']} "
              f"({row['wall_seconds']:.0f} s)", flush=True)
        write_outputs(study, cells, records, num_train)
    write_outputs(study, cells, records, num_train)
    print(f"study: {len(trained)} cell(s) trained, {len(cells) - len(trained)} found done; "
          f"tables and plot in {study.study_dir}", flush=True)
    return [records[c.key]["row"] for c in cells], trained


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    values, given = train.parsed_flags()
    try:
        run(study_from_flags(values, given))
    except (ConfigError, input_pipeline.DataError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    # Every cell builds a new model, which TensorFlow reports as "retracing".
    train.tf.get_logger().setLevel("ERROR")
    app.run(main)
