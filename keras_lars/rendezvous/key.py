"""The chief's key for one start of keras_lars.rendezvous, and how the
other tasks find it: $KERAS_LARS_RUN_SECRET, else a secret file in the
directory the tasks share, else none (see the package docstring)."""

import hashlib
import os
import re
import secrets

from keras_lars.rendezvous.messages import HandshakeError
from keras_lars.rendezvous.messages import _canonical

SECRET_VARIABLE = "KERAS_LARS_RUN_SECRET"
SECRET_PREFIX = ".keras_lars_start_"  # + the start's id: the secret file's name
_ID = re.compile(r"[0-9a-f]{16}")
_KINDS = {
    "variable": f"${SECRET_VARIABLE}",
    "file": "a secret file in the shared directory",
    "none": "no secret",
}


def _is_url(path):
    return "://" in str(path)


class _Secret:
    """The chief's key for one start: $KERAS_LARS_RUN_SECRET, else a random
    secret written to `directory` (removed at the end), else none (a
    warning). `kind`: what the challenge says of it."""

    def __init__(self, directory, run, log, address):
        self.directory, self.run, self.log, self.address = directory, run, log, address
        self.path, self.created = None, []

    def __enter__(self):
        variable = os.environ.get(SECRET_VARIABLE)
        if variable:
            self.kind, self.key = "variable", variable.encode()
        elif self.directory:
            start = secrets.token_hex(8)
            self.kind, self.key = f"file:{start}", secrets.token_hex(32).encode()
            self.path = os.path.join(str(self.directory), SECRET_PREFIX + start)
            self._write()
            if _is_url(self.directory):
                self.log(
                    f"warning: this start's secret lies in {self.directory}, which has no "
                    "owner-only permissions: whoever can read it can take a task's place in "
                    f"the start; set ${SECRET_VARIABLE} (the same on every task) for a secret "
                    "of the run alone"
                )
        else:
            self.kind, self.key = "none", _open_key(self.run)
            self.log(
                f"warning: this start is not authenticated (no ${SECRET_VARIABLE} and no "
                f"directory shared by the tasks): whoever reaches {self.address} can take a "
                f"task's place in it; set ${SECRET_VARIABLE} (the same on every task)"
            )
        return self

    def _write(self):
        if _is_url(self.directory):
            from tensorflow.io import gfile

            gfile.makedirs(self.directory)
            with gfile.GFile(self.path, "wb") as f:
                f.write(self.key)
            return
        missing, parent = [], os.path.abspath(self.directory)
        while not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        try:
            for directory in reversed(missing):
                os.mkdir(directory)
                self.created.append(directory)
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            self._remove()
            raise OSError(
                f"cannot write this start's secret in {self.directory}: {error}"
            ) from None
        with os.fdopen(descriptor, "wb") as f:
            f.write(self.key)

    def _remove(self):
        if self.path:
            try:
                if _is_url(self.path):
                    from tensorflow.io import gfile

                    gfile.remove(self.path)
                else:
                    os.remove(self.path)
            except Exception:  # already gone, or the bucket is out of reach
                pass
        for directory in reversed(self.created):  # the chief made them for the secret alone
            try:
                os.rmdir(directory)
            except OSError:  # something else is in it now
                break

    def __exit__(self, *exc):
        self._remove()


def _read_secret(path):
    """The secret in the file at `path`, None while it is not (all) there."""
    try:
        if _is_url(path):
            from tensorflow.io import gfile

            if not gfile.exists(path):
                return None
            with gfile.GFile(path, "rb") as f:
                key = f.read()
        else:
            with open(path, "rb") as f:
                key = f.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise HandshakeError(
            f"cannot read this start's secret {path}: {error} (every task must run as the "
            f"user that runs the chief, or set ${SECRET_VARIABLE})"
        ) from None
    return key if len(key) == 64 else None


def _open_key(run):
    return hashlib.sha256(_canonical(["keras_lars open start", run])).digest()
