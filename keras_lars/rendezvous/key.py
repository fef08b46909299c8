"""The chief's key for one start of keras_lars.rendezvous, and how the
other tasks find it: $KERAS_LARS_RUN_SECRET, else a secret file in the
directory the tasks share, else none (see the package docstring)."""

import hashlib
import os
import re
import secrets

try:
    import fcntl
except ImportError:  # Windows: the chief's file is not locked, and nothing is swept
    fcntl = None

from keras_lars.rendezvous.messages import HandshakeError
from keras_lars.rendezvous.messages import _canonical

SECRET_VARIABLE = "KERAS_LARS_RUN_SECRET"
SECRET_PREFIX = ".keras_lars_start_"  # + the start's id: the secret file's name
_ID = re.compile(r"[0-9a-f]{16}")
MIN_SECRET_LENGTH = 16  # characters of $KERAS_LARS_RUN_SECRET
_KINDS = {
    "variable": f"${SECRET_VARIABLE}",
    "file": "a secret file in the shared directory",
    "none": "no secret",
}


def _is_url(path):
    return "://" in str(path)


def _variable_key():
    """$KERAS_LARS_RUN_SECRET as the key (its UTF-8 bytes), None where it is
    unset or empty. ValueError naming the variable (never its value) unless
    it is UTF-8 text of at least MIN_SECRET_LENGTH characters without
    whitespace at its ends (a newline or space that one task's copy has and
    another's lacks would fail as a wrong proof)."""
    value = os.environ.get(SECRET_VARIABLE)
    if not value:
        return None
    try:
        key = value.encode("utf-8")  # undecodable bytes of the environment do not encode
    except UnicodeEncodeError:
        problem = "is not UTF-8 text"
    else:
        if value != value.strip():
            problem = "begins or ends with whitespace"
        elif len(value) < MIN_SECRET_LENGTH:
            problem = f"has {len(value)} characters, fewer than {MIN_SECRET_LENGTH}"
        else:
            return key
    raise ValueError(
        f"${SECRET_VARIABLE} {problem}: set it to the same UTF-8 text of at least "
        f"{MIN_SECRET_LENGTH} characters, without whitespace at its ends, on every task "
        "(e.g. the output of `openssl rand -hex 32`)"
    )


def _remove_stale_secrets(directory, log):
    """Removes the secret files of earlier starts in the local `directory`
    that no chief holds any more (one killed with SIGKILL left its own: a
    chief holds its file locked while its start lasts), naming each in
    `log`. On a bucket there are no locks: each one found is named only."""
    if _is_url(directory):
        from tensorflow.io import gfile

        names = gfile.listdir(directory) if gfile.isdir(directory) else []
        for name in sorted(n for n in names if _is_secret_name(n)):
            log(
                f"warning: {os.path.join(directory, name)} is the secret file of another start "
                "(under way, or left by a chief that was killed); remove it if no other start "
                "uses this directory"
            )
        return
    try:
        names = os.listdir(directory)
    except OSError:  # not there yet
        return
    for name in sorted(n for n in names if _is_secret_name(n)):
        path = os.path.join(directory, name)
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # another user's, a link, or gone
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # else a live start's
            os.remove(path)
        except OSError:
            continue
        finally:
            os.close(descriptor)
        log(f"removed {path}, the secret file of an earlier start whose chief was killed")


def _is_secret_name(name):
    return name.startswith(SECRET_PREFIX) and bool(_ID.fullmatch(name[len(SECRET_PREFIX) :]))


class _Secret:
    """The chief's key for one start: $KERAS_LARS_RUN_SECRET, else a random
    secret written to `directory` (removed at the end), else none (a
    warning). `kind`: what the challenge says of it."""

    def __init__(self, directory, run, log, address):
        self.directory, self.run, self.log, self.address = directory, run, log, address
        self.path, self.created, self.descriptor = None, [], None

    def __enter__(self):
        variable = _variable_key()
        if self.directory and fcntl:
            _remove_stale_secrets(str(self.directory), self.log)
        if variable:
            self.kind, self.key = "variable", variable
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
            self.descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            if fcntl:  # held until the start ends: a later start removes it if not
                fcntl.flock(self.descriptor, fcntl.LOCK_EX)
            os.write(self.descriptor, self.key)
        except OSError as error:
            self._remove()
            raise OSError(
                f"cannot write this start's secret in {self.directory}: {error}"
            ) from None

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
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None
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
