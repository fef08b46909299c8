"""The store of finished cells: one JSON line per cell in cells.jsonl,
appended (and synced) as each finishes."""

import json
import os

from keras_lars.tools.storage import StorageError


def _problem(record, row_fields):
    """What makes `record` not a cell's record, or None."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a cell's record (an object)"
    if not isinstance(record.get("key"), str):
        return 'no cell key (a string "key")'
    if not isinstance(record.get("row"), dict):
        return 'no results (an object "row")'
    missing = [field for field in row_fields if field not in record["row"]]
    if missing:
        return f"its row lacks {', '.join(missing)}"
    return None


def load_store(path, row_fields=()):
    """{key: record} of the finished cells in the JSON-lines file `path`; a
    torn last line (a kill while appending) is ignored. A line that is JSON
    but not a cell's record (with `row_fields` in its row) is a StorageError
    naming the file and line."""
    records = {}
    if not os.path.exists(path):
        return records
    with open(path, "rb") as f:  # bytes: a torn multi-byte character is a torn line
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:  # UnicodeDecodeError too
                continue
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
