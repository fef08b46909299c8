"""The model directory: config.json, checkpoint names, summary.json, the lock.

<model_dir>/config.json      the run's settings and data (with the first checkpoint)
<model_dir>/checkpoints/     ckpt-* (tools/checkpoints.py)
<model_dir>/logs/            TensorBoard
<model_dir>/summary.json     the final metrics, history and config
<model_dir>/run.lock         held by the chief while it trains (storage.exclusive)
"""

import dataclasses
import os

import tensorflow as tf

from keras_lars.distribute import is_chief
from keras_lars.tools import checkpoints
from keras_lars.tools import settings
from keras_lars.tools import storage
from keras_lars.tools.settings import ConfigError

CONFIG_FILE = "config.json"


def checkpoint_dir(model_dir):
    return os.path.join(model_dir, "checkpoints")


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
    identity) that is written as config.json with the first checkpoint.

    The chief checks that the directory and checkpoints/ are writable and
    removes temporary files a killed write left there. A run already there
    must have the same settings (but the resumable ones) and data, so that
    resuming never mixes two runs."""
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
    if not tf.io.gfile.exists(path):
        return record
    stored = _stored_config(config, path)
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
    return record


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


def write_config_once(config, record, strategy):
    """Writes config.json unless it is there; True if this call wrote it."""
    path = os.path.join(config.model_dir, CONFIG_FILE)
    if not is_chief(strategy) or tf.io.gfile.exists(path):
        return False
    storage.write_json(path, record)
    return True


def remove_config(config):
    tf.io.gfile.remove(os.path.join(config.model_dir, CONFIG_FILE))


def write_summary(config, length, history, wall_seconds, strategy=None, rates=()):
    """summary.json (on the chief) and the `final:` line; returns the summary.
    `rates`: the training images/s of the epochs this process measured
    (callbacks.Throughput); their median is the run's throughput, None when
    there is none (a resumed run's history holds earlier processes' rates)."""
    final = dict(history[-1]) if history else {}
    summary = {
        "final": {k: v for k, v in final.items() if k not in ("seconds", "images_per_second")},
        "epochs": length.epochs,
        "steps": length.total_steps,
        "steps_per_epoch": length.steps_per_epoch,
        "warmup_steps": length.warmup_steps,
        "train_images_per_second": round(sorted(rates)[len(rates) // 2], 2) if rates else None,
        "wall_seconds_this_process": round(wall_seconds, 2),
        "history": history,
        "config": dataclasses.asdict(config),
    }
    if is_chief(strategy):
        storage.write_json(os.path.join(config.model_dir, "summary.json"), summary)
    shown = " ".join(
        f"{k}={v:.4f}"
        for k, v in summary["final"].items()
        if k not in ("epoch", "steps", "learning_rate")
    )
    throughput = summary["train_images_per_second"]
    print(
        f"final: model={config.model} optimizer={config.optimizer} "
        f"epochs={length.epochs} steps={length.total_steps} {shown} "
        f"images_per_second={'none' if throughput is None else throughput} "
        f"model_dir={config.model_dir}"
        + ("" if rates else " (no epoch of this process was timed)"),
        flush=True,
    )
    return summary
