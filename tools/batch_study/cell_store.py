"""The store of finished cells: one JSON line per cell in cells.jsonl
(trials.jsonl), appended (and synced) as each finishes, to a regular file:
a symbolic link, a FIFO or a directory at its path, or a store that cannot
be written, is refused when it is loaded, before anything is trained."""

import json
import math
import numbers
import os
import stat

from keras_lars.tools.batch_study.results import ACCURACIES
from keras_lars.tools.storage import StorageError
from keras_lars.tools.storage import check_writable
from keras_lars.tools.storage import special_file

# finite numbers in [0, 1] (the steps-to-target mode's best_val_accuracy too)
FRACTIONS = (*ACCURACIES, "train_accuracy", "best_val_accuracy")
COUNTS = ("steps", "examples", "budget_steps", "budget_epochs")  # whole numbers >= 1


def _value_problem(name, value):
    """What makes `value` not a usable `name` of a finished cell, or None."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if name in FRACTIONS and not (number and math.isfinite(value) and 0 <= value <= 1):
        return f"its {name} is {value!r}, not an accuracy (a number in [0, 1])"
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if name in COUNTS and not (whole and value >= 1):
        return f"its {name} is {value!r}, not a whole number >= 1"
    return None


def _problem(record, row_fields):
    """What makes `record` not a cell's record, or None: the fields
    `row_fields` of its row are present, and those of them in FRACTIONS and
    COUNTS hold such values."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a cell's record (an object)"
    if not isinstance(record.get("key"), str):
        return 'no cell key (a string "key")'
    if not isinstance(record.get("row"), dict):
        return 'no results (an object "row")'
    missing = [field for field in row_fields if field not in record["row"]]
    if missing:
        return f"its row lacks {', '.join(missing)}"
    problems = (_value_problem(field, record["row"][field]) for field in row_fields)
    return next((problem for problem in problems if problem), None)


def _open(path, flags):
    """A descriptor of the store `path` opened with `flags`, never through a
    symbolic link nor blocking on a FIFO; StorageError naming `path` where it
    is not a regular file or cannot be opened."""
    try:
        kind = stat.S_IFMT(os.lstat(path).st_mode)
    except FileNotFoundError:
        kind = None
    except OSError as error:
        raise StorageError(f"cannot read {path}: {error.strerror}") from None
    if kind == stat.S_IFLNK:
        target = os.readlink(path)
        raise StorageError(
            f"{path} is a symbolic link (to {target}), not the study's store (a file); "
            "put the file itself there"
        )
    if kind not in (None, stat.S_IFREG):
        described = special_file(path) or "not a regular file"
        raise StorageError(f"{path} is {described}, not the study's store (a file)")
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as error:
        raise StorageError(f"cannot open {path}: {error.strerror}") from None


def load_store(path, row_fields=()):
    """{key: record} of the finished cells in the JSON-lines file `path`; a
    torn last line (a kill while appending) is ignored. A line that is JSON
    but not a cell's record (with `row_fields` in its row, its accuracies
    finite numbers in [0, 1] and its steps >= 1) is a StorageError naming the
    file and line: such a cell is not taken as done. So is a store that is
    not a regular file or cannot be appended to (`append_record`): refused
    here, before a cell is trained, not when its result is stored."""
    records = {}
    if not os.path.lexists(path):
        check_writable(os.path.dirname(path) or ".")
        return records
    os.close(_open(path, os.O_WRONLY | os.O_APPEND))  # writable; nothing written
    with os.fdopen(_open(path, os.O_RDONLY), "rb") as f:  # bytes: a torn character is a torn line
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:  # UnicodeDecodeError too
                continue
            except RecursionError:
                problem = "JSON nested too deeply to read, not a cell's record"
            else:
                problem = _problem(record, row_fields)
            if problem:
                raise StorageError(
                    f"{path}, line {number}: {problem}; repair or remove that line "
                    "(a removed cell is trained again)"
                )
            records[record["key"]] = record
    return records


def append_record(path, record):
    """Appends `record` as one JSON line to the store `path` (a regular file,
    created if absent) and syncs it to disk; after a torn last line (a kill
    while appending) it starts a new line. StorageError naming `path` if it
    cannot."""
    line = (json.dumps(record) + "\n").encode()
    descriptor = _open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(descriptor).st_size
        if size and os.pread(descriptor, 1, size - 1) != b"\n":
            line = b"\n" + line
        while line:
            line = line[os.write(descriptor, line) :]
        os.fsync(descriptor)
    except OSError as error:
        raise StorageError(f"cannot write {path}: {error.strerror}") from None
    finally:
        os.close(descriptor)
