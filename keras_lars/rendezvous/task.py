"""The other tasks' side of keras_lars.rendezvous: each holds its own
address, meets the chief (retrying) and checks what the chief sends."""

import json
import os
import secrets
import socket
import time

from keras_lars.rendezvous import messages
from keras_lars.rendezvous.addresses import _family
from keras_lars.rendezvous.addresses import listen_host
from keras_lars.rendezvous.addresses import split_address
from keras_lars.rendezvous.key import _ID
from keras_lars.rendezvous.key import _KINDS
from keras_lars.rendezvous.key import SECRET_PREFIX
from keras_lars.rendezvous.key import SECRET_VARIABLE
from keras_lars.rendezvous.key import _open_key
from keras_lars.rendezvous.key import _read_secret
from keras_lars.rendezvous.key import _variable_key
from keras_lars.rendezvous.messages import _ANSWER_FIELDS
from keras_lars.rendezvous.messages import MAX_LINE
from keras_lars.rendezvous.messages import PROTOCOL
from keras_lars.rendezvous.messages import HandshakeError
from keras_lars.rendezvous.messages import _name
from keras_lars.rendezvous.messages import _NotOurs
from keras_lars.rendezvous.messages import differences


class _Reserved:
    """Binds "host:port" (when given) while the task waits, so that a program
    already on it is found at once."""

    def __init__(self, address):
        self.address, self.sock = address, None

    def __enter__(self):
        if self.address:
            host, port = split_address(self.address)
            host = listen_host(host)
            self.sock = socket.socket(_family(host))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                self.sock.bind((host, port))
            except OSError as error:
                self.sock.close()
                raise OSError(
                    f"cannot listen on this task's address {self.address}: {error}"
                ) from None
        return self

    def __exit__(self, *exc):
        if self.sock:
            self.sock.close()


def _join(hello, me, tasks, address, clock, others):
    """A non-chief's side: meets the chief (retrying) until it says "go"."""
    chief = next(iter(tasks))
    gathering = f"the {others}, gathered by {tasks[chief]},"
    meeting = _Meeting(hello, me, tasks, address, clock)
    hint = ""
    while True:
        clock.tick(tasks[chief], hint)
        try:
            connection = socket.create_connection(split_address(address), timeout=1)
        except OSError:  # not listening yet
            time.sleep(0.5)
            continue
        with connection:
            try:
                lines = _Lines(connection)
                line = lines.next(messages.HELLO_SECONDS, clock, tasks[chief], hint)
                if line is None:
                    hint = (
                        f"; {address} accepts connections but does not answer a hello "
                        "(another program listening there?)"
                    )
                    time.sleep(0.5)
                    continue
                key, challenge = meeting.challenge(line)
                if key is None:  # the secret file is not here yet
                    connection.close()
                    hint = meeting.wait_for_secret()
                    continue
                nonces = [challenge, secrets.token_hex(16)]
                connection.sendall(
                    hello.signed(key, nonces, task=list(me), status="hello", nonce=nonces[1])
                )
                status = meeting.answer(
                    lines.next(messages.HELLO_SECONDS, clock, tasks[chief]), key, nonces
                )
                if status is None:
                    continue
                connection.sendall(
                    hello.signed(key, nonces, status="settings", settings=hello.settings)
                )
                line = lines.next(None, clock, gathering.rstrip(","))
                if line is None:  # the chief left: meet it again
                    continue
                status = meeting.answer(line, key, nonces, ("go", "refused"))
            except (TimeoutError, InterruptedError):  # the clock's
                raise
            except OSError:  # reset, or the answer did not come
                time.sleep(0.5)
                continue
        if status == "go":
            return


class _Meeting:
    """A non-chief's checks of what the chief sends."""

    def __init__(self, hello, me, tasks, address, clock):
        self.hello, self.me, self.tasks, self.address, self.clock = (
            hello,
            me,
            tasks,
            address,
            clock,
        )
        self.chief = next(iter(tasks))
        self.secret_path = None

    def _not_the_chief(self, why):
        return HandshakeError(
            f"{self.address} is not the chief of this run ({self.tasks[self.chief]}): {why}"
        )

    def challenge(self, line):
        """(key, nonce) of the chief's challenge; key None while its secret
        file is not here."""
        try:
            fields = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            fields = None
        if not isinstance(fields, dict) or fields.get("protocol") is None:
            raise self._not_the_chief(f"not a keras_lars hello: {line[:60]!r}")
        if fields["protocol"] != PROTOCOL:
            raise self._not_the_chief(f"speaks {str(fields['protocol'])[:40]!r}, not {PROTOCOL}")
        kind, nonce = fields.get("key"), fields.get("challenge")
        if set(fields) != {"protocol", "challenge", "key"} or not isinstance(nonce, str):
            raise self._not_the_chief("a malformed challenge")
        mine = self._kind()
        theirs = kind.split(":")[0] if isinstance(kind, str) else kind
        if theirs != mine:
            raise HandshakeError(
                f"{self.tasks[self.chief]} proves with {_KINDS.get(theirs, repr(theirs))}, "
                f"this task with {_KINDS[mine]}: set ${SECRET_VARIABLE} on every task or on none"
            )
        if mine == "variable":
            return _variable_key(), nonce
        if mine == "none":
            return _open_key(self.hello.run), nonce
        start = kind.split(":", 1)[1]
        if not _ID.fullmatch(start):
            raise self._not_the_chief("a malformed challenge")
        self.secret_path = os.path.join(str(self.hello.secret_dir), SECRET_PREFIX + start)
        return _read_secret(self.secret_path), nonce

    def _kind(self):
        if os.environ.get(SECRET_VARIABLE):
            return "variable"
        return "file" if self.hello.secret_dir else "none"

    def wait_for_secret(self):
        """Waits (on the clock) until the chief's secret file is here; the
        hint of the timeout if it never comes."""
        hint = (
            f"; this start's secret {self.secret_path} never appeared here (is "
            f"{self.hello.secret_dir} shared by every task? else set ${SECRET_VARIABLE})"
        )
        while _read_secret(self.secret_path) is None:
            self.clock.tick(self.tasks[self.chief], hint)
            time.sleep(0.5)
        return hint

    def answer(self, line, key, nonces, expected=("waiting", "refused")):
        """The status of the chief's answer `line` (None: no answer; retry)."""
        if line is None:
            return None
        try:
            fields = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            fields = None
        if not isinstance(fields, dict) or fields.get("protocol") != PROTOCOL:
            raise self._not_the_chief(f"not a keras_lars answer: {line[:60]!r}")
        status = fields.get("status")
        if status == "refused":  # signed or not: the task stops, on one line
            reason = " ".join(str(fields.get("reason")).split())[:2000]
            raise HandshakeError(f"{self.tasks[self.chief]} refused {_name(self.me)}: {reason}")
        names = {"protocol", "status", "task", "proof"} if status == "waiting" else _ANSWER_FIELDS
        if status not in expected or set(fields) != names:
            raise self._not_the_chief(f"it answered {str(status)[:40]!r}")
        try:
            self.hello.verify(key, nonces, fields)
        except _NotOurs as error:
            raise self._not_the_chief(str(error)) from None
        if status == "go":  # the chief compared the settings; this checks the chief
            chief_settings = fields["settings"]
            differ = differences(
                {_name(self.chief): chief_settings, _name(self.me): self.hello.settings}
            )
            if differ:
                raise HandshakeError(f"settings differ: {differ}")
        return status


class _Lines:
    """The lines a connection receives, one at a time."""

    def __init__(self, connection):
        self.connection, self.received = connection, b""

    def next(self, seconds, clock, waiting_for, hint=""):
        """The next line (without its newline; what came if the connection
        closes or `seconds` pass first); None if nothing came (`seconds`
        None: until the clock's end)."""
        until = time.monotonic() + seconds if seconds else None
        self.connection.settimeout(0.2)
        while b"\n" not in self.received and len(self.received) <= MAX_LINE:
            clock.tick(waiting_for, hint)
            if until and time.monotonic() > until:
                break
            try:
                chunk = self.connection.recv(4096)
            except TimeoutError:  # the socket's, not the clock's
                continue
            if not chunk:
                break
            self.received += chunk
        line, _, self.received = self.received.partition(b"\n")
        return line[:MAX_LINE] or None
