"""The cells of a study: each (optimizer, global batch B, seed) as the
training tool's Config, its run length and its key.

A cell trains for the study's --train_epochs, so a larger batch takes fewer
steps: steps = epochs * floor(N / B) for N training examples (B = N for
"full": one step per epoch). Its peak rate is its optimizer's base rate per
256 examples scaled by its rule (`train.scaled_learning_rate`).
"""

import dataclasses
import hashlib
import json
import os

from keras_lars.tools import settings
from keras_lars.tools import train
from keras_lars.tools.batch_study.study import FULL
from keras_lars.tools.batch_study.study import CellSettings
from keras_lars.tools.settings import ConfigError

# Part of every cell's key: bump it when what a cell measures changes, so
# that stored cells measured the old way are not reused.
PROTOCOL = 3


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the study: its grid point, Config, run length and key."""

    optimizer: str
    batch_size: int
    seed: int
    config: train.Config
    length: train.RunLength
    key: str

    @property
    def name(self):
        return f"{self.optimizer}-b{self.batch_size}-s{self.seed}-{self.key[:10]}"


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
    """The training Config of one cell: the shared settings with the cell's
    `CellSettings` (its model dir: the study dir)."""
    base, rule = study.rates[optimizer]
    cell = CellSettings(optimizer, batch_size, base, rule, seed, model_dir=study.study_dir)
    return dataclasses.replace(study.shared, **dataclasses.asdict(cell))


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
    each cell's run length is checked before anything is trained."""
    cells = []
    for seed in range(study.seeds):
        for optimizer in study.optimizers:
            for batch in resolve_batch_sizes(study, num_train):
                config = cell_config(study, optimizer, batch, seed)
                key = cell_key(config)
                length = train.run_length(config, num_train)
                cell = Cell(optimizer, batch, seed, config, length, key)
                config = dataclasses.replace(
                    config, model_dir=os.path.join(study.study_dir, "cells", cell.name)
                )
                cells.append(dataclasses.replace(cell, config=config))
    return cells
