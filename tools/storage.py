"""Atomic writes through `tf.io.gfile` (local paths and buckets alike; files.py).

A file is written under a temporary name in its own folder, then renamed
over its final name: a reader, or a run resumed after a kill, sees the old
file or the new one, never half of one. The temporary name puts "partial-"
in front of the file name, so it keeps the file's extension (Keras insists
on ".weights.h5") and no pattern of the final names (ckpt-*, train-*)
matches it.
"""

import contextlib
import json
import os
import re
import shutil
import socket
import time

from keras_lars.tools import files
from keras_lars.tools.files import gfile
from keras_lars.tools.untrusted_json import file_kind

PARTIAL_PREFIX = "partial-"
LOCK_FILE = "run.lock"


class StorageError(Exception):
    """A file that cannot be written or a directory in use; the message
    names the path."""


def first_line(error):
    """The first line of an error's message that says what failed: TensorFlow's
    carry stack context after it; the header of a graph execution error
    ("Graph execution error:", "Detected at node ...", the node's indented
    traceback) and an eager op's "{{function_node ...}}" are skipped."""
    message = (getattr(error, "message", None) or str(error)).strip()
    lines = message.splitlines()
    if lines and lines[0].startswith("Graph execution error"):
        said = [line for line in lines[1:] if line.strip() and not line[0].isspace()]
        lines = [line for line in said if not line.startswith("Detected at node")] or lines
    # An eager op's message starts with the function it ran in: {{function_node ...}}.
    return (
        re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", lines[0]) if lines else type(error).__name__
    )


def _reason(error):
    """The system's words for an OS error ("No space left on device"); h5py's
    own messages bury them ("[Errno 28] Can't synchronously write data ...")."""
    number = getattr(error, "errno", None)
    if isinstance(error, OSError) and number:
        return os.strerror(number)
    return first_line(error)


def special_file(path):
    """What the local `path` is where it exists but is not a regular file
    ("a directory", "a FIFO (named pipe)", ...), else None (a regular file,
    a missing path, a bucket). Reading a FIFO blocks until something writes
    to it, and a device may never end."""
    if "://" in path:
        return None
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return file_kind(mode)


def partial_path(path):
    """Where `path` is written before it is renamed into place."""
    folder, name = os.path.split(path)
    return os.path.join(folder, PARTIAL_PREFIX + name)


def publish(path):
    """Renames the finished `partial_path(path)` to `path` (replacing it)."""
    gfile.rename(partial_path(path), path, overwrite=True)


def discard(path):
    """Removes `partial_path(path)` if it exists."""
    if gfile.exists(partial_path(path)):
        gfile.remove(partial_path(path))


def _discard_quietly(path):
    with contextlib.suppress(*files.ERRORS):
        discard(path)


def remove_partials(directory):
    """Removes the temporary files a killed write left in `directory`."""
    if gfile.isdir(directory):
        for name in gfile.listdir(directory):
            if name.startswith(PARTIAL_PREFIX):
                gfile.remove(os.path.join(directory, name))


def check_writable(directory):
    """Creates `directory` and writes and removes a file in it; StorageError
    naming the path if that fails (before any training is spent)."""
    probe = os.path.join(directory, "write-check")
    with atomic_file(probe) as f:
        f.write("keras_lars write check\n")
    gfile.remove(probe)


def check_space(directory, needed_bytes):
    """StorageError if the local disk of `directory` has less than
    `needed_bytes` free (a full disk makes h5py crash mid-write). Buckets
    and other remote paths are not checked."""
    if "://" in directory:
        return
    free = shutil.disk_usage(directory).free
    if free < needed_bytes:
        raise StorageError(
            f"cannot write {directory}: a checkpoint needs about {needed_bytes / 2**20:.0f} MB, "
            f"{free / 2**20:.0f} MB are free there"
        )


@contextlib.contextmanager
def staged(path):
    """`with staged(path) as temporary:` write the file `temporary`; it is
    renamed to `path` when the block succeeds and removed when it fails
    (`path` is then left as it was)."""
    try:
        folder = os.path.dirname(path)
        if folder:
            gfile.makedirs(folder)
        yield partial_path(path)
        publish(path)
    except files.ERRORS as error:
        _discard_quietly(path)
        raise StorageError(f"cannot write {path}: {_reason(error)}") from error
    except BaseException:
        _discard_quietly(path)
        raise


def write_atomically(path, write):
    """Calls write(temporary path) inside `staged(path)`."""
    with staged(path) as temporary:
        write(temporary)


@contextlib.contextmanager
def atomic_file(path, mode="w"):
    """`with atomic_file(path) as f:` f is a gfile.GFile on the
    temporary name, renamed to `path` when the block succeeds."""
    with staged(path) as temporary, gfile.GFile(temporary, mode) as f:
        yield f


def write_json(path, value, indent=1, allow_nan=True):
    """`value` as JSON at `path`, atomically."""
    with atomic_file(path) as f:
        json.dump(value, f, indent=indent, allow_nan=allow_nan)


def read_json(path):
    with gfile.GFile(path) as f:
        return json.load(f)


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_lock(path, flag, directory):
    """The lock at `path` ({pid, host, since}); StorageError saying what it
    is instead where it is not one `exclusive` wrote."""
    special = special_file(path)
    try:
        held = None if special else read_json(path)
        problem = f"it is {special}" if special else None
    except (ValueError, *files.ERRORS) as error:
        held, problem = None, f"it is not JSON ({first_line(error)})"
    if problem is None and not (
        isinstance(held, dict)
        and type(held.get("pid")) is int
        and isinstance(held.get("host"), str)
    ):
        problem = f"it holds {json.dumps(held)[:80]}, not a pid and a host"
    if problem:
        raise StorageError(
            f"{flag}={directory} has a lock file {path} that is not a run's lock ({problem}); "
            "if no run uses the directory, remove it"
        )
    return held


@contextlib.contextmanager
def exclusive(directory, flag="--model_dir"):
    """Holds `directory`/run.lock (pid, host, start time) for the block, so a
    second run on the same directory refuses at once. A lock left by a dead
    process of this host is replaced (and said); a lock of another host is
    reported with its owner; a run.lock that is not a lock (not JSON, no pid
    and host, a FIFO) is reported as such and left in place."""
    path = os.path.join(directory, LOCK_FILE)
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%c")}
    if gfile.exists(path):
        held = _read_lock(path, flag, directory)
        same_host = held.get("host") == owner["host"]
        if same_host and isinstance(held.get("pid"), int) and not _process_alive(held["pid"]):
            print(
                f"removing the stale lock of pid {held['pid']} (no longer running): {path}",
                flush=True,
            )
        else:
            raise StorageError(
                f"{flag}={directory} is in use by pid {held['pid']} on host "
                f"{held['host']} (since {held.get('since', '?')}); stop that run, or "
                f"if it is gone remove {path}"
            )
    write_json(path, owner)
    try:
        yield
    finally:
        with contextlib.suppress(*files.ERRORS):
            gfile.remove(path)
