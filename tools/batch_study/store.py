"""The store of finished cells: one JSON line per cell in cells.jsonl,
appended (and synced) as each finishes."""

import json
import os


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
    """Appends `record` as one JSON line to `path` and syncs it to disk."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
