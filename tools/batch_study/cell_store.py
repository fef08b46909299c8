"""The store of finished cells: one JSON line per cell in cells.jsonl,
appended (and synced) as each finishes."""

import json
import math
import numbers
import os

from keras_lars.tools.batch_study.results import ACCURACIES
from keras_lars.tools.storage import StorageError
from keras_lars.tools.storage import special_file

# finite numbers in [0, 1] (the steps-to-target mode's best_val_accuracy too)
FRACTIONS = (*ACCURACIES, "train_accuracy", "best_val_accuracy")
COUNTS = ("steps", "examples", "budget_steps")  # whole numbers >= 1


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


def load_store(path, row_fields=()):
    """{key: record} of the finished cells in the JSON-lines file `path`; a
    torn last line (a kill while appending) is ignored. A line that is JSON
    but not a cell's record (with `row_fields` in its row, its accuracies
    finite numbers in [0, 1] and its steps >= 1) is a StorageError naming the
    file and line: such a cell is not taken as done."""
    records = {}
    if not os.path.exists(path):
        return records
    special = special_file(path)
    if special:  # a FIFO would block
        raise StorageError(f"{path} is {special}, not the study's store (a file)")
    with open(path, "rb") as f:  # bytes: a torn multi-byte character is a torn line
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
    """Appends `record` as one JSON line to `path` and syncs it to disk."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
