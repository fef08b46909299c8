"""Reading a JSON file someone else wrote (a study's fit.json, a run's
summary.json) as untrusted input, TensorFlow-free.

`read_json` opens the path without blocking (a FIFO does not wait for a
writer), accepts only a regular file of at most `max_bytes` (a device such as
/dev/zero never ends), parses it (an integer of more than MAX_DIGITS digits is
refused; NaN, Infinity and a float that overflows are read, as Python's json
writes them, and refused by the field that holds one) and refuses nesting
deeper than MAX_DEPTH. `integer`, `integers`, `number` and `text` read one
field and check its type (a bool is not a number), sign and finiteness.
Every problem is an `UntrustedFileError` whose message names the field or
says what the file is, without the flag: the caller puts the flag and the
file in front.
"""

import json
import math
import os
import stat

MAX_BYTES = 64 * 2**20
MAX_DEPTH = 64
MAX_DIGITS = 18  # an int64 has 19; no count or size the tools read needs more
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class UntrustedFileError(ValueError):
    """A file, or a field of it, that cannot be used; the message says why."""


def file_kind(mode):
    """What an `os.stat` mode is where it is not a regular file ("a
    directory", "a FIFO (named pipe)", ...), else None."""
    return next((kind for test, kind in _KINDS if test(mode)), None)


def read_bytes(path, max_bytes=MAX_BYTES):
    """The bytes of the regular file `path` (at most `max_bytes`)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise UntrustedFileError(f"cannot read it: {error.strerror or error}") from None
    with os.fdopen(descriptor, "rb") as f:
        mode = os.fstat(descriptor).st_mode
        kind = file_kind(mode) or (None if stat.S_ISREG(mode) else "not a regular file")
        if kind:
            raise UntrustedFileError(f"it is {kind}, not a file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UntrustedFileError(f"it holds more than {max_bytes / 2**20:g} MB: not read")
    return data


def _integer(text):
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise UntrustedFileError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _depth(document):
    """How deeply `document` nests (iterative: a deep one cannot overflow)."""
    deepest, pending = 0, [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                break
            items = value.values() if isinstance(value, dict) else value
            pending.extend((item, depth + 1) for item in items)
    return deepest


def parse(text):
    """The JSON document in `text`, numbers checked and depth capped."""
    try:
        document = json.loads(text, parse_int=_integer)
    except RecursionError:
        document = None
        depth = MAX_DEPTH + 1
    except UntrustedFileError as error:
        raise UntrustedFileError(f"it is not JSON the tools read: {error}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise UntrustedFileError(f"it is not JSON: {error}") from None
    else:
        depth = _depth(document)
    if depth > MAX_DEPTH:
        raise UntrustedFileError(f"it nests deeper than {MAX_DEPTH} levels: not read")
    return document


def read_json(path, max_bytes=MAX_BYTES):
    """The JSON document of the regular file `path` (the module docstring)."""
    data = read_bytes(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UntrustedFileError("it is not JSON: not UTF-8 text") from None
    return parse(text)


def read_json_lines(path, max_bytes=MAX_BYTES):
    """The documents of a JSON-lines file (blank lines skipped); a bad line
    is named by its number."""
    data = read_bytes(path, max_bytes)
    documents = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if line.strip():
            try:
                documents.append(parse(line))
            except UntrustedFileError as error:
                raise UntrustedFileError(f"line {number}: {error}") from None
    return documents


def _shown(value):
    return json.dumps(value)[:40] if isinstance(value, (bool, type(None), str)) else repr(value)


def number(document, key, positive=True, where=""):
    """document[key] as a finite float (`positive`: > 0, else >= 0); an
    UntrustedFileError naming `where` + key otherwise (a missing key too)."""
    name = f"{where}{key}"
    if not isinstance(document, dict) or document.get(key) is None:
        raise UntrustedFileError(f"{name}: missing")
    value = document[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UntrustedFileError(f"{name}: {_shown(value)} is not a number")
    if not math.isfinite(value):
        raise UntrustedFileError(f"{name}: {_shown(value)} is not a finite number")
    if value <= 0 if positive else value < 0:
        raise UntrustedFileError(f"{name}: {_shown(value)} must be {'> 0' if positive else '>= 0'}")
    return float(value)


def integer(document, key, minimum=1, where="", default=None):
    """document[key] as an int >= `minimum` (`default` where the key is
    missing or null, if given); an UntrustedFileError naming `where` + key."""
    name = f"{where}{key}"
    value = document.get(key) if isinstance(document, dict) else None
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise UntrustedFileError(f"{name}: {_shown(value)} is not an integer")
    if value < minimum:
        raise UntrustedFileError(f"{name}: {value} must be >= {minimum}")
    return value


def integers(document, key, minimum=1, where=""):
    """document[key] as a non-empty tuple of ints >= `minimum`, each checked
    as `integer` does (named key[i])."""
    values = document.get(key) if isinstance(document, dict) else None
    if not isinstance(values, list) or not values:
        raise UntrustedFileError(f"{where}{key}: {_shown(values)} is not a list of integers")
    return tuple(
        integer({f"{key}[{i}]": v}, f"{key}[{i}]", minimum, where) for i, v in enumerate(values)
    )


def text(document, key, where="", default=""):
    """document[key] as a string (`default` where missing or null)."""
    value = document.get(key) if isinstance(document, dict) else None
    if value is None:
        return default
    if not isinstance(value, str):
        raise UntrustedFileError(f"{where}{key}: {_shown(value)} is not a string")
    return value
