"""keras_lars.distribute: the strategy factory (make_strategy and its checks
of TF_CONFIG and of its arguments), each task's wait for the others
(wait_for_workers: admitted, refused for settings that differ, timed out,
stopped, its own address taken), and two real worker processes
(tests/multiworker_worker.py) on free localhost ports, whose final weights are
compared with single-process runs of the same functions: each multi-worker
workaround of keras_lars.compat shown needed, and a killed worker restarting
from its backup. Steps on two replicas in this process are
tests/test_mirrored_steps.py; a step under XLA, tests/test_xla_readiness.py."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from keras_lars import compat
from keras_lars import distribute
from keras_lars import rendezvous
from keras_lars.tools.benchmark_allreduce import free_ports
from tests import multiworker_worker as worker
from tests.processes import CHILD_TIMEOUT
from tests.processes import ROOT

WORKER_TIMEOUT = CHILD_TIMEOUT


# --- two worker processes --------------------------------------------------
class _Workers:
    """Two worker processes of one job; `results()` waits for both."""

    def __init__(self, tmp_path, job, tag, extra_args=((), ())):
        cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
        self.scratch = tmp_path / f"{tag}_tmp"
        self.scratch.mkdir()
        self.outputs, self.logs, self.processes = [], [], []
        for index in range(2):
            env = dict(
                os.environ,
                TF_CONFIG=json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}}
                ),
                CUDA_VISIBLE_DEVICES="",
                TF_CPP_MIN_LOG_LEVEL="3",
                KERAS_BACKEND="tensorflow",
                PYTHONPATH=ROOT,
                TMPDIR=str(self.scratch),
            )
            self.outputs.append(tmp_path / f"{tag}{index}.npz")
            self.logs.append(tmp_path / f"{tag}{index}.log")
            with open(self.logs[-1], "w") as log:
                self.processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            worker.__file__,
                            job,
                            str(self.outputs[-1]),
                            *extra_args[index],
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,
                    )
                )

    def log_tails(self):
        return "\n".join(
            f"--- worker {i} log:\n" + path.read_text()[-3000:] for i, path in enumerate(self.logs)
        )

    def kill(self, index):
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait()

    def kill_running(self):
        """Leaves no process behind when a test fails early."""
        for index, process in enumerate(self.processes):
            if process.poll() is None:
                self.kill(index)

    def results(self):
        deadline = time.monotonic() + WORKER_TIMEOUT
        try:
            codes = [p.wait(max(deadline - time.monotonic(), 1)) for p in self.processes]
        except subprocess.TimeoutExpired:
            for p in self.processes:
                p.kill()
                p.wait()
            pytest.fail("worker processes timed out\n" + self.log_tails())
        assert codes == [0, 0], self.log_tails()
        return [dict(np.load(path)) for path in self.outputs]


def _weights(results, prefix):
    return [
        results[f"{prefix}/{i}"]
        for i in range(len([key for key in results if key.startswith(prefix + "/")]))
    ]


@pytest.fixture(scope="module")
def two_worker_training(tmp_path_factory):
    """The "train" job on two workers, and the same training in this process
    (no strategy: one replica sees each whole global batch)."""
    workers = _Workers(tmp_path_factory.mktemp("train"), "train", "train")
    try:
        single = tf.distribute.get_strategy()
        references = {
            "lars": worker.train(single)[0].get_weights(),
            "sync_bn": worker.train(single, batch_norm=True)[0].get_weights(),
        }
        return workers.results(), references
    finally:
        workers.kill_running()


@pytest.mark.multiworker
def test_two_workers_match_single_process_on_the_global_batches(two_worker_training):
    (chief, other), references = two_worker_training
    assert chief["replicas"] == other["replicas"] == 2
    assert str(chief["communication"]) == "RING 256"  # make_strategy's options reached TF
    assert chief["chief"] and not other["chief"]
    for prefix, reference in [("spe1", references["lars"]), ("sync_bn", references["sync_bn"])]:
        ours = _weights(chief, prefix)
        assert len(ours) == len(reference)
        for a, b in zip(ours, _weights(other, prefix)):  # one all-reduce, one result
            np.testing.assert_array_equal(a, b)
        start = worker.build_model(prefix == "sync_bn").get_weights()
        assert min(np.abs(b - s).max() for b, s in zip(reference, start) if s.ndim == 2) > 1e-2
        for a, b in zip(ours, reference):  # two half batches all-reduced = one global batch
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # (float32 sums reordered)


@pytest.mark.multiworker
def test_steps_per_execution_4_equals_1_on_two_workers(two_worker_training):
    (chief, other), _ = two_worker_training
    for results in (chief, other):
        for a, b in zip(_weights(results, "spe4"), _weights(results, "spe1")):
            np.testing.assert_array_equal(a, b)


@pytest.mark.multiworker
def test_each_multi_worker_workaround_is_needed(two_worker_training):
    """Keras's own code, one workaround missing at a time, shows each
    upstream symptom (in the workers of the "train" job, after its fits);
    with all of them `fit` works (tests above)."""
    for results in two_worker_training[0]:
        # keras#20585 / tensorflow#72388: strategy.reduce of the whole batch
        assert "Attempt to convert a value (PerReplica" in str(results["no_workaround"])
        # keras#20585 / tensorflow#72388: reduce(..., axis=0) of scalar metrics
        assert "Invalid reduction dimension 0 for input with 0 dimensions" in str(
            results["no_metrics_fix"]
        )
        # keras#19246: steps_per_execution > 1
        assert "You must feed a value for placeholder tensor" in str(results["no_loop_fix"])


@pytest.mark.multiworker
def test_killed_worker_restarts_from_backup_and_ends_like_uninterrupted_run(
    tmp_path, two_worker_training
):
    (uninterrupted, _), _ = two_worker_training
    backup = tmp_path / "backup"
    pause = tmp_path / "paused"
    args = ("--backup-dir", str(backup))
    first = _Workers(
        tmp_path, "fault", "first", extra_args=(args, args + ("--pause-file", str(pause)))
    )
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT
        while not pause.exists():  # worker 1 is in epoch 2, after 2 steps
            assert time.monotonic() < deadline and first.processes[1].poll() is None, (
                first.log_tails()
            )
            time.sleep(0.2)
        # Only the chief wrote the backup, of the end of epoch 1 (next epoch: 2).
        assert sorted(os.listdir(backup)) == ["latest.weights.h5", "training_metadata.json"]
        assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 2
        first.kill(1)  # SIGKILL; the chief then waits forever in an all-reduce
        first.kill(0)
        assert [p.returncode for p in first.processes] == [-signal.SIGKILL] * 2
    finally:
        first.kill_running()

    second = _Workers(tmp_path, "fault", "second", extra_args=(args, args))
    for results in second.results():
        np.testing.assert_array_equal(results["epochs"], [2, 3])  # resumed at epoch 2
        for a, b in zip(_weights(results, "fault"), _weights(uninterrupted, "spe1")):
            np.testing.assert_array_equal(a, b)
    assert not backup.exists()  # the chief removes the backup at the end
    assert os.listdir(second.scratch) == []  # the other worker's scratch saves are gone


# --- the strategy factory ----------------------------------------------------
GOOD = {
    "cluster": {"worker": ["localhost:1234", "localhost:1235"]},
    "task": {"type": "worker", "index": 1},
}


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "TF_CONFIG is not set"),
        ("{'cluster': 1", "TF_CONFIG is not valid JSON"),
        ("[1, 2]", "TF_CONFIG must be a JSON object"),
        (json.dumps({"task": GOOD["task"]}), r"TF_CONFIG\['cluster'\] must be"),
        (
            json.dumps({**GOOD, "cluster": {"worker": ["localhost"]}}),
            r"TF_CONFIG\['cluster'\]\['worker'\] must be a non-empty list of 'host:port'",
        ),
        (json.dumps({"cluster": GOOD["cluster"]}), r"TF_CONFIG\['task'\] must be"),
        (
            json.dumps({**GOOD, "task": {"type": "chief", "index": 0}}),
            r"TF_CONFIG\['task'\]\['type'\] = 'chief' is not a job",
        ),
        (
            json.dumps({**GOOD, "task": {"type": "worker", "index": "0"}}),
            r"TF_CONFIG\['task'\]\['index'\] must be an integer",
        ),
        (
            json.dumps({**GOOD, "task": {"type": "worker", "index": 2}}),
            r"TF_CONFIG\['task'\]\['index'\] = 2 is out of range for job 'worker' with 2",
        ),
    ],
)
def test_bad_tf_config_is_named(text, message, monkeypatch, restore_compat):
    if text is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", text)
    with compat.unpatched():
        with pytest.raises(ValueError, match=message):
            distribute.make_strategy("multi_worker")
        assert compat.applied() == ()  # nothing is patched for a failed call
    assert distribute.parse_tf_config(json.dumps(GOOD)) == GOOD


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"kind": "gpu"}, "kind"),
        ({"collective_implementation": "mpi"}, "collective_implementation"),
        ({"bytes_per_pack": -1}, "bytes_per_pack"),
        ({"bytes_per_pack": 1.5}, "bytes_per_pack"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_bad_strategy_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        distribute.make_strategy(**kwargs)


def test_tpu_without_a_tpu_names_the_address(monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    with pytest.raises(ValueError, match="tpu_address"):
        distribute.make_strategy("tpu")


def test_factory_kinds(monkeypatch, restore_compat):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    with compat.unpatched():
        assert distribute.make_strategy("auto") is tf.distribute.get_strategy()  # no GPU here
        one = distribute.make_strategy("one_device", devices=["/cpu:1"])
        assert isinstance(one, tf.distribute.OneDeviceStrategy)
        assert one.extended.worker_devices[0].endswith("CPU:1")
        assert compat.applied() == ()
        mirrored = distribute.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
        assert mirrored.num_replicas_in_sync == 2
        assert compat.applied() == tuple(w.name for w in compat.WORKAROUNDS if w.needed())
    assert distribute.is_chief(mirrored)


# --- waiting for the cluster -------------------------------------------------------
def _two_task_config(monkeypatch, own_port, peer_port):
    cluster = {"worker": [f"localhost:{own_port}"], "chief": [f"localhost:{peer_port}"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )


def _chief_meets(own_port, peer_port, outcome, settings=None):
    """Chief 0 of _two_task_config's cluster, in a thread: its result (or
    error) goes to `outcome`."""
    cluster = {"chief": [f"localhost:{peer_port}"], "worker": [f"localhost:{own_port}"]}
    tasks = {("chief", 0): "chief 0", ("worker", 0): "worker 0"}

    def meet():
        try:
            outcome.append(
                rendezvous.meet(
                    ("chief", 0),
                    tasks,
                    f"localhost:{peer_port}",
                    60,
                    run={"cluster": cluster},
                    settings=settings,
                )
            )
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=meet)
    thread.start()
    return thread


def test_wait_for_workers_returns_once_the_chief_admits_this_task(monkeypatch):
    own, peer = free_ports(2)
    _two_task_config(monkeypatch, own, peer)
    outcome = []
    chief = _chief_meets(own, peer, outcome, settings={"--seed": 1})
    assert keras_lars.distribute.wait_for_workers(60, settings={"--seed": 1}) == 1
    chief.join()
    assert outcome == [1]
    # Meanwhile this task held its own port; now it is free for TensorFlow.
    with socket.socket() as again:
        again.bind(("localhost", own))


def test_wait_for_workers_names_the_settings_that_differ(monkeypatch):
    own, peer = free_ports(2)
    _two_task_config(monkeypatch, own, peer)
    outcome = []
    chief = _chief_meets(own, peer, outcome, settings={"--seed": 1, "--model": "resnet18"})
    differ = "settings differ: --seed: 1 on chief 0, 2 on worker 0"
    with pytest.raises(
        rendezvous.HandshakeError,
        match=rf"^chief 0 \(localhost:{peer}\) refused worker 0: {differ}$",
    ):
        keras_lars.distribute.wait_for_workers(60, settings={"--seed": 2, "--model": "resnet18"})
    chief.join()
    assert isinstance(outcome[0], rendezvous.HandshakeError) and str(outcome[0]) == differ


def test_wait_for_workers_logs_the_missing_task_and_times_out(monkeypatch):
    own, peer = free_ports(2)
    _two_task_config(monkeypatch, own, peer)
    lines = []
    started = time.monotonic()
    with pytest.raises(
        TimeoutError, match=rf"^chief 0 \(localhost:{peer}\) did not start within 1.5 s$"
    ):
        keras_lars.distribute.wait_for_workers(1.5, log=lines.append, report_every_seconds=0.5)
    assert 1.5 <= time.monotonic() - started < 6
    assert lines and all(
        line.startswith(f"waiting for chief 0 (localhost:{peer}) (") for line in lines
    )


def test_wait_for_workers_stops_when_asked(monkeypatch):
    _two_task_config(monkeypatch, *free_ports(2))
    with pytest.raises(InterruptedError, match="stopped by SIGTERM while waiting for chief 0"):
        keras_lars.distribute.wait_for_workers(60, stop=lambda: "SIGTERM")


def test_wait_for_workers_names_a_taken_own_address(monkeypatch):
    own, peer = free_ports(2)
    _two_task_config(monkeypatch, own, peer)
    with socket.socket() as taken:
        taken.bind(("", own))
        taken.listen(1)
        with pytest.raises(OSError, match=f"cannot listen on this task's address localhost:{own}"):
            keras_lars.distribute.wait_for_workers(5)


def test_wait_for_workers_alone_or_with_a_bad_timeout(monkeypatch):
    (port,) = free_ports(1)
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": [f"localhost:{port}"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    assert keras_lars.distribute.wait_for_workers(1) == 0
    with pytest.raises(ValueError, match="timeout_seconds"):
        keras_lars.distribute.wait_for_workers(0)
