"""The training tool killed or preempted (SIGKILL, SIGTERM) and run again: the
resumed run ends as the uninterrupted one, bit for bit.
"""

import json
import signal
import subprocess
import time

import pytest

from keras_lars.tools import checkpoints
from keras_lars.tools import train
from tests.train_tool import TIMEOUT
from tests.train_tool import assert_same_weights
from tests.train_tool import run_tool
from tests.train_tool import start_tool

# AlexNet-BN has dropout: a resumed run must also draw the same masks. The
# first 768 digits: 12 steps of 64 an epoch, 2 evaluation steps (was all 1438
# and 360: 22 and 6, for the same claims).
RESUMED = [
    "--model=alexnet_bn",
    "--train_examples=768",
    "--eval_examples=128",
    "--train_epochs=2",
    "--warmup_epochs=1",
    "--global_batch_size=64",
    "--base_learning_rate=4",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The RESUMED run through, started in the background for the kill and
    the SIGTERM tests to compare with: (model_dir, wait), wait() its exit
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


# --- kill, SIGTERM, resume ----------------------------------------------------------
def test_rerun_after_kill_resumes_and_ends_as_an_uninterrupted_run(uninterrupted, tmp_path):
    whole, wait = uninterrupted
    killed = tmp_path / "killed"
    victim = start_tool(
        [*RESUMED, f"--model_dir={killed}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    first = killed / "checkpoints" / "ckpt-0001.json"  # written last: the commit
    deadline = time.time() + TIMEOUT
    while not first.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert first.exists() and not (killed / "summary.json").exists()
    saved = checkpoints.epochs_saved(str(killed / "checkpoints"))
    assert saved[-1] < 2  # killed before the end
    resumed = run_tool(RESUMED + [f"--model_dir={killed}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {killed} after epoch {saved[-1]}" in resumed.stdout
    status, output = wait()
    assert status == 0, output

    summaries = []
    for directory in (whole, killed):
        with open(directory / "summary.json") as f:
            summaries.append(json.load(f))
    metric_keys = ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "steps")
    assert summaries[0]["final"] == summaries[1]["final"]
    for a, b in zip(summaries[0]["history"], summaries[1]["history"]):
        assert {k: a[k] for k in metric_keys} == {k: b[k] for k in metric_keys}
    name = "ckpt-0002.weights.h5"
    assert_same_weights(whole / "checkpoints" / name, killed / "checkpoints" / name, 20)


def test_sigterm_saves_within_the_epoch_and_the_rerun_ends_as_an_uninterrupted_run(
    uninterrupted, tmp_path
):
    # AlexNet-BN has dropout: the resumed epoch must go on with the same masks
    # (restored generator state) and the same batches (skipped, not redrawn).
    args = [*RESUMED, "--checkpoint_every_steps=4"]
    whole, wait = uninterrupted
    stopped = tmp_path / "stopped"
    victim = start_tool(
        [*args, f"--model_dir={stopped}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def inside_first_epoch():  # a step checkpoint of epoch 1 exists (the newest two are kept)
        return any(e == 0 and s >= 4 for e, s in checkpoints.saved(str(stopped / "checkpoints")))

    deadline = time.time() + TIMEOUT
    while not inside_first_epoch() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGTERM)
    _, stderr = victim.communicate(timeout=TIMEOUT)
    assert victim.returncode == train.EXIT_PREEMPTED, stderr[-3000:]
    assert "SIGTERM received" in stderr and "preempted: stopped by SIGTERM" in stderr
    epoch, step = checkpoints.saved(str(stopped / "checkpoints"))[-1]
    assert epoch == 0 and 4 < step < 12  # inside the first epoch (12 steps)
    assert not (stopped / "summary.json").exists()
    resumed = run_tool(args + [f"--model_dir={stopped}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    inside = f", step {step} of epoch {epoch + 1}" if step else ""
    assert f"resuming {stopped} after epoch {epoch}{inside}" in resumed.stdout
    # Keras's lines count the run's epochs (were "Epoch 2/2" alone: the resumed
    # epoch's own fit, of 1 epoch, printed none).
    numbered = [line for line in resumed.stdout.splitlines() if line.startswith("Epoch ")]
    assert numbered == ["Epoch 1/2", "Epoch 2/2"], resumed.stdout
    status, output = wait()
    assert status == 0, output

    summaries = [json.loads((d / "summary.json").read_text()) for d in (whole, stopped)]
    # Validation metrics, rates and step counts equal; the training metrics of
    # the interrupted epoch cover only its steps after the resume.
    keys = ("val_loss", "val_accuracy", "learning_rate", "steps")
    for a, b in zip(summaries[0]["history"], summaries[1]["history"]):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    name = "ckpt-0002.weights.h5"
    assert_same_weights(whole / "checkpoints" / name, stopped / "checkpoints" / name, 20)
