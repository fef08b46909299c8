"""The training tool preempted and killed (SIGHUP, then SIGKILL) and run
again across a --batch_schedule phase boundary: the resumed run ends as the
uninterrupted one, bit for bit. SIGHUP (a closed terminal or ssh session)
stops the run as SIGTERM does, through the same handler
(tools/train/preemption.py); a real tool process gets SIGTERM in
test_train_accumulation's stop inside an epoch.
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
# first 512 digits at their 8x8, in two phases: 16 steps of 32, then epochs
# of 8 steps of 64; 2 evaluation steps. (Was two tests: this run without
# phases, two epochs of 384 digits, and a phased one of 256, 46 and 37 s.)
RESUMED = [
    "--model=alexnet_bn",
    "--train_examples=512",
    "--eval_examples=64",
    "--train_epochs=3",
    "--warmup_epochs=0.5",
    "--batch_schedule=0:32,1:64",
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


# --- SIGHUP, kill, resume -----------------------------------------------------------
def test_sighup_then_a_kill_and_the_reruns_end_as_an_uninterrupted_run(uninterrupted, tmp_path):
    """SIGHUP inside the second epoch, the first of batch 64, saves a
    checkpoint there (exit 75, one line naming it, no traceback); the rerun
    resumes inside that epoch at the second phase's batch and is killed
    (SIGKILL) as it starts the third; the last rerun resumes after the
    second and ends as the uninterrupted run, bit for bit. AlexNet-BN has
    dropout: the resumed epoch goes on with the same masks (restored
    generator state) and the same batches (skipped, not redrawn)."""
    args = [*RESUMED, "--checkpoint_every_steps=2", f"--model_dir={tmp_path / 'run'}"]
    whole, wait = uninterrupted
    run = tmp_path / "run"

    # SIGHUP inside the second epoch: a step checkpoint of it exists (the newest two are kept).
    victim = start_tool(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def inside_second_epoch():
        return any(e == 1 and s >= 2 for e, s in checkpoints.saved(str(run / "checkpoints")))

    deadline = time.time() + TIMEOUT
    while not inside_second_epoch() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGHUP)  # the ssh session closed
    _, stderr = victim.communicate(timeout=TIMEOUT)
    assert victim.returncode == train.EXIT_PREEMPTED, stderr[-3000:]
    assert "SIGHUP received: saving a checkpoint" in stderr, stderr[-3000:]
    assert "preempted: stopped by SIGHUP" in stderr and "Traceback" not in stderr
    epoch, step = checkpoints.saved(str(run / "checkpoints"))[-1]
    assert epoch == 1 and 2 <= step < 8, (epoch, step)  # inside the second epoch (8 steps)
    assert f"checkpoint {checkpoints.stem(str(run / 'checkpoints'), epoch, step)}" in stderr
    assert not (run / "summary.json").exists()

    # The rerun, killed as its third epoch starts (Keras's line, flushed).
    errors = tmp_path / "rerun_errors.txt"
    with open(errors, "w") as stderr_file:
        rerun = start_tool(args, stdout=subprocess.PIPE, stderr=stderr_file, text=True)
    watchdog = threading.Timer(TIMEOUT, rerun.kill)
    watchdog.start()
    lines = []
    try:
        for line in rerun.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("Epoch 3/"):
                rerun.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
        rerun.kill()
        rerun.wait()
    assert f"resuming {run} after epoch 1, step {step} of epoch 2" in lines, errors.read_text()
    # Keras's lines count the run's epochs (were "Epoch 2/2" alone: the resumed
    # epoch's own fit, of 1 epoch, printed none).
    assert [line for line in lines if line.startswith("Epoch ")] == ["Epoch 2/3", "Epoch 3/3"]
    assert not (run / "summary.json").exists()  # killed before the end
    epoch, step = checkpoints.saved(str(run / "checkpoints"))[-1]
    assert epoch == 2  # the second epoch's checkpoint (or one of the third's) committed

    resumed = run_tool(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    inside = f", step {step} of epoch {epoch + 1}" if step else ""
    assert f"resuming {run} after epoch {epoch}{inside}" in resumed.stdout
    status, output = wait()
    assert status == 0, output

    # Validation metrics, rates, step counts and batches equal; the training
    # metrics of an interrupted epoch cover only its steps after the resume.
    summaries = [json.loads((d / "summary.json").read_text()) for d in (whole, run)]
    keys = ("val_loss", "val_accuracy", "learning_rate", "steps", "global_batch_size")
    assert [h["global_batch_size"] for h in summaries[0]["history"]] == [32, 64, 64]
    assert [h["steps"] for h in summaries[0]["history"]] == [16, 24, 32]  # 512 // 32, // 64
    assert len(summaries[1]["history"]) == 3
    for a, b in zip(summaries[0]["history"], summaries[1]["history"], strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert {k: summaries[0]["final"][k] for k in keys if k in summaries[0]["final"]} == {
        k: summaries[1]["final"][k] for k in keys if k in summaries[0]["final"]
    }
    name = "ckpt-0003.weights.h5"
    assert_same_weights(whole / "checkpoints" / name, run / "checkpoints" / name, 20)
