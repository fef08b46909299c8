"""The start-up handshake of a run's tasks: a star around the chief.

TensorFlow's and JAX's own starts wait for their peers silently and take any
program listening on a peer's address for the peer. Before them, every task
meets the chief over TCP and proves it belongs to the run:

    task  -> chief   hello
    chief -> task    its own hello: "waiting" (admitted), then "go" once every
                     task has arrived, or "refused" with the reason

A hello is one JSON line of at most MAX_LINE bytes,

    {"protocol": PROTOCOL, "run": the run's identity (e.g. its cluster),
     "task": [job, index], "settings": {name: value}, "status": ...,
     "reason": ..., "proof": hex}
    proof = HMAC-SHA256(key, canonical JSON of the other fields)
    key   = $KERAS_LARS_RUN_SECRET, else SHA-256(canonical JSON of run, settings)

Without the secret the proof shows only that the sender speaks this protocol
for that run (a guard against strays, not attackers); with it, only holders
of the secret get in.

The chief listens on its own address only (that host, not every interface;
`listen_host` says where a name resolves to loopback only),
serves every connection at once (a connection that sends no hello within
HELLO_SECONDS, or more than MAX_LINE bytes, is dropped), and admits only a
well-formed hello of this run from a task not yet seen with a valid proof;
anything else is logged once (who, why) and answered "refused" where it
speaks the protocol. Once every task is in it compares their settings: equal,
it answers "go"; else every task gets "refused" and the chief raises
HandshakeError naming each setting that differs and who holds which value.
"""

import hashlib
import hmac
import ipaddress
import json
import os
import selectors
import socket
import time

PROTOCOL = "keras_lars.rendezvous/1"
SECRET_VARIABLE = "KERAS_LARS_RUN_SECRET"
MAX_LINE = 65536  # bytes of one hello
HELLO_SECONDS = 5.0  # a connection's time to send its hello, and the chief's to answer
MAX_PENDING = 64  # connections not yet admitted; beyond, the oldest is dropped
_FIELDS = {"protocol", "run", "task", "settings", "status", "reason", "proof"}


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
            and, on the chief, one line per connection it ignores (who, why).
        stop: None or a callable returning a reason (e.g. a signal name) to
            give up: InterruptedError.
    """
    if not timeout_seconds > 0:
        raise ValueError(f"`timeout_seconds` must be > 0, received {timeout_seconds!r}.")
    tasks = {tuple(task): label for task, label in tasks.items()}
    chief = next(iter(tasks))
    hello = _Hello(run, settings or {})
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


class _NotOurs(ValueError):
    """A line that is not a hello of this run; `answer`: it speaks the
    protocol, so it is answered "refused"."""

    def __init__(self, why, answer):
        super().__init__(why)
        self.answer = answer


class _Hello:
    """This task's hellos, and the checks of those it receives."""

    def __init__(self, run, settings):
        self.run = json.loads(json.dumps(run))  # as the peers will see them
        self.settings = json.loads(json.dumps(settings))

    def line(self, task, status, reason=""):
        fields = {
            "protocol": PROTOCOL,
            "run": self.run,
            "task": list(task),
            "settings": self.settings,
            "status": status,
            "reason": reason,
        }
        return _canonical({**fields, "proof": _proof(fields)}) + b"\n"

    def read(self, line):
        """(task, status, reason, settings) of a received line; _NotOurs
        (why) if it is not a well-formed hello of this run."""
        try:
            fields = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise _NotOurs(f"not a keras_lars hello: {line[:60]!r}", False) from None
        if not isinstance(fields, dict) or fields.get("protocol") is None:
            raise _NotOurs(f"not a keras_lars hello: {line[:60]!r}", False)
        if fields["protocol"] != PROTOCOL or set(fields) != _FIELDS:
            raise _NotOurs(f"speaks {str(fields['protocol'])[:40]!r}, not {PROTOCOL}", True)
        proof = fields.pop("proof")
        if not isinstance(proof, str) or not hmac.compare_digest(proof, _proof(fields)):
            raise _NotOurs(f"a wrong proof (another run, or another ${SECRET_VARIABLE})", True)
        task = fields["task"]
        well_formed = (
            isinstance(task, list)
            and len(task) == 2
            and isinstance(task[0], str)
            and type(task[1]) is int
            and isinstance(fields["settings"], dict)
            and isinstance(fields["status"], str)
            and isinstance(fields["reason"], str)
        )
        if not well_formed:
            raise _NotOurs("a malformed hello", True)
        if fields["run"] != self.run:
            raise _NotOurs(f"of another run: {_canonical(fields['run'])[:200].decode()}", True)
        return tuple(task), fields["status"], fields["reason"], fields["settings"]


def _proof(fields):
    secret = os.environ.get(SECRET_VARIABLE)
    if secret:
        key = secret.encode()
    else:
        key = hashlib.sha256(_canonical([fields["run"], fields["settings"]])).digest()
    return hmac.new(key, _canonical(fields), hashlib.sha256).hexdigest()


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
    """The chief's side: serves every connection at once until each task of
    `tasks` is in; then "go", or "refused" and HandshakeError."""
    chief = next(iter(tasks))
    expected = [task for task in tasks if task != chief]
    host, port = split_address(address)
    try:
        bound = listen_host(host)
        server = socket.create_server((bound, port), family=_family(bound), backlog=64)
    except OSError as error:
        raise OSError(f"cannot listen on this task's address {address}: {error}") from None
    arrived, pending = {}, {}  # task: _Connection; socket: _Connection
    selector = selectors.DefaultSelector()
    server.setblocking(False)
    selector.register(server, selectors.EVENT_READ)

    def drop(connection, why=None, answer=False):
        """Closes `connection`, logging `why` (and answering it "refused")."""
        if why:
            clock.log(f"ignored a connection from {connection.peer}: {why}")
            if answer:
                connection.send(hello.line(chief, "refused", why))
        pending.pop(connection.sock, None)
        if connection.task and arrived.get(connection.task) is connection:
            del arrived[connection.task]
            clock.log(f"{tasks[connection.task]} left before the start; waiting for it again")
        selector.unregister(connection.sock)
        connection.sock.close()

    def admit(connection, line):
        try:
            task, status, _, settings = hello.read(line)
        except _NotOurs as error:
            return drop(connection, str(error), error.answer)
        if task not in expected or status != "hello":
            known = ", ".join(_name(t) for t in tasks)
            return drop(connection, f"{_name(task)} is not a task of this run ({known})", True)
        if task in arrived:
            return drop(connection, f"{_name(task)} has already arrived", True)
        connection.task, connection.settings = task, settings
        del pending[connection.sock]
        arrived[task] = connection
        if not connection.send(hello.line(chief, "waiting")):
            drop(connection)

    def receive(connection):
        try:
            chunk = connection.sock.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:
            drop(connection, None if connection.task else "closed before its hello")
        elif connection.task is None:
            connection.received += chunk
            if b"\n" in connection.received:
                admit(connection, connection.received.split(b"\n", 1)[0])
            elif len(connection.received) > MAX_LINE:
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

    try:
        while len(arrived) < len(expected):
            clock.tick(missing(), taken)
            for key, _ in selector.select(timeout=0.2):
                if key.fileobj is server:
                    _accept(server, selector, pending, drop)
                else:
                    receive(key.data)
            for connection in list(pending.values()):
                if time.monotonic() > connection.deadline:
                    drop(connection, f"no hello within {HELLO_SECONDS:g} s")
        settings_of = {_name(chief): hello.settings}
        settings_of.update({_name(t): arrived[t].settings for t in expected})
        differ = differences(settings_of)
        refusal = differ and f"settings differ: {differ}"
        answer = hello.line(chief, "refused", refusal) if differ else hello.line(chief, "go")
        for connection in arrived.values():
            connection.send(answer)
        if differ:
            raise HandshakeError(refusal)
        return len(expected)
    finally:
        for connection in [*pending.values(), *arrived.values()]:
            connection.sock.close()
        selector.close()
        server.close()


def _accept(server, selector, pending, drop):
    while True:
        try:
            sock, peer = server.accept()
        except OSError:  # none left (or no file descriptor: the idle ones go below)
            return
        sock.setblocking(False)
        connection = _Connection(sock, peer[:2])
        pending[sock] = connection
        selector.register(sock, selectors.EVENT_READ, connection)
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
    silent = ""
    while True:
        clock.tick(tasks[chief], silent)
        try:
            connection = socket.create_connection(split_address(address), timeout=1)
        except OSError:  # not listening yet
            time.sleep(0.5)
            continue
        with connection:
            try:
                connection.sendall(hello.line(me, "hello"))
                lines = _Lines(connection)
                answer = lines.next(HELLO_SECONDS, clock, tasks[chief], silent)
                if answer is None:
                    silent = (
                        f"; {address} accepts connections but does not answer a hello "
                        "(another program listening there?)"
                    )
                    time.sleep(0.5)
                    continue
                status = _check_answer(hello, chief, me, tasks, address, answer)
                if status == "waiting":
                    answer = lines.next(None, clock, gathering.rstrip(","))
                    if answer is None:  # the chief left: meet it again
                        continue
                    status = _check_answer(hello, chief, me, tasks, address, answer)
            except (TimeoutError, InterruptedError):  # the clock's
                raise
            except OSError:  # reset, or the answer did not come
                time.sleep(0.5)
                continue
        if status == "go":
            return


def _check_answer(hello, chief, me, tasks, address, line):
    try:
        task, status, reason, settings = hello.read(line)
    except _NotOurs as error:
        raise HandshakeError(
            f"{address} is not the chief of this run ({tasks[chief]}): {error}"
        ) from None
    if task != chief or status not in ("waiting", "go", "refused"):
        raise HandshakeError(
            f"{address} is not the chief of this run ({tasks[chief]}): it answered as "
            f"{_name(task)}, {status!r}"
        )
    if status == "refused":
        raise HandshakeError(f"{tasks[chief]} refused {_name(me)}: {reason}")
    if status == "go":  # the chief compared the settings; this checks the chief
        differ = differences({_name(chief): settings, _name(me): hello.settings})
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
