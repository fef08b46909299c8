"""The model directory: config.json, checkpoint names, summary.json, the lock.

<model_dir>/config.json      the run's settings and data (with the first checkpoint)
<model_dir>/checkpoints/     ckpt-* (tools/checkpoints.py); each state holds the
                             run's record too ("settings", "layout")
<model_dir>/logs/            TensorBoard
<model_dir>/summary.json     the final metrics, history and config
<model_dir>/run.lock         held by the chief while it trains (storage.exclusive)

The names that other programs read are declared in tools/model_dir_names.py.
"""

import dataclasses
import os
import sys

import keras

from keras_lars.distribute import is_chief
from keras_lars.tools import checkpoints
from keras_lars.tools import settings
from keras_lars.tools import storage
from keras_lars.tools.files import gfile
from keras_lars.tools.model_dir_names import CHECKPOINTS
from keras_lars.tools.model_dir_names import CONFIG_FILE
from keras_lars.tools.model_dir_names import LAYOUT
from keras_lars.tools.model_dir_names import SETTINGS
from keras_lars.tools.model_dir_names import SUMMARY_FILE
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import target

# The data sets whose global batches are the same however they are split:
# digits' worker i of n takes every n-th example of one permutation
# (input_pipeline.arrays_train); imagenet shards its files per worker.
SPLIT_FREE_DATA = ("digits",)


def checkpoint_dir(model_dir):
    return os.path.join(model_dir, CHECKPOINTS)


def last_checkpoint(model_dir):
    """(stem, where) of the last checkpoint in `model_dir`, e.g. (".../ckpt-0002",
    "epoch 2, step 5 of the next"); None when there is none."""
    directory = checkpoint_dir(model_dir)
    found = checkpoints.saved(directory)
    if not found:
        return None
    epoch, step = found[-1]
    where = f"epoch {epoch}" + (f", step {step} of the next" if step else "")
    return checkpoints.stem(directory, epoch, step), where


def prepare(config, info, strategy=None):
    """Checks that the model dir can hold this run before anything is
    trained; returns the record of the run (its settings and the data set's
    identity) that is written as config.json with the first checkpoint and
    into every checkpoint's state (`SETTINGS`).

    The chief checks that the directory and checkpoints/ are writable and
    removes temporary files a killed write left there. A run already there
    must have the same settings (but the resumable ones) and data, so that
    resuming never mixes two runs: checked against config.json and against
    the record of the latest checkpoint, which holds when config.json is
    gone (config.json is then written again with the next checkpoint)."""
    record = dataclasses.asdict(config)
    record["data"] = {
        "num_classes": info.num_classes,
        "num_train": info.num_train,
        "num_eval": info.num_eval,
    }
    if is_chief(strategy):
        for directory in (config.model_dir, checkpoint_dir(config.model_dir)):
            storage.check_writable(directory)
            storage.remove_partials(directory)
    path = os.path.join(config.model_dir, CONFIG_FILE)
    has_config = gfile.exists(path)
    if has_config:
        _refuse_other_settings(config, record, _stored_config(config, path))
    latest = checkpoints.latest_state(checkpoint_dir(config.model_dir))
    if latest is not None:
        name, state = latest
        if isinstance(state.get(SETTINGS), dict):
            _refuse_other_settings(config, record, state[SETTINGS])
        else:
            checked = "checked against config.json only" if has_config else "unchecked"
            print(
                f"warning: {name}.json holds no record of its run's settings (written by an "
                f"earlier version); resuming it with the settings {checked}",
                file=sys.stderr,
                flush=True,
            )
    return record


def _refuse_other_settings(config, record, stored):
    """ConfigError naming the settings (not resumable) and data that differ
    between `record` (this run) and `stored` (config.json or a checkpoint's)."""
    resumable = {f.name for f in settings.fields(config) if f.metadata["resumable"]}
    changed = [k for k, v in record.items() if k not in resumable and stored.get(k, v) != v]
    if changed:
        details = ", ".join(
            f"data: {stored[k]} there, {record[k]} now"
            if k == "data"
            else f"--{k}: {stored[k]!r} there, {record[k]!r} now"
            for k in changed
        )
        raise ConfigError(
            f"--model_dir={config.model_dir} holds a run with other settings "
            f"({details}); resume it with its flags or use another --model_dir."
        )


def _stored_config(config, path):
    """The settings in `path` (config.json); ConfigError naming the file if
    it is not a JSON object."""
    try:
        stored = storage.read_json(path)
    except ValueError as error:  # json.JSONDecodeError, UnicodeDecodeError
        problem = f"is not valid JSON ({storage.first_line(error)})"
    else:
        if isinstance(stored, dict):
            return stored
        problem = f"holds a JSON {type(stored).__name__}, not the run's settings"
    raise ConfigError(
        f"--model_dir={config.model_dir}: {path} {problem}; restore it, or remove it to "
        "resume without checking the settings, or use another --model_dir."
    )


def layout(strategy):
    """{"workers", "replicas"}: how this run splits each global batch, into
    one input pipeline per worker (TF_CONFIG's tasks, or JAX's processes)
    and `num_replicas_in_sync` replica batches. Saved in every checkpoint."""
    workers = getattr(strategy, "processes", None)  # runtime_jax.Devices
    if workers is None:
        # A multi-worker or TPU strategy has a cluster resolver; others None.
        resolver = getattr(strategy, "cluster_resolver", None)
        spec = resolver.cluster_spec().as_dict() if resolver else {}
        workers = sum(len(spec.get(job, ())) for job in ("chief", "worker")) or 1
    return {"workers": workers, "replicas": strategy.num_replicas_in_sync}


def check_layout(config, model, state, now, name):
    """Resuming the checkpoint `name` (state `state`) on another layout than
    the one that wrote it (`state[LAYOUT]`; none in earlier versions' states)
    is exact only where a step does not depend on how the global batch is
    split: the same global batches for every split, and nothing computed per
    replica. Then a line says so; else ConfigError naming both layouts and
    why."""
    then = state.get(LAYOUT)
    if then is None or then == now:
        return
    reasons = _split_dependence(config, model)
    written = f"the checkpoint {name} was written by {_describe(then, config)}"
    here = f"this run has {_describe(now, config)}"
    if reasons:
        raise ConfigError(
            f"--model_dir={config.model_dir}: {written}; {here}: {'; '.join(reasons)}, so "
            f"it would not resume the same run; resume it on {_describe(then, config)}, "
            "or use another --model_dir."
        )
    print(
        f"{written}; {here}: resuming it (the same global batches, "
        "nothing computed per replica; only the rounding differs)",
        flush=True,
    )


def _split_dependence(config, model):
    """Why a step of this run depends on how its global batch is split."""
    if config.backend == "jax":
        return ["resuming on another layout is verified on --backend=tensorflow only"]
    reasons = []
    if config.dataset not in SPLIT_FREE_DATA:
        reasons.append(f"--dataset={config.dataset} makes other global batches for another split")
    layers = list(_layers(model))
    if any(isinstance(x, keras.layers.BatchNormalization) and not x.synchronized for x in layers):
        reasons.append("batch-norm statistics are per replica (--nosync_batch_norm)")
    if any(isinstance(x, keras.layers.Dropout) and x.rate > 0 for x in layers):
        reasons.append(f"--model={config.model} draws its dropout masks per replica")
    if config.allreduce_dtype != "float32":
        reasons.append(
            f"--allreduce_dtype={config.allreduce_dtype} rounds the sum of several replicas only"
        )
    return reasons


def _layers(layer):
    for inner in getattr(layer, "layers", ()):
        yield inner
        yield from _layers(inner)


def _describe(layout, config):
    """E.g. "2 workers of 1 replica each", "1 process of 1 replica"."""
    workers, replicas = layout["workers"], layout["replicas"]
    each = replicas // workers
    of = f"{each} replica{'s' * (each != 1)}"
    if workers == 1:
        return f"1 process of {of}"
    who = "processes" if config.backend == "jax" else "workers"
    return f"{workers} {who} of {of} each"


def write_config_once(config, record, strategy):
    """Writes config.json unless it is there; True if this call wrote it."""
    path = os.path.join(config.model_dir, CONFIG_FILE)
    if not is_chief(strategy) or gfile.exists(path):
        return False
    storage.write_json(path, record)
    return True


def remove_config(config):
    gfile.remove(os.path.join(config.model_dir, CONFIG_FILE))


# A history record's keys that time its epoch (Checkpointing's), not its numbers:
# summary.json's "final" and the final line leave them out.
EPOCH_TIMINGS = ("seconds", "evaluation_seconds", "images_per_second")


def write_summary(config, length, state, wall_seconds, strategy, rates=()):
    """summary.json (on the chief) and the `final:` line; returns the summary.
    `state`: the run's (its history, evaluations and target: target.py).
    `rates`: the training images/s of the epochs this process measured
    (callbacks.Throughput); their median is the run's throughput, None when
    there is none (a resumed run's history holds earlier processes' rates).
    "layout" records how the run split its batch (`layout`), for the planner."""
    history = state["history"]
    final = dict(history[-1]) if history else {}
    summary = {
        "final": {k: v for k, v in final.items() if k not in EPOCH_TIMINGS},
        "epochs": length.epochs,
        "steps": length.total_steps,
        "steps_per_epoch": length.steps_per_epoch,
        "warmup_steps": length.warmup_steps,
        "train_images_per_second": round(sorted(rates)[len(rates) // 2], 2) if rates else None,
        "wall_seconds_this_process": round(wall_seconds, 2),
        "history": history,
        "evaluations": state.get("evaluations", []),
        "config": dataclasses.asdict(config),
        LAYOUT: layout(strategy),
    }
    reached = target.summary(config, length, state)
    if reached:
        summary["target"] = reached
    if length.phases:  # --batch_schedule; each epoch's batch and rate are in the history
        summary["phases"] = [dataclasses.asdict(phase) for phase in length.phases]
    if state.get("adaptive_batch"):  # --adaptive_batch's decisions (tools/train/adaptive.py)
        summary["adaptive_batch"] = state["adaptive_batch"]["decisions"]
    if is_chief(strategy):
        storage.write_json(os.path.join(config.model_dir, SUMMARY_FILE), summary)
    shown = " ".join(
        f"{k}={v:.4f}"
        for k, v in summary["final"].items()
        if k not in ("epoch", "steps", "learning_rate", "global_batch_size", "image_size")
    )
    throughput = summary["train_images_per_second"]
    print(
        f"final: model={config.model} optimizer={config.optimizer} "
        f"epochs={length.epochs} steps={length.total_steps} {shown} "
        f"images_per_second={'none' if throughput is None else throughput} "
        + (f"{target.describe(reached)} " if reached else "")
        + f"model_dir={config.model_dir}"
        + ("" if rates else " (no epoch of this process was timed)"),
        flush=True,
    )
    return summary
