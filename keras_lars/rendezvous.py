"""The start-up handshake of a run's tasks: a star around the chief.

TensorFlow's and JAX's own starts wait for their peers silently and take any
program listening on a peer's address for the peer. Before them, every task
meets the chief over TCP and proves, by challenge and response, that it holds
the run's secret; the chief proves the same back before it hears anything of
the task's settings:

    chief -> task    challenge   {protocol, challenge: nonce, key: where the key is}
    task  -> chief   hello       {protocol, task, status: "hello", nonce, proof}
    chief -> task    "waiting"   (signed: the chief holds the key too), or
                     "refused"   {protocol, status, reason}: nothing of the run
    task  -> chief   settings    {protocol, status: "settings", settings, proof}
    chief -> task    "go" once every task is in with equal settings, else
                     "refused" naming the settings that differ (both signed,
                     with the chief's settings)

Each message is one JSON line of at most MAX_LINE bytes; each signed one carries

    proof = HMAC-SHA256(key, canonical JSON of the message's fields, the run's
                        identity and both nonces)

so that a hello answers one challenge only (no replay) and no message of one
connection or direction passes for another. The key (`key` in the challenge):

    "variable"     $KERAS_LARS_RUN_SECRET, where set (the same on every task)
    "file:<id>"    else, where the tasks share a directory (the training tool:
                   --model_dir): 32 random bytes the chief writes there for this
                   start, as `.keras_lars_start_<id>`, created at once with
                   owner-only permissions (0600, O_EXCL) and removed when the
                   start ends; the others read it. On a bucket (gs://...) there
                   are no file permissions: whoever can read the bucket can read
                   it, and the chief says so in one warning line.
    "none"         else: SHA-256 of the run's identity, which proves nothing
                   (a guard against strays, not attackers); one warning line.

The chief listens on its own address only (that host, not every interface;
`listen_host` says where a name resolves to loopback only), serves every
connection at once (a connection that sends no hello, or no settings, within
HELLO_SECONDS, or more than MAX_LINE bytes, is dropped), admits only a
well-formed hello with a valid proof from a task not yet seen, logging one line
for each ("admitted {task} from {address}"); anything else is logged once
(who, why) and answered "refused" with the reason where it speaks the protocol.
Once every task is in it compares their settings: equal, it answers "go"; else
every task gets "refused" and the chief raises HandshakeError naming each
setting that differs and who holds which value.

What it does not protect: TensorFlow's gRPC servers and JAX's coordination
service, which start after it on the same hosts, accept any connection;
keep their ports to the run's hosts (a firewall, a Kubernetes NetworkPolicy,
a VPC firewall rule).
"""

import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import selectors
import socket
import time

PROTOCOL = "keras_lars.rendezvous/2"
SECRET_VARIABLE = "KERAS_LARS_RUN_SECRET"
SECRET_PREFIX = ".keras_lars_start_"  # + the start's id: the secret file's name
MAX_LINE = 65536  # bytes of one message
HELLO_SECONDS = 5.0  # a connection's time to send each message, and the chief's to answer
MAX_PENDING = 64  # connections not yet in; beyond, the oldest is dropped
WRONG_PROOF = "a wrong proof (another run, or another secret)"
_HELLO_FIELDS = {"protocol", "task", "status", "nonce", "proof"}
_SETTINGS_FIELDS = {"protocol", "status", "settings", "proof"}
_ANSWER_FIELDS = {"protocol", "status", "reason", "settings", "proof"}
_REFUSAL_FIELDS = {"protocol", "status", "reason"}
_ID = re.compile(r"[0-9a-f]{16}")


class HandshakeError(ValueError):
    """The tasks' settings differ, or a peer's address answers as something
    other than this run's chief."""


def meet(
    me,
    tasks,
    chief_address,
    timeout_seconds,
    *,
    run=None,
    settings=None,
    own_address=None,
    addresses=None,
    others="other tasks",
    log=print,
    report_every_seconds=30.0,
    stop=None,
    secret_dir=None,
):
    """Returns once every task of `tasks` has met the chief with the same
    `settings`: the number of the other tasks. HandshakeError if the
    settings differ or the chief's address answers as something else.

    Args:
        me: this task, a key of `tasks`: (job, index).
        tasks: {(job, index): label} of every task of the run, the chief first.
        chief_address: "host:port" the chief listens on.
        timeout_seconds: float > 0: TimeoutError naming the missing tasks after that.
        run: JSON-able identity of the run (tasks of another run are refused).
        settings: {name: value} every task must share (JSON-able).
        own_address: "host:port" a non-chief reserves while it waits (an
            OSError naming it at once if taken).
        addresses: {(job, index): "host:port"}: at the timeout, a missing
            task's address that accepts connections is named.
        others: the other tasks as a phrase ("1 of the 3 {others}: ...").
        log: receives a "waiting for ..." line every `report_every_seconds`
            and, on the chief, one line per task it admits, one per
            connection it ignores (who, why) and the warning of a start
            without a secret only the run can read.
        stop: None or a callable returning a reason (e.g. a signal name) to
            give up: InterruptedError.
        secret_dir: a directory every task reads (a path, or a gs:// URL read
            through tf.io.gfile) where, without $KERAS_LARS_RUN_SECRET, the
            chief writes this start's secret (see the module docstring).
    """
    if not timeout_seconds > 0:
        raise ValueError(f"`timeout_seconds` must be > 0, received {timeout_seconds!r}.")
    tasks = {tuple(task): label for task, label in tasks.items()}
    chief = next(iter(tasks))
    if len(tasks) == 1:
        return 0
    hello = _Hello(run, settings or {}, secret_dir)
    clock = _Clock(timeout_seconds, report_every_seconds, log, stop)
    if chief == tuple(me):
        return _gather(hello, tasks, chief_address, clock, addresses or {}, others)
    with _Reserved(own_address):
        _join(hello, tuple(me), tasks, chief_address, clock, others)
    return len(tasks) - 1


def split_address(address):
    """(host, port) of "host:port" ("[::1]:port" for IPv6); ValueError if malformed."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not port.isascii() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


def accepts_connections(address, seconds=1.0):
    """Whether something accepts TCP connections at "host:port"."""
    try:
        socket.create_connection(split_address(address), timeout=seconds).close()
        return True
    except OSError:
        return False


def differences(settings_of):
    """The settings whose values differ among `settings_of` ({task name:
    {name: value}}), each as "name: value on task, value on task" (tasks
    that share a value joined by "and"), joined by "; "; "" if none."""
    names = dict.fromkeys(name for values in settings_of.values() for name in values)
    found = []
    for name in names:
        holders = {}
        for task, values in settings_of.items():
            shown = json.dumps(values.get(name, "(unset)"), sort_keys=True).strip('"')
            holders.setdefault(shown, []).append(task)
        if len(holders) > 1:
            parts = [f"{value} on {' and '.join(who)}" for value, who in holders.items()]
            found.append(f"{name}: {', '.join(parts)}")
    return "; ".join(found)


def _name(task):
    return f"{task[0]} {task[1]}"


def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _is_url(path):
    return "://" in str(path)


class _NotOurs(ValueError):
    """A line that is not the expected message of this run; `answer`: it
    speaks the protocol, so it is answered "refused"."""

    def __init__(self, why, answer):
        super().__init__(why)
        self.answer = answer


# --- the key ---------------------------------------------------------------------------
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


class _Hello:
    """This task's messages, and the checks of those it receives."""

    def __init__(self, run, settings, secret_dir):
        self.run = json.loads(json.dumps(run))  # as the peers will see them
        self.settings = json.loads(json.dumps(settings))
        self.secret_dir = secret_dir

    def signed(self, key, nonces, **fields):
        fields = {"protocol": PROTOCOL, **fields}
        return _canonical({**fields, "proof": self._proof(key, nonces, fields)}) + b"\n"

    def _proof(self, key, nonces, fields):
        signed = _canonical({"run": self.run, "nonces": nonces, "fields": fields})
        return hmac.new(key, signed, hashlib.sha256).hexdigest()

    def verify(self, key, nonces, fields):
        """Raises _NotOurs unless `fields` (a message with its proof) is signed with `key`."""
        fields = dict(fields)
        proof = fields.pop("proof")
        if not isinstance(proof, str) or not hmac.compare_digest(
            proof, self._proof(key, nonces, fields)
        ):
            raise _NotOurs(WRONG_PROOF, True)

    # The chief's side.
    @staticmethod
    def challenge(nonce, kind):
        return _canonical({"protocol": PROTOCOL, "challenge": nonce, "key": kind}) + b"\n"

    @staticmethod
    def refusal(reason):
        """A refusal before (or without) the proof: the reason alone."""
        return _canonical({"protocol": PROTOCOL, "status": "refused", "reason": reason}) + b"\n"

    def read_hello(self, line, key, challenge):
        """(task, nonce) of a hello answering `challenge`; _NotOurs (why)
        unless it is a well-formed one with a valid proof."""
        fields = _message(line, _HELLO_FIELDS)
        task, nonce = fields["task"], fields["nonce"]
        well_formed = (
            isinstance(task, list)
            and len(task) == 2
            and isinstance(task[0], str)
            and type(task[1]) is int
            and fields["status"] == "hello"
            and isinstance(nonce, str)
            and len(nonce) <= 64
        )
        if not well_formed:
            raise _NotOurs("a malformed hello", True)
        self.verify(key, [challenge, nonce], fields)
        return tuple(task), nonce

    def read_settings(self, line, key, nonces):
        fields = _message(line, _SETTINGS_FIELDS)
        if fields["status"] != "settings" or not isinstance(fields["settings"], dict):
            raise _NotOurs("malformed settings", True)
        self.verify(key, nonces, fields)
        return fields["settings"]


def _message(line, names):
    """The fields of a message with the fields `names`; _NotOurs if it is none."""
    try:
        fields = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _NotOurs(f"not a keras_lars hello: {line[:60]!r}", False) from None
    if not isinstance(fields, dict) or fields.get("protocol") is None:
        raise _NotOurs(f"not a keras_lars hello: {line[:60]!r}", False)
    if fields["protocol"] != PROTOCOL:
        raise _NotOurs(f"speaks {str(fields['protocol'])[:40]!r}, not {PROTOCOL}", True)
    if set(fields) != names:
        raise _NotOurs("a malformed hello", True)
    return fields


class _Clock:
    """The wait's deadline, its "waiting for" lines and its stop."""

    def __init__(self, timeout_seconds, report_every_seconds, log, stop):
        self.timeout, self.every, self.log, self.stop = (
            timeout_seconds,
            report_every_seconds,
            log,
            stop,
        )
        self.started = self.reported = time.monotonic()

    def left(self):
        return self.started + self.timeout - time.monotonic()

    def tick(self, waiting_for, hint=""):
        """Raises InterruptedError once `stop()` says so, TimeoutError past
        the deadline (with `hint`, a text or a function giving one); logs
        "waiting for {waiting_for}" every so often."""
        reason = self.stop() if self.stop else None
        if reason:
            raise InterruptedError(f"stopped by {reason} while waiting for {waiting_for}")
        waited = time.monotonic() - self.started
        if waited >= self.timeout:
            hint = hint() if callable(hint) else hint
            raise TimeoutError(f"{waiting_for} did not start within {self.timeout:g} s{hint}")
        if time.monotonic() - self.reported >= self.every:
            self.reported = time.monotonic()
            self.log(f"waiting for {waiting_for} ({waited:.0f} of {self.timeout:g} s)")


# --- the chief -----------------------------------------------------------------------
class _Connection:
    def __init__(self, sock, peer):
        self.sock, self.peer = sock, f"{peer[0]}:{peer[1]}"
        self.received, self.task, self.settings = b"", None, None
        self.challenge, self.nonce = secrets.token_hex(16), None
        self.deadline = time.monotonic() + HELLO_SECONDS

    def send(self, line):
        """Sends `line`; False if the peer is gone."""
        try:
            self.sock.settimeout(HELLO_SECONDS)
            self.sock.sendall(line)
            self.sock.setblocking(False)
            return True
        except OSError:
            return False


def _family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def listen_host(host):
    """The host to bind for the configured `host`: itself, except a name
    other than "localhost" that resolves here to loopback addresses only
    (Debian's /etc/hosts maps the machine's own name to 127.0.1.1, while
    its peers reach it at its network address): then every interface, as
    TensorFlow's and JAX's own servers bind."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return host  # the bind names it
    if host != "localhost" and found and all(ipaddress.ip_address(a).is_loopback for a in found):
        return ""
    return host


def _gather(hello, tasks, address, clock, addresses, others):
    """The chief's side: holds its address, then serves every connection at
    once until each task of `tasks` is in (the key: `_Secret`); then "go", or
    "refused" and HandshakeError."""
    host, port = split_address(address)
    try:
        bound = listen_host(host)
        server = socket.create_server((bound, port), family=_family(bound), backlog=64)
    except OSError as error:
        raise OSError(f"cannot listen on this task's address {address}: {error}") from None
    try:
        with _Secret(hello.secret_dir, hello.run, clock.log, address) as secret:
            return _serve(hello, secret, server, tasks, clock, addresses, others)
    finally:
        server.close()


def _serve(hello, secret, server, tasks, clock, addresses, others):
    chief = next(iter(tasks))
    expected = [task for task in tasks if task != chief]
    arrived, pending = {}, {}  # task: _Connection (admitted); socket: _Connection (not all in)
    selector = selectors.DefaultSelector()
    server.setblocking(False)
    selector.register(server, selectors.EVENT_READ)

    def drop(connection, why=None, answer=False):
        """Closes `connection`, logging `why` (and answering it "refused")."""
        if why:
            clock.log(f"ignored a connection from {connection.peer}: {why}")
            if answer:
                connection.send(hello.refusal(why))
        pending.pop(connection.sock, None)
        if connection.task and arrived.get(connection.task) is connection:
            del arrived[connection.task]
            clock.log(f"{tasks[connection.task]} left before the start; waiting for it again")
        selector.unregister(connection.sock)
        connection.sock.close()

    def admit(connection, line):
        try:
            task, nonce = hello.read_hello(line, secret.key, connection.challenge)
        except _NotOurs as error:
            return drop(connection, str(error), error.answer)
        # The proof is valid: the sender holds the key, and may hear the tasks' names.
        if task not in expected:
            known = ", ".join(_name(t) for t in tasks)
            return drop(connection, f"{_name(task)} is not a task of this run ({known})", True)
        if task in arrived:
            return drop(connection, f"{_name(task)} has already arrived", True)
        connection.task, connection.nonce = task, nonce
        connection.deadline = time.monotonic() + HELLO_SECONDS
        arrived[task] = connection
        clock.log(f"admitted {tasks[task]} from {connection.peer}")
        nonces = [connection.challenge, nonce]
        if not connection.send(hello.signed(secret.key, nonces, status="waiting", task=list(task))):
            drop(connection)

    def settle(connection, line):
        nonces = [connection.challenge, connection.nonce]
        try:
            connection.settings = hello.read_settings(line, secret.key, nonces)
        except _NotOurs as error:
            return drop(connection, str(error), error.answer)
        del pending[connection.sock]

    def receive(connection):
        try:
            chunk = connection.sock.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:
            drop(connection, None if connection.task else "closed before its hello")
            return
        if connection.settings is not None:
            return  # all in: nothing more to hear
        connection.received += chunk
        while b"\n" in connection.received and connection.sock in pending:
            line, connection.received = connection.received.split(b"\n", 1)
            (settle if connection.task else admit)(connection, line)
        if connection.sock in pending and len(connection.received) > MAX_LINE:
            drop(connection, f"sent more than {MAX_LINE} bytes without a hello")

    def missing():
        names = [tasks[task] for task in expected if task not in arrived]
        return f"{len(names)} of the {len(expected)} {others}: {', '.join(names)}"

    def taken():  # at the timeout: a missing task's address held by another program
        return "".join(
            f"; something that is not this run's task accepts connections at {addresses[task]}"
            for task in expected
            if task not in arrived and task in addresses and accepts_connections(addresses[task])
        )

    def all_in():
        return len(arrived) == len(expected) and all(
            c.settings is not None for c in arrived.values()
        )

    try:
        while not all_in():
            clock.tick(missing(), taken)
            for key, _ in selector.select(timeout=0.2):
                if key.fileobj is server:
                    _accept(server, selector, pending, drop, hello, secret)
                elif key.data.sock in pending or arrived.get(key.data.task) is key.data:
                    receive(key.data)
            for connection in list(pending.values()):
                if time.monotonic() > connection.deadline:
                    what = "settings" if connection.task else "hello"
                    drop(connection, f"no {what} within {HELLO_SECONDS:g} s")
        settings_of = {_name(chief): hello.settings}
        settings_of.update({_name(t): arrived[t].settings for t in expected})
        differ = differences(settings_of)
        status, refusal = ("refused", f"settings differ: {differ}") if differ else ("go", "")
        for connection in arrived.values():
            nonces = [connection.challenge, connection.nonce]
            connection.send(
                hello.signed(
                    secret.key, nonces, status=status, reason=refusal, settings=hello.settings
                )
            )
        if differ:
            raise HandshakeError(refusal)
        return len(expected)
    finally:
        for connection in [*pending.values(), *arrived.values()]:
            connection.sock.close()
        selector.close()


def _accept(server, selector, pending, drop, hello, secret):
    while True:
        try:
            sock, peer = server.accept()
        except OSError:  # none left (or no file descriptor: the idle ones go below)
            return
        sock.setblocking(False)
        connection = _Connection(sock, peer[:2])
        pending[sock] = connection
        selector.register(sock, selectors.EVENT_READ, connection)
        connection.send(hello.challenge(connection.challenge, secret.kind))
        if len(pending) > MAX_PENDING:
            drop(next(iter(pending.values())), f"more than {MAX_PENDING} connections at once")


# --- the other tasks -----------------------------------------------------------------
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
                line = lines.next(HELLO_SECONDS, clock, tasks[chief], hint)
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
                status = meeting.answer(lines.next(HELLO_SECONDS, clock, tasks[chief]), key, nonces)
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
            return os.environ[SECRET_VARIABLE].encode(), nonce
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


_KINDS = {
    "variable": f"${SECRET_VARIABLE}",
    "file": "a secret file in the shared directory",
    "none": "no secret",
}


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
