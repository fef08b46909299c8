"""From flag values to a Config: --recipe and, on JAX, the processes' environment
(JAX_ENVIRONMENT's variables; with --cluster=slurm, SLURM's: cluster.py).

A flag given on the command line always wins over the recipe and over the
environment; `recipe_line` says which settings --recipe set and which it left
to the flags given.

Nothing here imports Keras (the tool checks its flags with `config_from_flags`
before it loads; keras_lars.recipes is plain Python).
"""

import os

from keras_lars.recipes import resnet50_lars_recipe
from keras_lars.tools import settings
from keras_lars.tools.schedule_flags import first_phase_value
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import cluster
from keras_lars.tools.train.config import Config

# On JAX, the processes' settings not given as flags come from these variables.
JAX_ENVIRONMENT = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


def config_from_flags(values, given=(), log=None):
    """The Config of the flag values `values` (a dict of setting: value) with
    --recipe applied to the settings not in `given` (the names set on the
    command line) and, on JAX, the processes' settings not given taken from
    JAX_ENVIRONMENT. `log(line)`, if given, receives the recipe's line."""
    values = dict(values)
    value_of = lambda name: values.get(name, getattr(Config, name))  # noqa: E731
    if (value_of("backend") or settings.keras_backend()) == "jax":
        values.update(_from_environment(given))
        if value_of("cluster") == "slurm":  # the processes as JAX detects them under SLURM
            found = cluster.slurm_processes()
            values.update({name: value for name, value in found.items() if name not in given})
            if log:
                log("--cluster=slurm: " + " ".join(f"--{k}={value_of(k)}" for k in found))
    batch = first_phase_value(  # under --batch_schedule the recipe is the first phase's
        value_of("batch_schedule"),
        value_of("global_batch_size"),
        Config.__dataclass_fields__["global_batch_size"].default,
    )
    recipe = recipe_settings(value_of("recipe"), value_of("optimizer"), batch)
    if "base_learning_rate" in given:  # the user's rate is per 256 images: keep its scaling
        recipe.pop("lr_scaling", None)
    values.update({name: value for name, value in recipe.items() if name not in given})
    if recipe and log:
        log(recipe_line(value_of("recipe"), recipe, given))
    return Config(**values)


def _from_environment(given):
    found = {}
    for name, variable in JAX_ENVIRONMENT.items():
        if name in given or variable not in os.environ:
            continue
        text = os.environ[variable]
        try:
            found[name] = text if name == "coordinator_address" else int(text)
        except ValueError:
            raise ConfigError(f"{variable}={text!r} (for --{name}): not an integer") from None
    return found


def recipe_settings(recipe, optimizer, global_batch_size):
    """{setting: value} that --recipe sets for the batch ({} for none)."""
    if recipe != "mlperf" or optimizer != "lars":
        return {}
    table = resnet50_lars_recipe(max(global_batch_size, 1))
    return {
        "base_learning_rate": table.peak_learning_rate,
        "lr_scaling": "none",
        "warmup_epochs": table.warmup_epochs,
        "train_epochs": int(table.train_epochs),
        "momentum": table.momentum,
        "weight_decay": table.weight_decay,
        "label_smoothing": table.label_smoothing,
        "end_learning_rate": table.end_learning_rate,
    }


def recipe_line(recipe, settings_of_recipe, given):
    """One line: what --recipe set, and which of its settings the flags given kept."""
    set_here = [
        f"--{k}={v:g}" if isinstance(v, float) else f"--{k}={v}"
        for k, v in settings_of_recipe.items()
        if k not in given
    ]
    kept = [f"--{k}" for k in settings_of_recipe if k in given]
    line = f"--recipe={recipe} set {' '.join(set_here) or 'nothing'}"
    if kept:
        line += f"; given explicitly, kept: {' '.join(kept)}"
    return line
