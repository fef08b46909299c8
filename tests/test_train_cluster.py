"""The training tool on a multi-worker cluster on localhost (--strategy=multi_worker,
TF_CONFIG): preemption, a lost worker, an adaptive batch. Its bfloat16
all-reduce is tests/test_launchers.py's (on the launchers' clusters); its wait
for the cluster, tests/test_worker_start.py's.
"""

import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from keras_lars.tools import checkpoints
from keras_lars.tools import storage
from keras_lars.tools import train
from keras_lars.tools.benchmark_allreduce import free_ports
from tests.processes import finish as processes_finish
from tests.train_tool import ROOT
from tests.train_tool import TIMEOUT
from tests.train_tool import assert_same_weights
from tests.train_tool import h5_arrays
from tests.train_tool import tool_command


# --- multi-worker: waiting for the cluster, preemption ------------------------------
def test_a_lost_worker_is_one_line_naming_the_checkpoint_to_resume_from(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    for name in ("ckpt-0000-000004", "ckpt-0000-000008"):
        for suffix in (".json", ".weights.h5"):
            (directory / (name + suffix)).write_text("")
    (directory / "other.txt").write_text("")
    (directory / "ckpt-0000-000012.weights.h5").write_text("")  # unfinished: no state
    lost = tf.errors.UnavailableError(None, None, "Collective ops is aborted by: reset by peer")
    try:  # as a checkpoint's write fails: a StorageError raised while handling it
        try:
            raise lost
        except tf.errors.OpError:
            raise storage.StorageError("cannot write x: reset by peer") from None
    except storage.StorageError as error:
        wrapped = error
    values = {"strategy": "multi_worker", "model_dir": str(tmp_path)}
    expected = (
        "a step across the run's workers failed, most likely because another one stopped "
        "(Collective ops is aborted by: reset by peer); run every one again with the same "
        f"command: the run resumes from its last checkpoint, {directory / 'ckpt-0000-000008'}"
    )
    assert train.lost_peer(lost, values) == expected
    assert train.lost_peer(wrapped, values) == expected
    assert train.lost_peer(lost, {**values, "model_dir": str(tmp_path / "new")}).endswith(
        "the run resumes from the start"
    )
    assert train.lost_peer(lost, {**values, "strategy": "default"}) is None
    assert train.lost_peer(ValueError("no"), values) is None


def _cluster_env(ports, index):
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    return dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="",
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
    )


def _start_worker(args, ports, index):
    return subprocess.Popen(
        tool_command("--strategy=multi_worker", *args),
        cwd=ROOT,
        env=_cluster_env(ports, index),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start_cluster(args):
    ports = free_ports(2)
    return [_start_worker(args, ports, index) for index in range(2)]


def _finish(processes):
    """(return codes, stderr texts); kills what is left on a timeout."""
    ended = processes_finish(processes, TIMEOUT)
    return [code for code, _, _ in ended], [err for _, _, err in ended]


@pytest.mark.multiworker
@pytest.mark.subprocess
def test_a_sigterm_then_a_killed_worker_and_the_reruns_end_as_the_uninterrupted_run(tmp_path):
    # TensorFlow's PreemptionCheckpointHandler: both workers save at the same
    # step and exit 75. The rerun loses a worker to SIGKILL; the chief exits
    # 75 with one line. The same two commands then end with the weights of an
    # uninterrupted two-worker run. The second worker starts 5 s late. The
    # simple CNN (330k parameters at 8x8) in 48 steps an epoch (the first 768
    # digits in batches of 16), so that each signal, sent as a checkpoint
    # appears, lands dozens of steps before the run's end. (Was AlexNet's 20M
    # gradients in 6 steps an epoch: 100 s.)
    args = [
        "--model=simple_cnn",
        "--train_examples=768",
        "--train_epochs=3",
        "--warmup_epochs=1",
        "--global_batch_size=16",
        "--noeval",
    ]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    uninterrupted = _start_cluster(args + [f"--model_dir={whole}"])
    ports = free_ports(2)
    victims = [_start_worker(args + [f"--model_dir={stopped}"], ports, 0)]
    time.sleep(5)
    victims.append(_start_worker(args + [f"--model_dir={stopped}"], ports, 1))
    deadline = time.time() + TIMEOUT
    while (
        not checkpoints.saved(str(stopped / "checkpoints"))
        and all(v.poll() is None for v in victims)
        and time.time() < deadline
    ):
        time.sleep(0.05)
    victims[1].send_signal(signal.SIGTERM)  # the chief (0) is told by the cluster
    codes, errors = _finish(victims)
    assert codes == [train.EXIT_PREEMPTED] * 2, "\n".join(e[-3000:] for e in errors)
    for error in errors:
        assert "a process of the cluster received SIGTERM" in error, "\n".join(
            e[-3000:] for e in errors
        )
    saved = checkpoints.saved(str(stopped / "checkpoints"))[-1]
    assert (1, 0) < saved < (3, 0)  # after the first epoch, before the end
    assert "waiting for" not in "".join(errors)  # a 5 s start gap is no news
    # The rerun loses worker 1 to a SIGKILL after the epoch-2 checkpoint: the
    # chief's next collective fails, and it exits 75 with one line naming it.
    workers = _start_cluster(args + [f"--model_dir={stopped}"])
    while (
        (2, 0) not in checkpoints.saved(str(stopped / "checkpoints"))
        and all(w.poll() is None for w in workers)
        and time.time() < deadline
    ):
        time.sleep(0.05)
    workers[1].send_signal(signal.SIGKILL)
    codes, errors = _finish(workers)
    assert codes == [train.EXIT_PREEMPTED, -signal.SIGKILL], errors[0][-3000:]
    lines = [line for line in errors[0].splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(
        "error: a step across the run's workers failed, most likely because another one stopped ("
    ), errors[0][-3000:]
    assert re.search(r"the run resumes from its last checkpoint, \S+ckpt-0002$", lines[0])
    codes, errors = _finish(_start_cluster(args + [f"--model_dir={stopped}"]))
    assert codes == [0, 0], "\n".join(e[-3000:] for e in errors)
    codes, errors = _finish(uninterrupted)
    assert codes == [0, 0], "\n".join(e[-3000:] for e in errors)
    name = "ckpt-0003.weights.h5"
    # every array: the CNN's 8 variables, their 8 momentum slots, the step count
    assert_same_weights(whole / "checkpoints" / name, stopped / "checkpoints" / name, 16)


# --- --adaptive_batch on 2 workers -------------------------------------------------------
@pytest.mark.multiworker
def test_an_adaptive_batch_on_two_workers_decides_and_trains_as_one_device(tmp_path):
    """Under MultiWorkerMirroredStrategy --adaptive_batch reads the noise scale
    from the 2 replicas' halves of the batch; on one device from 2
    micro-batches of it. The simple CNN on 128 digits, batch 64: epoch 1 has 2
    updates, the decision after it takes the batch to its cap 128 (target 1e6
    x B_simple) and the rate by the linear rule (x2); epoch 2 has 1 update.
    Both make that decision and end with the same weights, to float32
    rounding (measured 3.2e-7 apart, relative)."""
    args = [
        "--model=simple_cnn",
        "--image_size=8",
        "--train_examples=128",
        "--train_epochs=2",
        "--warmup_epochs=0",
        "--global_batch_size=64",
        "--adaptive_batch=linear",
        "--adaptive_batch_max=128",
        "--adaptive_batch_target=1e6",
        "--noeval",
        "--log_every_seconds=0",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    one = subprocess.Popen(
        tool_command(*args, "--gradient_accumulation_steps=2", f"--model_dir={tmp_path / 'one'}"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers = _start_cluster([*args, f"--model_dir={tmp_path / 'two'}"])
    codes, errors = _finish([one, *workers])
    assert codes == [0, 0, 0], errors
    summaries = {
        name: json.loads((tmp_path / name / "summary.json").read_text()) for name in ("one", "two")
    }
    decisions = {name: summary["adaptive_batch"] for name, summary in summaries.items()}
    (mine,), (theirs,) = decisions["two"], decisions["one"]
    assert {k: mine[k] for k in ("step", "epoch", "batch_size", "rate_factor", "measurements")} == {
        "step": 2,
        "epoch": 1,
        "batch_size": 128,
        "rate_factor": 2.0,
        "measurements": 2,
    }
    for key in ("step", "epoch", "batch_size", "rate_factor", "measurements"):
        assert mine[key] == theirs[key], key
    assert mine["learning_rate"] == pytest.approx(theirs["learning_rate"], rel=1e-6)
    # The workers' halves are other examples than the micro-batches' (the same
    # global batch, split otherwise): the readings agree within their errors
    # (measured 20.3 +- 9.7 and 22.1 +- 24).
    gap = abs(mine["noise_scale"] - theirs["noise_scale"])
    assert gap <= mine["standard_error"] + theirs["standard_error"]
    assert [h["global_batch_size"] for h in summaries["two"]["history"]] == [64, 128]
    assert summaries["two"]["layout"] == {"workers": 2, "replicas": 2}
    expected, actual = (
        h5_arrays(tmp_path / name / "checkpoints" / "ckpt-0002.weights.h5")
        for name in ("one", "two")
    )
    model = [name for name in expected if not name.startswith("optimizer/")]
    assert len(model) == 8
    for name in model:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6)
