"""The start-up handshake (keras_lars.rendezvous) on both roads: foreign
listeners, stray and forged clients, idle connections, the bind address,
settings that differ, and TensorFlow's bounded start (issue 23, item 5)."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import keras_lars
from keras_lars import rendezvous
from keras_lars.rendezvous import messages
from keras_lars.tools.benchmark_allreduce import free_ports
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import fields
from keras_lars.tools.train.config import Config
from keras_lars.tools.train.process_start import shared_settings
from tests.processes import finish as processes_finish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300


def _processes(count, port):
    """JAX's task names for `count` processes, as wait_for_processes gives them."""
    tasks = {("process", i): f"process {i}" for i in range(count)}
    tasks["process", 0] = f"process 0 at localhost:{port}"
    return tasks


def _in_thread(function, *args, **kwargs):
    """Starts function(*args, **kwargs) in a thread; returns (thread, outcome):
    outcome gets the result or the error."""
    outcome = []

    def run():
        try:
            outcome.append(function(*args, **kwargs))
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _meet(me, tasks, port, seconds=60, **kwargs):
    return rendezvous.meet(me, tasks, f"localhost:{port}", seconds, **kwargs)


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


class _Listener:
    """A program that is not ours on a port: accepts, then says nothing or
    `answer` to every connection."""

    def __init__(self, port, answer=None):
        self.sock = socket.create_server(("localhost", port))
        self.answer, self.held = answer, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(connection)
            if self.answer:
                connection.sendall(self.answer)

    def close(self):
        self.sock.close()
        for connection in self.held:
            connection.close()


# --- the settings every process shares -----------------------------------------------
def test_shared_settings_are_every_setting_not_declared_per_process():
    declared = {f.name for f in fields(Config) if f.metadata["per_process"]}
    assert {"process_id", "coordinator_address", "worker_start_timeout_minutes"} <= declared
    assert "log_every_seconds" in declared and "model_dir" not in declared
    shared = shared_settings(Config(global_batch_size=64))
    assert set(shared) == {f"--{f.name}" for f in fields(Config) if f.name not in declared}
    assert shared["--global_batch_size"] == 64 and shared["--model_dir"] == "runs/digits"


def test_differences_name_each_setting_and_who_holds_which_value():
    assert rendezvous.differences({"a": {"--x": 1}, "b": {"--x": 1}}) == ""
    assert rendezvous.differences(
        {
            "worker 0": {"--x": 1, "--y": "sgd", "--z": [1, 2]},
            "worker 1": {"--x": 2, "--y": "sgd", "--z": [1, 2]},
            "worker 2": {"--x": 1, "--y": "lars"},
        }
    ) == (
        "--x: 1 on worker 0 and worker 2, 2 on worker 1; --y: sgd on worker 0 and worker 1, "
        "lars on worker 2; --z: [1, 2] on worker 0 and worker 1, (unset) on worker 2"
    )


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
    tasks, lines = _processes(3, port), []
    chief, outcome = _in_thread(_meet, ("process", 0), tasks, port, log=lines.append)
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
    assert _meet(("process", 2), tasks, port) == 2
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
    from what every hello carried (issue 41, item 1)."""
    return hashlib.sha256(messages._canonical([run, settings])).digest()


def test_a_forged_hello_with_copied_settings_is_refused_by_default(monkeypatch, tmp_path):
    """Before (issue 41, items 1 and 2): a hello keyed by the run and the
    settings it carried got "waiting" then "go", and every refusal carried
    the chief's run and all its settings."""
    monkeypatch.delenv(rendezvous.SECRET_VARIABLE, raising=False)
    (port,) = free_ports(1)
    model_dir, run = tmp_path / "run", {"coordinator": f"localhost:{port}"}
    settings = shared_settings(Config(model_dir=str(model_dir)))
    tasks, lines = _processes(2, port), []
    chief, outcome = _in_thread(
        _meet,
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
    peer = _meet(("process", 1), tasks, port, run=run, settings=settings, secret_dir=str(model_dir))
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
    tasks = _processes(2, port)
    chief, outcome = _in_thread(
        _meet, ("process", 0), tasks, port, settings=settings, log=lambda line: None
    )
    _wait_until(lambda: rendezvous.accepts_connections(f"localhost:{port}"))
    client = _Client(port)
    assert client.challenge["key"] == "variable"
    client.hello(["process", 1], b"a guess")
    refusal = client.answer()
    assert json.loads(refusal) == _refusal("a wrong proof (another run, or another secret)")
    assert b"/secret" not in refusal + client.received
    client.close()
    assert _meet(("process", 1), tasks, port, settings=settings) == 1  # the run goes on
    chief.join()
    assert outcome == [1]


def test_a_hello_answers_one_challenge_only(monkeypatch):
    """A hello copied off the wire is refused on another connection."""
    monkeypatch.setenv(rendezvous.SECRET_VARIABLE, "the run's secret")
    (port,) = free_ports(1)
    key = b"the run's secret"
    tasks, lines = _processes(3, port), []
    chief, outcome = _in_thread(_meet, ("process", 0), tasks, port, log=lines.append)
    _listening(port, lines)
    first, second = _Client(port), _Client(port)
    nonces = first.hello(["process", 1], key)
    assert json.loads(first.answer())["status"] == "waiting"
    second.hello(["process", 2], key, nonces=nonces)  # first's challenge
    assert json.loads(second.answer()) == _refusal("a wrong proof (another run, or another secret)")
    first.send(messages._Hello(None, {}, None).signed(key, nonces, status="settings", settings={}))
    assert _meet(("process", 2), tasks, port) == 2  # the real process 2 still gets in
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
    tasks, lines = _processes(2, port), []
    chief, outcome = _in_thread(
        _meet, ("process", 0), tasks, port, secret_dir=where, log=lines.append
    )
    assert _meet(("process", 1), tasks, port, secret_dir=where) == 1
    chief.join()
    assert outcome == [1]
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


def test_a_task_without_the_chiefs_kind_of_secret_stops_with_one_line(monkeypatch):
    (port,) = free_ports(1)
    tasks = _processes(2, port)
    lines = []
    chief, outcome = _in_thread(_meet, ("process", 0), tasks, port, log=lines.append)
    _wait_until(lambda: lines)  # its warning: the chief has chosen its key
    monkeypatch.setenv(rendezvous.SECRET_VARIABLE, "only this task's")
    with pytest.raises(rendezvous.HandshakeError) as error:
        _meet(("process", 1), tasks, port)
    assert str(error.value) == (
        f"process 0 at localhost:{port} proves with no secret, this task with "
        "$KERAS_LARS_RUN_SECRET: set $KERAS_LARS_RUN_SECRET on every task or on none"
    )
    monkeypatch.delenv(rendezvous.SECRET_VARIABLE)
    assert _meet(("process", 1), tasks, port) == 1  # as the chief, without a secret
    chief.join()
    assert outcome == [1]


def test_a_refused_client_hears_why():
    (port,) = free_ports(1)
    tasks = _processes(2, port)
    chief, outcome = _in_thread(_meet, ("process", 0), tasks, port, log=lambda line: None)
    with pytest.raises(
        rendezvous.HandshakeError,
        match=rf"^process 0 at localhost:{port} refused process 5: process 5 is not a task "
        r"of this run \(process 0, process 1\)$",
    ):
        _meet(("process", 5), {**tasks, ("process", 5): "process 5"}, port)
    assert _meet(("process", 1), tasks, port) == 1
    chief.join()
    assert outcome == [1]


def test_idle_connections_do_not_keep_the_peer_out():
    """The old rendezvous served one connection at a time, waiting 5 s on
    each: three idle ones kept the real peer out for 15 s."""
    (port,) = free_ports(1)
    tasks, lines = _processes(2, port), []
    chief, outcome = _in_thread(_meet, ("process", 0), tasks, port, log=lines.append)
    _listening(port, lines)
    idle = [_client(port, b"") for _ in range(3)]
    assert _meet(("process", 1), tasks, port) == 1
    chief.join()
    assert outcome == [1]  # in before the idle ones were even dropped
    assert [line.split(" from ")[0] for line in lines] == ["admitted process 1"]
    for sock in idle:
        sock.close()


def test_a_connection_without_a_hello_is_dropped_after_its_time(monkeypatch):
    monkeypatch.setattr(messages, "HELLO_SECONDS", 0.5)
    (port,) = free_ports(1)
    tasks, lines = _processes(2, port), []
    chief, outcome = _in_thread(_meet, ("process", 0), tasks, port, log=lines.append)
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
    assert _meet(("process", 1), tasks, port) == 1
    chief.join()
    assert outcome == [1]


def test_the_chief_listens_on_its_own_address_only():
    """Not on every interface: 127.0.0.2 (loopback too, on Linux) stays free."""
    (port,) = free_ports(1)
    tasks, address = _processes(2, port), f"127.0.0.1:{port}"
    chief, outcome = _in_thread(rendezvous.meet, ("process", 0), tasks, address, 60)
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


# --- processes that disagree ---------------------------------------------------------
def _jax_config(port, **settings):
    return Config(
        backend="jax",
        distribution="data_parallel",
        coordinator_address=f"localhost:{port}",
        worker_start_timeout_minutes=1,
        **settings,
    )


@pytest.mark.parametrize(
    "settings, differ",
    [
        (
            [{"global_batch_size": 256}, {"global_batch_size": 512}],
            "--global_batch_size: 256 on process 0, 512 on process 1",
        ),
        (
            [{"num_processes": 2}, {"num_processes": 3}],
            "--num_processes: 2 on process 0, 3 on process 1",
        ),
    ],
)
def test_processes_that_disagree_stop_with_one_line_naming_the_settings(settings, differ):
    """Before: different batch sizes hung until killed; 2 against 3
    processes was accepted."""
    runtime_jax = pytest.importorskip("keras_lars.tools.train.runtime_jax")
    (port,) = free_ports(1)
    chief = _jax_config(port, process_id=0, **{"num_processes": 2, **settings[0]})
    peer = _jax_config(port, process_id=1, **{"num_processes": 2, **settings[1]})
    thread, outcome = _in_thread(runtime_jax.meet_processes, chief)
    with pytest.raises(ConfigError) as refused:
        runtime_jax.meet_processes(peer)
    thread.join()
    assert str(refused.value) == (
        f"--num_processes={peer.num_processes} --process_id=1: process 0 at localhost:{port} "
        f"refused process 1: settings differ: {differ}"
    )
    assert isinstance(outcome[0], ConfigError)
    assert str(outcome[0]) == f"--num_processes=2 --process_id=0: settings differ: {differ}"


def test_a_process_beyond_the_chiefs_count_is_refused():
    runtime_jax = pytest.importorskip("keras_lars.tools.train.runtime_jax")
    (port,) = free_ports(1)
    chief = _jax_config(port, num_processes=2, process_id=0)
    thread, _ = _in_thread(runtime_jax.meet_processes, chief)
    with pytest.raises(ConfigError) as refused:
        runtime_jax.meet_processes(_jax_config(port, num_processes=3, process_id=2))
    assert str(refused.value) == (
        f"--num_processes=3 --process_id=2: process 0 at localhost:{port} refused process 2: "
        "process 2 is not a task of this run (process 0, process 1)"
    )
    runtime_jax.meet_processes(_jax_config(port, num_processes=2, process_id=1))
    thread.join()


def test_a_coordinator_address_that_cannot_be_held_is_not_blamed_on_the_timeout():
    """Before (issue 41, item 6): "cannot join the other processes within
    --worker_start_timeout_minutes=1: ..." for causes not about time."""
    runtime_jax = pytest.importorskip("keras_lars.tools.train.runtime_jax")
    (port,) = free_ports(1)
    with socket.create_server(("localhost", port)):
        with pytest.raises(ConfigError) as taken:
            runtime_jax.meet_processes(_jax_config(port, num_processes=2, process_id=0))
    assert str(taken.value).startswith(
        f"--coordinator_address=localhost:{port} --num_processes=2 --process_id=0: cannot "
        f"listen on this task's address localhost:{port}: "
    )
    with pytest.raises(ConfigError) as malformed:
        runtime_jax.meet_processes(
            Config(backend="jax", coordinator_address="localhost:abc", num_processes=2)
        )
    assert str(malformed.value) == (
        "--coordinator_address=localhost:abc --num_processes=2 --process_id=0: "
        "'localhost:abc' is not host:port"
    )


# --- the TensorFlow road: foreign listeners ------------------------------------------
def _tf_config(monkeypatch, ports, index):
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
    )


def test_a_silent_program_on_the_chiefs_address_is_named(monkeypatch):
    """Before, accepting a connection counted as "started": the wait passed
    and TensorFlow's start hung."""
    monkeypatch.setattr(messages, "HELLO_SECONDS", 0.5)
    ports = free_ports(2)
    _tf_config(monkeypatch, ports, 1)
    listener = _Listener(ports[0])
    try:
        with pytest.raises(TimeoutError) as late:
            keras_lars.distribute.wait_for_workers(2)
    finally:
        listener.close()
    assert str(late.value) == (
        f"worker 0 (localhost:{ports[0]}) did not start within 2 s; localhost:{ports[0]} "
        "accepts connections but does not answer a hello (another program listening there?)"
    )


def test_a_program_answering_garbage_on_the_chiefs_address_is_named_at_once(monkeypatch):
    ports = free_ports(2)
    _tf_config(monkeypatch, ports, 1)
    listener = _Listener(ports[0], answer=b"HTTP/1.0 400 Bad Request\r\n\r\n")
    try:
        with pytest.raises(rendezvous.HandshakeError) as foreign:
            keras_lars.distribute.wait_for_workers(60)
    finally:
        listener.close()
    assert str(foreign.value) == (
        f"localhost:{ports[0]} is not the chief of this run (worker 0 (localhost:{ports[0]})): "
        "not a keras_lars hello: b'HTTP/1.0 400 Bad Request\\r'"
    )


def test_the_chief_names_a_program_on_a_missing_workers_address(monkeypatch):
    ports = free_ports(2)
    _tf_config(monkeypatch, ports, 0)
    listener = _Listener(ports[1])
    try:
        with pytest.raises(TimeoutError) as late:
            keras_lars.distribute.wait_for_workers(2, log=lambda line: None)
    finally:
        listener.close()
    assert str(late.value) == (
        f"1 of the 1 other tasks of TF_CONFIG: worker 1 (localhost:{ports[1]}) did not start "
        f"within 2 s; something that is not this run's task accepts connections at "
        f"localhost:{ports[1]}"
    )


def test_a_chief_of_another_cluster_is_not_joined(monkeypatch):
    ports = free_ports(3)
    other = {"worker": [f"localhost:{ports[0]}", f"localhost:{ports[2]}"]}
    tasks = {("worker", 0): "worker 0", ("worker", 1): "worker 1"}
    chief, outcome = _in_thread(
        _meet, ("worker", 0), tasks, ports[0], run={"cluster": other}, log=lambda line: None
    )
    _tf_config(monkeypatch, ports[:2], 1)
    with pytest.raises(
        rendezvous.HandshakeError,
        match=rf"^worker 0 \(localhost:{ports[0]}\) refused worker 1: a wrong proof \(another "
        r"run, or another secret\)$",
    ):
        keras_lars.distribute.wait_for_workers(60)
    assert _meet(("worker", 1), tasks, ports[0], run={"cluster": other}) == 1  # its own worker
    chief.join()
    assert outcome == [1]


# --- the tool: TensorFlow's start, bounded -------------------------------------------
def _tool_worker(ports, index, *flags, **options):
    """The tool as worker `index` of `ports` (options: more of Popen's arguments)."""
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="",
        TF_CONFIG=json.dumps(
            {
                "cluster": {"worker": [f"localhost:{port}" for port in ports]},
                "task": {"type": "worker", "index": index},
            }
        ),
    )
    command = [sys.executable, "-m", "keras_lars.tools.train", "--strategy=multi_worker"]
    return subprocess.Popen(
        [*command, *flags],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **options,
    )


def _finish(process):
    ((code, _, errors),) = processes_finish([process], TIMEOUT)
    return code, errors


def test_the_tool_names_a_program_on_a_peers_address(tmp_path):
    ports = free_ports(2)
    listener = _Listener(ports[1])
    try:
        worker = _tool_worker(
            ports, 0, f"--model_dir={tmp_path / 'run'}", "--worker_start_timeout_minutes=0.1"
        )
        status, errors = _finish(worker)
    finally:
        listener.close()
    assert status == 1, errors[-3000:]
    assert errors.strip().splitlines()[-1] == (
        f"error: --worker_start_timeout_minutes=0.1: 1 of the 1 other tasks of TF_CONFIG: "
        f"worker 1 (localhost:{ports[1]}) did not start within 6 s; something that is not "
        f"this run's task accepts connections at localhost:{ports[1]}"
    )
    assert not (tmp_path / "run").exists()


def _peer_that_never_starts_tensorflow(monkeypatch, ports, model_dir):
    """Worker 1 of `ports`: meets worker 0 (the tool) with the tool's
    settings, then never starts TensorFlow's server."""
    _tf_config(monkeypatch, ports, 1)
    config = Config(strategy="multi_worker", model_dir=str(model_dir))
    return keras_lars.distribute.wait_for_workers(
        TIMEOUT, settings=shared_settings(config), secret_dir=str(model_dir)
    )


# How each stop reaches the tool: SIGINT to it (as its handler reports it),
# SIGTERM to its process group (as SLURM, systemd or `kill -TERM -PGID` send
# it; TensorFlow's preemption notifier holds the tool's own SIGTERM).
STOPS = {"SIGINT": os.kill, "SIGTERM": os.killpg}


@pytest.mark.parametrize("stop", [None, "SIGINT", "SIGTERM"])
def test_tensorflows_start_is_bounded_and_stoppable(stop, monkeypatch, tmp_path):
    """Before, the tool hung in TensorFlow's start past
    --worker_start_timeout_minutes, deaf to signals; then deaf to SIGTERM."""
    ports, model_dir = free_ports(2), tmp_path / "run"
    worker = _tool_worker(
        ports,
        0,
        f"--model_dir={model_dir}",
        f"--worker_start_timeout_minutes={0.2 if stop is None else 5}",
        start_new_session=True,  # its own process group
    )
    try:
        assert _peer_that_never_starts_tensorflow(monkeypatch, ports, model_dir) == 1
        if stop:
            line = "TensorFlow starts the workers (at most 300 s)\n"
            while worker.stdout.readline() not in (line, ""):  # its start began
                pass
            time.sleep(2)  # well inside TensorFlow's start, its notifier listening
            STOPS[stop](worker.pid, getattr(signal, stop))
        status, errors = _finish(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
    last = errors.strip().splitlines()[-1]
    assert status == -signal.SIGKILL, errors[-3000:]
    if stop:
        assert last == (
            f"preempted: stopped by {stop} while TensorFlow started the workers; nothing was "
            "trained; run the same command to start"
        ), errors[-3000:]
    else:
        assert last == (
            "error: --worker_start_timeout_minutes=0.2: TensorFlow's start of the workers did "
            "not finish within 12 s (a worker stopped after meeting the others, or another "
            "program took its port?); nothing was trained"
        ), errors[-3000:]
    assert not (model_dir / "checkpoints").exists()


@pytest.mark.parametrize("stop", [None, "SIGTERM"])
def test_jax_distributeds_start_is_bounded(stop, tmp_path):
    """Before, process 0 aborted in jax.distributed.initialize at its own
    deadline (exit 134, a C++ fatal log) when its peer met it, then never
    started; then it was deaf to SIGTERM there."""
    pytest.importorskip("jax")
    (port,) = free_ports(1)
    flags = {
        "backend": "jax",
        "distribution": "none",  # refused only after the start, on every Keras
        "num_processes": 2,
        "coordinator_address": f"localhost:{port}",
        "model_dir": str(tmp_path / "run"),
    }
    command = [sys.executable, "-m", "keras_lars.tools.train", "--process_id=0"]
    command += [f"--{name}={value}" for name, value in flags.items()]
    process = subprocess.Popen(
        [*command, f"--worker_start_timeout_minutes={0.2 if stop is None else 5}"],
        cwd=ROOT,
        env=dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group
    )
    try:
        settings = shared_settings(Config(process_id=1, **flags))
        peer = _meet(
            ("process", 1),
            _processes(2, port),
            port,
            run={"coordinator": f"localhost:{port}"},
            settings=settings,
            secret_dir=flags["model_dir"],
        )
        assert peer == 1
        if stop:
            line = "jax.distributed starts the processes (at most 300 s)\n"
            while process.stdout.readline() not in (line, ""):  # its start began
                pass
            time.sleep(2)  # inside jax.distributed.initialize
            STOPS[stop](process.pid, getattr(signal, stop))
        status, errors = _finish(process)
    finally:
        if process.poll() is None:
            process.kill()
    # jax.distributed leaves SIGTERM's default action in place while it starts.
    ends = (-signal.SIGKILL, -signal.SIGTERM) if stop else (-signal.SIGKILL,)
    assert status in ends, errors[-3000:]
    assert errors.strip().splitlines()[-1] == (
        f"preempted: stopped by {stop} while jax.distributed started the processes; nothing "
        "was trained; run the same command to start"
        if stop
        else "error: --worker_start_timeout_minutes=0.2: jax.distributed's start of the "
        "processes did not finish within 12 s (a process stopped after meeting the others, or "
        "another program took its port?); nothing was trained"
    ), errors[-3000:]
