"""The cells of a study: each (optimizer, global batch B, seed) as the
training tool's Config, its run length and its key.

A cell trains for the study's --train_epochs, so a larger batch takes fewer
steps: steps = epochs * floor(N / B) for N training examples (B = N for
"full": one step per epoch). Its peak rate is its optimizer's base rate per
256 examples scaled by its rule (`train.scaled_learning_rate`).

With --control_schedule, phases (E_k, B_k) k = 0..K, each of
--control_optimizers also gets three batch-control cells (KINDS), at the
same epochs:

    fixed   B_K throughout, as a grid cell (the same cell if B_K is in the grid)
    ramp    the phases; rate f(e) * r(B_k / B_0), r the optimizer's scaling
            rule (linear: Goyal et al. 2017; sqrt: You et al. 2020), peak
            rate that of B_0, so the last phase's equals the fixed cell's
    grow    the phases; the rate of B_0, held after warmup (end rate = peak):
            the batch grows instead of the rate decaying (Smith et al. 2018)

with f the warmup + decay curve in epochs done (keras_lars.EpochWarmupPolyDecay).
"""

import dataclasses
import hashlib
import json
import os

import keras_lars
from keras_lars.tools import settings
from keras_lars.tools import train
from keras_lars.tools.batch_study.study import FULL
from keras_lars.tools.batch_study.study import CellSettings
from keras_lars.tools.batch_study.study import batch_examples
from keras_lars.tools.settings import ConfigError

# Part of every cell's key: bump it when what a cell measures changes, so
# that stored cells measured the old way are not reused.
PROTOCOL = 3
GRID = "grid"
KINDS = (GRID, "fixed", "ramp", "grow")
# The tool's --batch_coupling for a ramp under each --lr_scaling rule.
RAMP_COUPLING = {"linear": "linear", "sqrt": "sqrt", "none": "grow"}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the study: its grid point, Config, run length and key."""

    optimizer: str
    batch_size: int  # the last phase's under a batch schedule
    seed: int
    config: train.Config
    length: train.RunLength
    key: str
    kind: str = GRID  # one of KINDS

    @property
    def name(self):
        kind = "" if self.kind == GRID else f"-{self.kind}"
        return f"{self.optimizer}{kind}-b{self.batch_size}-s{self.seed}-{self.key[:10]}"

    @property
    def label(self):
        """How progress lines name the cell."""
        schedule = self.config.batch_schedule
        batch = f"batch={schedule}" if schedule else f"batch={self.batch_size}"
        kind = "" if self.kind == GRID else f"{self.kind} "
        return f"{self.optimizer} {kind}{batch} seed={self.seed}"


def cell_key(config):
    """A hash of the settings of `config` that decide its numbers (all but
    the resumable ones: where and how it runs, logs and checkpoints; a
    setting at the tool's default is left out, so that a new setting does
    not change the keys of stored cells) and PROTOCOL."""
    fields = {
        f.name: getattr(config, f.name)
        for f in settings.fields(config)
        if not f.metadata["resumable"] and getattr(config, f.name) != f.default
    }
    fields["study_protocol"] = PROTOCOL
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cell_config(study, optimizer, batch_size, seed, kind=GRID):
    """The training Config of one cell of `kind`: the shared settings with
    the cell's `CellSettings` (its model dir: the study dir); a ramp or grow
    cell starts at --control_schedule's first batch (module docstring)."""
    base, rule = study.rates[optimizer]
    control = {}
    if kind in ("ramp", "grow"):
        phases = keras_lars.BatchSchedule.parse(study.control_schedule).phases
        batch_size = phases[0].global_batch_size
        coupling = RAMP_COUPLING[rule] if kind == "ramp" else "grow"
        control = {"batch_schedule": study.control_schedule, "batch_coupling": coupling}
    micro = 1 if control else study.micro_batches(batch_size)  # a ramp changes its batch
    cell = CellSettings(
        optimizer,
        batch_size,
        base,
        rule,
        seed,
        model_dir=study.study_dir,
        gradient_accumulation_steps=micro,
        **control,
    )
    config = dataclasses.replace(study.shared, **dataclasses.asdict(cell))
    if kind == "grow":
        config = dataclasses.replace(config, end_learning_rate=config.peak_learning_rate)
    return config


def resolve_batch_sizes(study, num_train):
    """The study's batch sizes as sorted integers (FULL -> num_train)."""
    listed = ",".join(str(b) for b in study.batch_sizes)
    sizes = [batch_examples(b, num_train) for b in study.batch_sizes]
    held = study.shared.validation_examples
    for size in sizes:
        if held and num_train < size <= num_train + held:
            raise ConfigError(
                f"--validation_examples={held} leaves {num_train} training examples, fewer "
                f"than the batch {size} of --batch_sizes={listed} (an epoch would have no step)."
            )
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


def _control_cells(study, num_train):
    """(optimizer, last batch, kind) of the batch-control cells."""
    if not study.control_schedule:
        return []
    phases = keras_lars.BatchSchedule.parse(study.control_schedule).phases
    last = phases[-1].global_batch_size
    if last > num_train:
        raise ConfigError(
            f"--control_schedule={study.control_schedule}: {last} exceeds the {num_train} "
            "training examples (an epoch would have no step)."
        )
    return [(o, last, kind) for o in study.control_optimizers for kind in KINDS[1:]]


def make_cells(study, num_train):
    """Every cell, seed by seed (an interrupted study has whole seeds first),
    the grid's, then the batch-control cells; each cell's run length is
    checked before anything is trained. A fixed cell equal to a grid cell
    has its key (and is trained once)."""
    cells = []
    for seed in range(study.seeds):
        grid = [
            (o, b, GRID) for o in study.optimizers for b in resolve_batch_sizes(study, num_train)
        ]
        for optimizer, batch, kind in grid + _control_cells(study, num_train):
            try:
                config = cell_config(study, optimizer, batch, seed, kind)
                length = train.run_length(config, num_train)
            except ConfigError as error:
                if kind == GRID:
                    raise
                # The tool names its --batch_schedule: the study's flag is --control_schedule.
                text = str(error).removeprefix(f"--batch_schedule={study.control_schedule}: ")
                raise ConfigError(f"--control_schedule={study.control_schedule}: {text}") from None
            cell = Cell(optimizer, batch, seed, config, length, cell_key(config), kind)
            config = dataclasses.replace(
                config, model_dir=os.path.join(study.study_dir, "cells", cell.name)
            )
            cells.append(dataclasses.replace(cell, config=config))
    return cells
