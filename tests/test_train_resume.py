"""The training tool preempted and killed (SIGTERM, then SIGKILL) and run
again: the resumed run ends as the uninterrupted one, bit for bit.
"""

import json
import signal
import subprocess
import threading
import time

import pytest

from keras_lars.tools import checkpoints
from keras_lars.tools import train
from tests.train_tool import TIMEOUT
from tests.train_tool import assert_same_weights
from tests.train_tool import run_tool
from tests.train_tool import start_tool

# AlexNet-BN has dropout: a resumed run must also draw the same masks. The
# first 384 digits: 12 steps of 32 an epoch, 2 evaluation steps (was 768 at
# 64, and before all 1438 and 360: 22 and 6, for the same claims).
RESUMED = [
    "--model=alexnet_bn",
    "--train_examples=384",
    "--eval_examples=64",
    "--train_epochs=2",
    "--warmup_epochs=1",
    "--global_batch_size=32",
    "--base_learning_rate=4",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The RESUMED run through, started in the background for the signalled
    and killed runs to compare with: (model_dir, wait), wait() its exit
    status and output. Checkpoints every few steps change no number: it
    stands for runs with --checkpoint_every_steps too."""
    model_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    log = model_dir.parent / "output.txt"
    with open(log, "w") as output:
        process = start_tool(
            [*RESUMED, f"--model_dir={model_dir}"], stdout=output, stderr=subprocess.STDOUT
        )

    def wait():
        return process.wait(TIMEOUT), log.read_text()[-3000:]

    yield model_dir, wait
    if process.poll() is None:
        process.kill()
        process.wait()


# --- SIGTERM, kill, resume ----------------------------------------------------------
def test_sigterm_then_a_kill_and_the_reruns_end_as_an_uninterrupted_run(uninterrupted, tmp_path):
    """SIGTERM inside the first epoch saves a checkpoint there (exit 75); the
    rerun resumes inside that epoch and is killed (SIGKILL) as it starts the
    second; the last rerun resumes after the first and ends as the
    uninterrupted run, bit for bit. AlexNet-BN has dropout: the resumed
    epoch goes on with the same masks (restored generator state) and the
    same batches (skipped, not redrawn)."""
    args = [*RESUMED, "--checkpoint_every_steps=4", f"--model_dir={tmp_path / 'run'}"]
    whole, wait = uninterrupted
    run = tmp_path / "run"

    # SIGTERM inside the first epoch: a step checkpoint of it exists (the newest two are kept).
    victim = start_tool(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def inside_first_epoch():
        return any(e == 0 and s >= 4 for e, s in checkpoints.saved(str(run / "checkpoints")))

    deadline = time.time() + TIMEOUT
    while not inside_first_epoch() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGTERM)
    _, stderr = victim.communicate(timeout=TIMEOUT)
    assert victim.returncode == train.EXIT_PREEMPTED, stderr[-3000:]
    assert "SIGTERM received" in stderr and "preempted: stopped by SIGTERM" in stderr
    epoch, step = checkpoints.saved(str(run / "checkpoints"))[-1]
    assert epoch == 0 and 4 < step < 12  # inside the first epoch (12 steps)
    assert not (run / "summary.json").exists()

    # The rerun, killed as its second epoch starts (Keras's line, flushed).
    errors = tmp_path / "rerun_errors.txt"
    with open(errors, "w") as stderr_file:
        rerun = start_tool(args, stdout=subprocess.PIPE, stderr=stderr_file, text=True)
    watchdog = threading.Timer(TIMEOUT, rerun.kill)
    watchdog.start()
    lines = []
    try:
        for line in rerun.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("Epoch 2/"):
                rerun.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
        rerun.kill()
        rerun.wait()
    assert f"resuming {run} after epoch 0, step {step} of epoch 1" in lines, errors.read_text()
    # Keras's lines count the run's epochs (were "Epoch 2/2" alone: the resumed
    # epoch's own fit, of 1 epoch, printed none).
    assert [line for line in lines if line.startswith("Epoch ")] == ["Epoch 1/2", "Epoch 2/2"]
    assert not (run / "summary.json").exists()  # killed before the end
    epoch, step = checkpoints.saved(str(run / "checkpoints"))[-1]
    assert epoch == 1  # the first epoch's checkpoint (or one of the second's) committed

    resumed = run_tool(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    inside = f", step {step} of epoch {epoch + 1}" if step else ""
    assert f"resuming {run} after epoch {epoch}{inside}" in resumed.stdout
    status, output = wait()
    assert status == 0, output

    # Validation metrics, rates and step counts equal; the training metrics of
    # an interrupted epoch cover only its steps after the resume.
    summaries = [json.loads((d / "summary.json").read_text()) for d in (whole, run)]
    keys = ("val_loss", "val_accuracy", "learning_rate", "steps")
    assert len(summaries[1]["history"]) == 2
    for a, b in zip(summaries[0]["history"], summaries[1]["history"], strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert {k: summaries[0]["final"][k] for k in keys} == {
        k: summaries[1]["final"][k] for k in keys
    }
    name = "ckpt-0002.weights.h5"
    assert_same_weights(whole / "checkpoints" / name, run / "checkpoints" / name, 20)
