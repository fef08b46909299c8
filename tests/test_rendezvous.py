"""The start-up handshake (keras_lars.rendezvous): who gets in. Stray and
forged clients, a hello copied off the wire, refusals that hold nothing of the
run, a start without a secret of its own, a task with another kind of secret
than the chief's, idle and silent connections, and the address the chief
listens on. Processes that disagree are
tests/test_disagreeing_processes.py; foreign listeners and the tool's bounded
start, tests/test_worker_start.py."""

import hashlib
import json
import socket
import time

import pytest
import tensorflow as tf

from keras_lars import rendezvous
from keras_lars.rendezvous import messages
from keras_lars.tools.benchmark_allreduce import free_ports
from keras_lars.tools.train.config import Config
from keras_lars.tools.train.process_start import shared_settings
from tests.handshake import in_thread
from tests.handshake import jax_tasks
from tests.handshake import meet


def _wait_until(condition, seconds=60):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def _listening(port, lines):
    """Waits until the chief on `port` (logging to `lines`) accepts
    connections; forgets the line about that probe, and the warning of a
    start without a secret."""
    _wait_until(lambda: rendezvous.accepts_connections(f"localhost:{port}"))
    _wait_until(lambda: lines and lines[-1].endswith(": closed before its hello"))
    lines.pop()
    lines[:] = [line for line in lines if not line.startswith("warning: this start")]


# --- who gets in ---------------------------------------------------------------------
class _Client:
    """A client of the chief on `port`: reads its challenge, then sends what
    it is told."""

    def __init__(self, port):
        self.sock = socket.create_connection(("localhost", port))
        self.lines = self.sock.makefile("rb")
        self.received = self.lines.readline()
        self.challenge = json.loads(self.received)

    def hello(self, task, key, run=None, nonces=None, **changes):
        """Sends a hello of `task` signed with `key` (for `nonces`, else this
        connection's), with `changes` made after signing."""
        nonces = nonces or [self.challenge["challenge"], "e" * 32]
        line = messages._Hello(run, {}, None).signed(
            key, nonces, task=list(task), status="hello", nonce=nonces[1]
        )
        message = {**json.loads(line), **changes}
        self.send(json.dumps(message).encode() + b"\n")
        return nonces

    def send(self, data):
        self.sock.sendall(data)

    def answer(self):
        return self.lines.readline()

    def close(self):
        self.lines.close()
        self.sock.close()


def _client(port, data):
    """A client that connects, sends `data` and stays connected."""
    sock = socket.create_connection(("localhost", port))
    sock.sendall(data)
    return sock


def _refusal(reason):
    """The whole of a refusal before the proof: the reason, nothing of the run."""
    return {"protocol": rendezvous.PROTOCOL, "status": "refused", "reason": reason}


def test_stray_and_forged_clients_are_ignored_and_the_real_peer_gets_in(monkeypatch):
    """The old rendezvous counted int(recv(16)) of any client as a process:
    b"1" released process 0 without its peer."""
    monkeypatch.setenv(rendezvous.SECRET_VARIABLE, "the run's secret")
    key = b"the run's secret"
    (port,) = free_ports(1)
    tasks, lines = jax_tasks(3, port), []
    chief, outcome = in_thread(meet, ("process", 0), tasks, port, log=lines.append)
    _listening(port, lines)
    strays = [
        b"1\n",
        b"7\n",
        b"-1\n",
        "\u0661\n".encode(),  # ARABIC-INDIC DIGIT ONE: int() reads it as 1
        b"\xff\xfe\n",
    ]
    clients = [_Client(port) for _ in range(11)]
    for client, data in zip(clients, strays):
        client.send(data)
    clients[5].hello(["process", 1], b"another secret")
    clients[6].hello(["process", 7], key)
    clients[7].hello(["process", -1], key)
    clients[8].hello(["process", True], key)
    clients[9].hello(["process", 1], key, status="go")
    clients[10].hello(["process", 1], key, protocol="keras_lars.rendezvous/1")
    _wait_until(lambda: len(lines) == 11)
    assert chief.is_alive(), outcome  # nothing counted
    first = _Client(port)  # process 1, with the right proof: admitted
    nonces = first.hello(["process", 1], key)
    assert json.loads(first.answer())["status"] == "waiting"
    first.send(messages._Hello(None, {}, None).signed(key, nonces, status="settings", settings={}))
    duplicate = _Client(port)
    duplicate.hello(["process", 1], key)  # process 1 again
    _wait_until(lambda: len(lines) == 13)
    assert chief.is_alive()  # still waiting for process 2
    assert meet(("process", 2), tasks, port) == 2
    chief.join()
    assert outcome == [2] and json.loads(first.answer())["status"] == "go"
    ignored = [line.split(": ", 1)[1] for line in lines if line.startswith("ignored")]
    assert ignored[:5] == [
        "not a keras_lars hello: b'1'",
        "not a keras_lars hello: b'7'",
        "not a keras_lars hello: b'-1'",
        "not a keras_lars hello: b'\\xd9\\xa1'",
        "not a keras_lars hello: b'\\xff\\xfe'",
    ]
    assert ignored[5] == "a wrong proof (another run, or another secret)"
    known = "(process 0, process 1, process 2)"
    assert ignored[6:10] == [
        f"process 7 is not a task of this run {known}",  # holders of the secret hear more
        f"process -1 is not a task of this run {known}",
        "a malformed hello",  # True is no index
        "a malformed hello",  # says "go", not "hello"
    ]
    assert ignored[10] == "speaks 'keras_lars.rendezvous/1', not keras_lars.rendezvous/2"
    assert ignored[11] == "process 1 has already arrived"
    assert all(
        line.startswith("ignored a connection from 127.0.0.1:")
        for line in lines
        if "ignored" in line
    )
    admitted = [line for line in lines if not line.startswith("ignored")]
    assert [line.rsplit(":", 1)[0] for line in admitted] == [
        "admitted process 1 from 127.0.0.1",
        "admitted process 2 from 127.0.0.1",
    ]
    for client in [*clients, first, duplicate]:
        client.close()


def _old_default_key(run, settings):
    """The key of keras_lars.rendezvous/1 without $KERAS_LARS_RUN_SECRET:
    from what every hello carried."""
    return hashlib.sha256(messages._canonical([run, settings])).digest()


def test_a_forged_hello_with_copied_settings_is_refused_by_default(monkeypatch, tmp_path):
    """Before: a hello keyed by the run and the
    settings it carried got "waiting" then "go", and every refusal carried
    the chief's run and all its settings."""
    monkeypatch.delenv(rendezvous.SECRET_VARIABLE, raising=False)
    (port,) = free_ports(1)
    model_dir, run = tmp_path / "run", {"coordinator": f"localhost:{port}"}
    settings = shared_settings(Config(model_dir=str(model_dir)))
    tasks, lines = jax_tasks(2, port), []
    chief, outcome = in_thread(
        meet,
        ("process", 0),
        tasks,
        port,
        run=run,
        settings=settings,
        secret_dir=str(model_dir),
        log=lines.append,
    )
    _listening(port, lines)
    (secret,) = model_dir.glob(".keras_lars_start_*")
    assert secret.stat().st_mode & 0o777 == 0o600  # the owner's alone
    forger = _Client(port)
    assert set(forger.challenge) == {"protocol", "challenge", "key"}
    assert forger.challenge["key"] == "file:" + secret.name.rpartition("_")[2]
    forger.hello(["process", 1], _old_default_key(run, settings), run=run)
    refusal = forger.answer()
    assert json.loads(refusal) == _refusal("a wrong proof (another run, or another secret)")
    for value in (str(model_dir), "global_batch_size", str(port)):
        assert value.encode() not in refusal and value.encode() not in forger.received
    forger.close()
    assert chief.is_alive()
    peer = meet(("process", 1), tasks, port, run=run, settings=settings, secret_dir=str(model_dir))
    chief.join()
    assert peer == outcome[0] == 1
    assert lines[0].startswith("ignored a connection from 127.0.0.1:") and lines[0].endswith(
        ": a wrong proof (another run, or another secret)"
    )
    assert lines[1].startswith("admitted process 1 from 127.0.0.1:") and len(lines) == 2
    assert not model_dir.exists()  # the secret gone, and the directory made for it


def test_a_refusal_with_the_secret_set_holds_nothing_of_the_run(monkeypatch):
    monkeypatch.setenv(rendezvous.SECRET_VARIABLE, "the run's secret")
    (port,) = free_ports(1)
    settings = {"--data_dir": "/secret/data", "--model_dir": "/secret/run"}
    tasks = jax_tasks(2, port)
    chief, outcome = in_thread(
        meet, ("process", 0), tasks, port, settings=settings, log=lambda line: None
    )
    _wait_until(lambda: rendezvous.accepts_connections(f"localhost:{port}"))
    client = _Client(port)
    assert client.challenge["key"] == "variable"
    client.hello(["process", 1], b"a guess")
    refusal = client.answer()
    assert json.loads(refusal) == _refusal("a wrong proof (another run, or another secret)")
    assert b"/secret" not in refusal + client.received
    client.close()
    assert meet(("process", 1), tasks, port, settings=settings) == 1  # the run goes on
    chief.join()
    assert outcome == [1]


def test_a_hello_answers_one_challenge_only(monkeypatch):
    """A hello copied off the wire is refused on another connection."""
    monkeypatch.setenv(rendezvous.SECRET_VARIABLE, "the run's secret")
    (port,) = free_ports(1)
    key = b"the run's secret"
    tasks, lines = jax_tasks(3, port), []
    chief, outcome = in_thread(meet, ("process", 0), tasks, port, log=lines.append)
    _listening(port, lines)
    first, second = _Client(port), _Client(port)
    nonces = first.hello(["process", 1], key)
    assert json.loads(first.answer())["status"] == "waiting"
    second.hello(["process", 2], key, nonces=nonces)  # first's challenge
    assert json.loads(second.answer()) == _refusal("a wrong proof (another run, or another secret)")
    first.send(messages._Hello(None, {}, None).signed(key, nonces, status="settings", settings={}))
    assert meet(("process", 2), tasks, port) == 2  # the real process 2 still gets in
    chief.join()
    assert outcome == [2] and json.loads(first.answer())["status"] == "go"
    for client in (first, second):
        client.close()


@pytest.mark.parametrize("where", [None, "ram://keras_lars_test/run"])
def test_a_start_without_a_secret_of_its_own_says_so_in_one_line(monkeypatch, where):
    """No $KERAS_LARS_RUN_SECRET and no shared directory; or one on a bucket
    (ram://, a file system of tf.io.gfile as gs:// is, in this process)."""
    monkeypatch.delenv(rendezvous.SECRET_VARIABLE, raising=False)
    (port,) = free_ports(1)
    tasks, lines = jax_tasks(2, port), []
    left = f"{where}/{rendezvous.SECRET_PREFIX}{'c' * 16}"  # by a killed chief: no locks there
    if where:
        tf.io.gfile.makedirs(where)
        with tf.io.gfile.GFile(left, "wb") as f:
            f.write(b"0" * 64)
    chief, outcome = in_thread(
        meet, ("process", 0), tasks, port, secret_dir=where, log=lines.append
    )
    assert meet(("process", 1), tasks, port, secret_dir=where) == 1
    chief.join()
    assert outcome == [1]
    if where:
        assert lines.pop(0) == (
            f"warning: {left} is the secret file of another start (under way, or left by a "
            "chief that was killed); remove it if no other start uses this directory"
        )
        tf.io.gfile.remove(left)
    if where is None:
        assert lines[0] == (
            "warning: this start is not authenticated (no $KERAS_LARS_RUN_SECRET and no "
            f"directory shared by the tasks): whoever reaches localhost:{port} can take a "
            "task's place in it; set $KERAS_LARS_RUN_SECRET (the same on every task)"
        )
    else:
        assert lines[0] == (
            f"warning: this start's secret lies in {where}, which has no owner-only "
            "permissions: whoever can read it can take a task's place in the start; set "
            "$KERAS_LARS_RUN_SECRET (the same on every task) for a secret of the run alone"
        )
    assert [line.split(" from ")[0] for line in lines[1:]] == ["admitted process 1"]


def test_a_secret_file_left_by_a_killed_chief_is_removed_by_the_next_start(monkeypatch, tmp_path):
    """A chief killed with SIGKILL leaves its secret file, unlocked (the kernel
    releases a dead process's locks); a live start's file is locked and kept."""
    import fcntl
    import os

    monkeypatch.delenv(rendezvous.SECRET_VARIABLE, raising=False)
    stale, live = (tmp_path / f"{rendezvous.SECRET_PREFIX}{c * 16}" for c in "ab")
    for path in (stale, live):
        path.write_bytes(b"0" * 64)
        path.chmod(0o600)
    other = tmp_path / f"{rendezvous.SECRET_PREFIX}not_an_id"  # not a secret's name
    other.write_text("kept")
    held = os.open(live, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    (port,) = free_ports(1)
    tasks, lines = jax_tasks(2, port), []
    chief, outcome = in_thread(
        meet, ("process", 0), tasks, port, secret_dir=str(tmp_path), log=lines.append
    )
    try:
        assert meet(("process", 1), tasks, port, secret_dir=str(tmp_path)) == 1
        chief.join()
    finally:
        os.close(held)
    assert outcome == [1]
    assert lines[0] == (
        f"removed {stale}, the secret file of an earlier start whose chief was killed"
    )
    assert [line.split(" from ")[0] for line in lines[1:]] == ["admitted process 1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, other.name]


@pytest.mark.parametrize(
    "value, problem",
    [
        (" ", "begins or ends with whitespace"),
        ("the run's secret\n", "begins or ends with whitespace"),
        ("short secret", "has 12 characters, fewer than 16"),
        ("the run's secret \udcff", "is not UTF-8 text"),  # the byte 0xff in the environment
    ],
    ids=["space", "newline", "short", "not_utf8"],
)
def test_a_secret_variable_that_is_not_one_is_one_line_naming_it(monkeypatch, value, problem):
    monkeypatch.setenv(rendezvous.SECRET_VARIABLE, value)
    (port,) = free_ports(1)
    for me in (("process", 0), ("process", 1)):  # the chief, and a task
        with pytest.raises(ValueError) as raised:
            meet(me, jax_tasks(2, port), port, seconds=5)
        assert str(raised.value) == (
            f"$KERAS_LARS_RUN_SECRET {problem}: set it to the same UTF-8 text of at least 16 "
            "characters, without whitespace at its ends, on every task (e.g. the output of "
            "`openssl rand -hex 32`)"
        )
    assert not rendezvous.accepts_connections(f"localhost:{port}")  # refused before listening


def test_a_task_without_the_chiefs_kind_of_secret_stops_with_one_line(monkeypatch):
    (port,) = free_ports(1)
    tasks = jax_tasks(2, port)
    lines = []
    chief, outcome = in_thread(meet, ("process", 0), tasks, port, log=lines.append)
    _wait_until(lambda: lines)  # its warning: the chief has chosen its key
    monkeypatch.setenv(rendezvous.SECRET_VARIABLE, "only this task's")
    with pytest.raises(rendezvous.HandshakeError) as error:
        meet(("process", 1), tasks, port)
    assert str(error.value) == (
        f"process 0 at localhost:{port} proves with no secret, this task with "
        "$KERAS_LARS_RUN_SECRET: set $KERAS_LARS_RUN_SECRET on every task or on none"
    )
    monkeypatch.delenv(rendezvous.SECRET_VARIABLE)
    assert meet(("process", 1), tasks, port) == 1  # as the chief, without a secret
    chief.join()
    assert outcome == [1]


def test_a_refused_client_hears_why():
    (port,) = free_ports(1)
    tasks = jax_tasks(2, port)
    chief, outcome = in_thread(meet, ("process", 0), tasks, port, log=lambda line: None)
    with pytest.raises(
        rendezvous.HandshakeError,
        match=rf"^process 0 at localhost:{port} refused process 5: process 5 is not a task "
        r"of this run \(process 0, process 1\)$",
    ):
        meet(("process", 5), {**tasks, ("process", 5): "process 5"}, port)
    assert meet(("process", 1), tasks, port) == 1
    chief.join()
    assert outcome == [1]


def test_idle_connections_do_not_keep_the_peer_out():
    """The old rendezvous served one connection at a time, waiting 5 s on
    each: three idle ones kept the real peer out for 15 s."""
    (port,) = free_ports(1)
    tasks, lines = jax_tasks(2, port), []
    chief, outcome = in_thread(meet, ("process", 0), tasks, port, log=lines.append)
    _listening(port, lines)
    idle = [_client(port, b"") for _ in range(3)]
    assert meet(("process", 1), tasks, port) == 1
    chief.join()
    assert outcome == [1]  # in before the idle ones were even dropped
    assert [line.split(" from ")[0] for line in lines] == ["admitted process 1"]
    for sock in idle:
        sock.close()


def test_a_connection_without_a_hello_is_dropped_after_its_time(monkeypatch):
    monkeypatch.setattr(messages, "HELLO_SECONDS", 0.5)
    (port,) = free_ports(1)
    tasks, lines = jax_tasks(2, port), []
    chief, outcome = in_thread(meet, ("process", 0), tasks, port, log=lines.append)
    _listening(port, lines)
    idle, endless = _client(port, b""), _client(port, b"x" * (rendezvous.MAX_LINE + 10))
    _wait_until(lambda: len(lines) >= 2)
    assert sorted(line.split(": ", 1)[1] for line in lines) == [
        "no hello within 0.5 s",
        f"sent more than {rendezvous.MAX_LINE} bytes without a hello",
    ]
    for sock in (idle, endless):  # the challenge, then closed by the chief
        assert json.loads(sock.makefile("rb").readline())["protocol"] == rendezvous.PROTOCOL
        assert sock.recv(10) == b""
    assert meet(("process", 1), tasks, port) == 1
    chief.join()
    assert outcome == [1]


def test_the_chief_listens_on_its_own_address_only():
    """Not on every interface: 127.0.0.2 (loopback too, on Linux) stays free."""
    (port,) = free_ports(1)
    tasks, address = jax_tasks(2, port), f"127.0.0.1:{port}"
    chief, outcome = in_thread(rendezvous.meet, ("process", 0), tasks, address, 60)
    _wait_until(lambda: rendezvous.accepts_connections(address))
    with socket.socket() as other:
        other.bind(("127.0.0.2", port))  # OSError (in use) if the chief held 0.0.0.0
    assert rendezvous.meet(("process", 1), tasks, address, 60) == 1
    chief.join()
    assert outcome == [1]


@pytest.mark.parametrize(
    "host, resolved, bound",
    [
        ("127.0.0.1", None, "127.0.0.1"),  # an address: itself
        ("localhost", ["127.0.0.1", "::1"], "localhost"),
        ("node7", ["10.1.2.7"], "node7"),
        ("node7", ["127.0.1.1"], ""),  # Debian's own name: every interface
        ("node7", ["127.0.1.1", "10.1.2.7"], "node7"),
    ],
)
def test_a_name_bound_to_loopback_only_listens_everywhere(monkeypatch, host, resolved, bound):
    def getaddrinfo(name, port):
        assert name == host
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in resolved]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert rendezvous.listen_host(host) == bound
