"""Checkpoints of the training tool: atomic, verified on load, the last two kept.

A checkpoint after epoch e is two files in the checkpoint directory:

    ckpt-000e.json          the run's state (epochs done, history so far)
    ckpt-000e.weights.h5    model and optimizer variables (`save_weights`)

and one taken s steps into the epoch after e (step checkpoints, preemption)
is ckpt-000e-0000ss.json / .weights.h5 (its state has "steps_done": s).
A position (e, s) orders checkpoints; (e, 0) is the end of epoch e.

Each file appears under its final name only once complete
(`storage.write_atomically`), the weights first: the state file commits the
checkpoint. A kill between the two leaves a weights file without its state,
an unfinished save, which a resume passes over (saying so) to the previous
checkpoint, and the next save at that position replaces. A kill at any
moment leaves the previous checkpoint intact. After a save, checkpoints
older than the previous one are removed, unfinished ones with them. Paths
go through `tf.io.gfile`, so the directory may be a bucket.

The state records what its weights file holds ("weights_file": the
optimizer's name, the number of variables, of optimizer variables, a
digest of every variable's path and shape, and "save": a random id of this
save, which the weights file holds too, as its attribute `SAVE_ID`). A
weights file that does not match that record (another run's file copied
beside it, of the same model and optimizer or not, or another checkpoint's)
makes the checkpoint unusable: the resume falls back to the checkpoint
before, saying so, and refuses in one line if none is left; nothing is
removed. A state of an earlier version records no id and is checked on the
rest. A weights file that does not fit the model being resumed (its
optimizer's name, number of variables or shapes; Keras itself only warns
and skips them) stops the resume: a run never trains on with fresh
optimizer state.
"""

import hashlib
import os
import re
import sys
import tempfile
import uuid

import h5py
import numpy as np

from keras_lars.distribute import save_on_chief
from keras_lars.tools import files
from keras_lars.tools import storage
from keras_lars.tools.files import gfile

_NAME = re.compile(r"^ckpt-(\d+)(?:-(\d+))?\.weights\.h5$")
_STATE_NAME = re.compile(r"^ckpt-(\d+)(?:-(\d+))?\.json$")
KEEP = 2
RECORD = "weights_file"  # the state's record of its weights file (`contents`)
SAVE_ID = "keras_lars_save"  # the weights file's attribute: the id its state records as "save"
_OPTIMIZER_VARIABLES = "optimizer/vars"
_UNIQUE_SUFFIX = re.compile(r"_[0-9]+$")  # where Keras's save_weights puts them, in order
SPACE_MARGIN = 1.25  # free space asked for, relative to the variables' bytes


class CheckpointError(Exception):
    """No usable checkpoint where there should be one; names the files."""


def stem(directory, epoch, step=0):
    """The checkpoint at (epoch, step): this path + .json and + .weights.h5."""
    name = f"ckpt-{epoch:04d}" + (f"-{step:06d}" if step else "")
    return os.path.join(directory, name)


def _paths(directory, epoch, step=0):
    return stem(directory, epoch, step) + ".json", stem(directory, epoch, step) + ".weights.h5"


def _files(directory):
    """(state positions, weights positions) in `directory`, from one listing."""
    names = gfile.listdir(directory) if gfile.isdir(directory) else []

    def found(pattern):
        matches = (pattern.match(name) for name in names)
        return {(int(m.group(1)), int(m.group(2) or 0)) for m in matches if m}

    return found(_STATE_NAME), found(_NAME)


def saved(directory):
    """Positions (epoch, step) of the complete checkpoints in `directory`
    (state and weights files), ascending."""
    states, weights = _files(directory)
    return sorted(states & weights)


def unfinished(directory):
    """Positions of weights files without their state (a save killed before
    its state was written), ascending."""
    states, weights = _files(directory)
    return sorted(weights - states)


def _positions(directory):
    """Positions of the state files, whose checkpoints were committed (and
    whose weights file may since be gone: `problem` says so), ascending."""
    return sorted(_files(directory)[0])


def epochs_saved(directory):
    """Epoch numbers of the epoch-end checkpoints in `directory`, ascending."""
    return [epoch for epoch, step in saved(directory) if step == 0]


def _contents(weights, finite=True):
    """(record, optimizer shapes, non-finite dataset or None) of an open
    weights file (h5py): the record {"optimizer": name, "variables": n,
    "optimizer_variables": m, "shapes": digest of every (path, shape),
    "save": its `SAVE_ID` attribute or None};
    the shapes of the optimizer's variables in their order (None: the file
    has none); with `finite`, the first dataset holding a non-finite value
    (which reads every array)."""
    shapes, bad = {}, []

    def visit(name, item):
        if isinstance(item, h5py.Dataset):
            shapes[name] = list(item.shape)
            floats = finite and not bad and item.dtype.kind == "f"
            if floats and not np.isfinite(item[()]).all():
                bad.append(name)

    weights.visititems(visit)
    save = weights.attrs.get(SAVE_ID)
    group = weights.get(_OPTIMIZER_VARIABLES)
    optimizer = None
    if isinstance(group, h5py.Group):
        names = sorted((n for n in group if n.isdigit()), key=int)
        optimizer = [tuple(group[n].shape) for n in names]
    name = group.attrs.get("name") if isinstance(group, h5py.Group) else None
    digest = hashlib.sha256(repr(sorted(shapes.items())).encode()).hexdigest()[:16]
    record = {
        "optimizer": name if isinstance(name, str) else None,
        "variables": len(shapes),
        "optimizer_variables": len(optimizer or ()),
        "shapes": digest,
        "save": save if isinstance(save, str) else None,
    }
    return record, optimizer, (bad[0] if bad else None)


def _read_contents(weights_path, finite=True):
    with gfile.GFile(weights_path, "rb") as f, h5py.File(f, "r") as weights:
        return _contents(weights, finite)


def _described(record):
    return (
        f"optimizer {record.get('optimizer')!r} with {record.get('optimizer_variables')} "
        f"variables, {record.get('variables')} in all"
    )


def _write_weights(model, path, save_id):
    """`model.save_weights(path)` with `save_id` as the file's `SAVE_ID`
    attribute; a remote path is written locally first (as Keras does)."""
    if "://" in path:
        with tempfile.TemporaryDirectory() as local:
            written = os.path.join(local, os.path.basename(path))
            _write_weights(model, written, save_id)
            gfile.copy(written, path, overwrite=True)
        return
    model.save_weights(path)
    with h5py.File(path, "r+") as weights:
        weights.attrs[SAVE_ID] = save_id


def save(model, directory, epoch, state, strategy=None, step=0):
    """Writes the checkpoint at (epoch, step); keeps it and the previous
    one. Only the chief's files are kept (`keras_lars.distribute.save_on_chief`)."""

    def write(directory):
        state_path, weights_path = _paths(directory, epoch, step)
        gfile.makedirs(directory)
        variables = list(model.variables) + list(model.optimizer.variables)
        size = sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables)
        storage.check_space(directory, int(SPACE_MARGIN * size) + 2**20)
        # The weights first: a checkpoint whose weights cannot be written
        # leaves no state file behind, and one whose state cannot, no weights.
        save_id = uuid.uuid4().hex
        storage.write_atomically(weights_path, lambda path: _write_weights(model, path, save_id))
        try:
            record = dict(state, **{RECORD: _read_contents(weights_path, finite=False)[0]})
            storage.write_json(state_path, record, indent=None)
        except storage.StorageError:
            gfile.remove(weights_path)
            raise
        states, weights = _files(directory)
        oldest_kept = (sorted(states & weights)[-KEEP:] or [(epoch, step)])[0]
        for old in sorted(states | weights):
            if old >= oldest_kept:
                break
            for path in _paths(directory, *old):
                if gfile.exists(path):
                    gfile.remove(path)

    save_on_chief(write, directory, strategy)


def problem(directory, epoch, step=0):
    """Why the checkpoint at (epoch, step) cannot be loaded, or None: its
    state must parse, its weights file must open with every array finite and
    be the one the state records (`RECORD`, with the save's id; older states
    have no id, or no record)."""
    state_path, weights_path = _paths(directory, epoch, step)
    for path in (state_path, weights_path):
        special = storage.special_file(path)
        if special:  # a FIFO would block
            return f"{path} is {special}, not a file"
    try:
        state = storage.read_json(state_path)
        if (state.get("epochs_done"), state.get("steps_done", 0)) != (epoch, step):
            return f"{state_path} is not the state of its position"
    except (ValueError, AttributeError, *files.ERRORS) as error:
        return f"{state_path}: {storage.first_line(error)}"
    if not gfile.exists(weights_path):
        return f"{weights_path} is missing"
    try:
        found, _, bad = _read_contents(weights_path)
    except (ValueError, *files.ERRORS) as error:
        return f"{weights_path}: {storage.first_line(error)}"
    if bad:
        return f"{weights_path}: non-finite values in {bad}"
    recorded = state.get(RECORD)
    if isinstance(recorded, dict) and "save" not in recorded:
        del found["save"]  # an earlier version's state records no id
    if recorded is not None and recorded != found:
        if isinstance(recorded, dict) and _described(recorded) == _described(found):
            if recorded.get("shapes") != found["shapes"]:
                difference = "the shapes of its variables are not those the state records"
            else:
                difference = (
                    "it was written by another save (another run's file, or another "
                    "checkpoint's), of the same model and optimizer"
                )
        else:
            shown = _described(recorded) if isinstance(recorded, dict) else repr(recorded)
            difference = f"it holds {_described(found)}, the state records {shown}"
        return f"{weights_path} is not the file its state records: {difference}"
    return None


def _misfit(optimizer, weights_path):
    """Why the weights file does not fit the built `optimizer` (its name, or
    the number or shapes of its variables), or None. Keras only warns
    ("Skipping variable loading for optimizer ...") and leaves the
    optimizer's variables as they were."""
    record, shapes, _ = _read_contents(weights_path, finite=False)
    expected = [tuple(v.shape) for v in optimizer.variables]
    # Keras numbers the names of later optimizers of a process ("lars_1").
    saved_name, name = (
        _UNIQUE_SUFFIX.sub("", n or "") for n in (record["optimizer"], optimizer.name)
    )
    held = f"optimizer {saved_name!r} with {len(shapes or ())} variables"
    wanted = f"this run's {name!r} has {len(expected)}"
    if saved_name != name or len(shapes or ()) != len(expected):
        return f"it holds {held}, {wanted}"
    for number, (saved, built) in enumerate(zip(shapes, expected)):
        if saved != built:
            return (
                f"its optimizer variable {number} ({optimizer.variables[number].path}) is "
                f"{saved}, this run's is {built}"
            )
    return None


def latest_state(directory):
    """(stem, state) of the latest checkpoint whose state file reads as a
    JSON object, whatever its weights; None when there is none. What a resume
    checks its settings against before anything is built."""
    for epoch, step in reversed(_positions(directory)):
        state_path, _ = _paths(directory, epoch, step)
        if storage.special_file(state_path):
            continue  # `problem` names it
        try:
            state = storage.read_json(state_path)
        except (ValueError, *files.ERRORS):
            continue
        if isinstance(state, dict):
            return stem(directory, epoch, step), state
    return None


def restore(model, directory):
    """Loads the latest usable checkpoint into `model` (whose optimizer is
    built here) and returns its state dict, or None if there is none. A
    checkpoint that fails `problem` is reported on stderr and the previous
    one is tried; CheckpointError if none is usable. Unfinished saves are
    passed over with a note."""
    for epoch, step in unfinished(directory):
        print(
            f"note: {stem(directory, epoch, step)}.weights.h5 has no state file (its save "
            "did not finish); passed over",
            file=sys.stderr,
            flush=True,
        )
    problems = []
    for epoch, step in reversed(_positions(directory)):
        found = problem(directory, epoch, step)
        if found:
            problems.append(found)
            print(
                f"warning: checkpoint {stem(directory, epoch, step)} is unusable ({found}); "
                "trying the one before",
                file=sys.stderr,
                flush=True,
            )
            continue
        state_path, weights_path = _paths(directory, epoch, step)
        model.optimizer.build(model.trainable_variables)
        misfit = _misfit(model.optimizer, weights_path)
        if misfit:
            raise CheckpointError(
                f"{weights_path} does not fit this model ({misfit}): was the run started "
                "with other data or settings?"
            )
        try:
            model.load_weights(weights_path)
        except ValueError as error:
            raise CheckpointError(
                f"{weights_path} does not fit this model ({storage.first_line(error)}): "
                "was the run started with other data or settings?"
            ) from None
        return storage.read_json(state_path)
    if problems:
        raise CheckpointError(
            f"no usable checkpoint in {directory} ({'; '.join(problems)}); move the "
            "directory aside to start the run over"
        )
    return None
