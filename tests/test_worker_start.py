"""A worker's start past the handshake (keras_lars.rendezvous): on the
TensorFlow road (wait_for_workers) a program that is not ours on the chief's
or a missing worker's address is named, and a chief of another cluster is not
joined; the training tool names a program on a peer's address, and TensorFlow's
and jax.distributed's start of the workers is bounded by
--worker_start_timeout_minutes and stoppable by SIGINT and SIGTERM, as is
its wait for a peer that never comes. Who gets in is tests/test_rendezvous.py."""

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
from keras_lars.tools.train import EXIT_PREEMPTED
from keras_lars.tools.train.config import Config
from keras_lars.tools.train.process_start import shared_settings
from tests.handshake import in_thread
from tests.handshake import jax_tasks
from tests.handshake import meet
from tests.launcher_tasks import start
from tests.processes import ROOT
from tests.processes import finish as processes_finish

TIMEOUT = 300


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
    chief, outcome = in_thread(
        meet, ("worker", 0), tasks, ports[0], run={"cluster": other}, log=lambda line: None
    )
    _tf_config(monkeypatch, ports[:2], 1)
    with pytest.raises(
        rendezvous.HandshakeError,
        match=rf"^worker 0 \(localhost:{ports[0]}\) refused worker 1: a wrong proof \(another "
        r"run, or another secret\)$",
    ):
        keras_lars.distribute.wait_for_workers(60)
    assert meet(("worker", 1), tasks, ports[0], run={"cluster": other}) == 1  # its own worker
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
    return start(["--strategy=multi_worker", *flags], env, stderr=subprocess.PIPE, **options)


def _finish(process):
    ((code, _, errors),) = processes_finish([process], TIMEOUT)
    return code, errors


def test_the_tool_names_a_program_on_a_peers_address(tmp_path):
    ports = free_ports(2)
    listener = _Listener(ports[1])
    try:
        worker = _tool_worker(
            ports, 0, f"--model_dir={tmp_path / 'run'}", "--worker_start_timeout_minutes=0.02"
        )
        status, errors = _finish(worker)
    finally:
        listener.close()
    assert status == 1, errors[-3000:]
    assert errors.strip().splitlines()[-1] == (
        f"error: --worker_start_timeout_minutes=0.02: 1 of the 1 other tasks of TF_CONFIG: "
        f"worker 1 (localhost:{ports[1]}) did not start within 1.2 s; something that is not "
        f"this run's task accepts connections at localhost:{ports[1]}"
    )
    assert not (tmp_path / "run").exists()


def test_a_worker_whose_peer_never_starts_says_so_and_times_out(tmp_path):
    worker = _tool_worker(
        free_ports(2), 0, f"--model_dir={tmp_path / 'run'}", "--worker_start_timeout_minutes=0.01"
    )
    status, errors = _finish(worker)
    assert status == 1, errors[-3000:]
    last = errors.strip().splitlines()[-1]
    assert last.startswith("error: --worker_start_timeout_minutes=0.01: 1 of the 1 other tasks")
    assert "worker 1 (localhost:" in last and "did not start within 0.6 s" in last
    assert not (tmp_path / "run").exists()  # nothing was written


def test_sigterm_stops_a_worker_waiting_for_its_peer(tmp_path):
    ports = free_ports(2)
    worker = _tool_worker(ports, 0, f"--model_dir={tmp_path / 'run'}")
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and worker.poll() is None:  # listening on its own port
        try:
            socket.create_connection(("localhost", ports[0]), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    worker.send_signal(signal.SIGTERM)
    status, errors = _finish(worker)
    assert status == EXIT_PREEMPTED, errors[-3000:]
    assert "SIGTERM received: stopping the wait for the other workers" in errors
    assert "preempted: stopped by SIGTERM while waiting for 1 of the 1 other tasks" in errors


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
        f"--worker_start_timeout_minutes={0.05 if stop is None else 5}",
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
            "error: --worker_start_timeout_minutes=0.05: TensorFlow's start of the workers did "
            "not finish within 3 s (a worker stopped after meeting the others, or another "
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
        [*command, f"--worker_start_timeout_minutes={0.05 if stop is None else 5}"],
        cwd=ROOT,
        env=dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group
    )
    try:
        settings = shared_settings(Config(process_id=1, **flags))
        peer = meet(
            ("process", 1),
            jax_tasks(2, port),
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
        else "error: --worker_start_timeout_minutes=0.05: jax.distributed's start of the "
        "processes did not finish within 3 s (a process stopped after meeting the others, or "
        "another program took its port?); nothing was trained"
    ), errors[-3000:]


def test_a_signal_in_jaxs_wait_for_the_processes_is_a_preemption(tmp_path):
    """Before, the wait's stop (InterruptedError, an OSError) became a
    ConfigError: the tool exited 1, not 75 as in TensorFlow's wait."""
    pytest.importorskip("jax")
    from keras_lars.tools.train.preemption import Preempted
    from keras_lars.tools.train.preemption import Preemption
    from keras_lars.tools.train.runtime_jax import JaxRuntime

    (port,) = free_ports(1)
    config = Config(
        backend="jax",
        distribution="none",
        num_processes=2,
        process_id=0,
        coordinator_address=f"localhost:{port}",
        model_dir=str(tmp_path / "run"),
    )
    preemption = Preemption()
    preemption.signal = "SIGTERM"  # as its handler records it, during the wait
    with pytest.raises(Preempted) as stopped:
        JaxRuntime(config).start(preemption)
    assert str(stopped.value) == (
        "stopped by SIGTERM while waiting for 1 of the 1 other processes: process 1; "
        "nothing was trained; run the same command"
    )
