"""Signals to a real child process of the study: each stops the cell it
trains after a checkpoint with exit 75 and one line, losing nothing. (The
training tool's own: SIGHUP in test_train_resume, SIGTERM in
test_train_accumulation, test_train_cluster and test_train_jax.)"""

import os
import signal
import subprocess
import sys
import time

from keras_lars.tools import checkpoints
from keras_lars.tools import train
from tests.processes import CHILD_TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = CHILD_TIMEOUT


def wait_for_a_step_checkpoint(process, directory):
    """Returns once `directory` holds a checkpoint taken inside an epoch."""
    deadline = time.time() + TIMEOUT
    while process.poll() is None and time.time() < deadline:
        if any(step for _, step in checkpoints.saved(str(directory))):
            return
        time.sleep(0.05)
    raise AssertionError(f"no step checkpoint in {directory} (exit {process.poll()})")


# One cell of the simple CNN: 8 epochs of 22 steps (all 1438 digits), at
# milliseconds a step: enough left after its first step checkpoint for the
# signal to find it training (was ResNet-18, 2 epochs of 10: its tracing took
# longer than the whole cell now).
STUDY = [
    "--model=simple_cnn",
    "--image_size=8",
    "--optimizers=sgd",
    "--batch_sizes=64",
    "--seeds=1",
    "--train_epochs=8",
    "--warmup_epochs=0",
    "--checkpoint_every_steps=2",
]


def test_sigterm_to_the_study_stops_its_running_cell_naming_it_and_a_rerun_resumes_it(tmp_path):
    study_dir = tmp_path / "study"
    args = [*STUDY, f"--study_dir={study_dir}"]

    def stop(when):
        """The study run until `when(process)` returns, then sent SIGTERM: (exit, errors)."""
        errors = tmp_path / "errors.txt"
        with open(errors, "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "keras_lars.tools.batch_study", *args],
                cwd=ROOT,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        try:
            when(process)
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=TIMEOUT)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        return process.returncode, errors.read_text()

    def at_the_cells_start(process):  # before its training starts
        for line in process.stdout:
            if line.startswith("[1/1] sgd batch=64 seed=0: peak rate"):
                return
        raise AssertionError("the study ended before its cell")

    cells = study_dir / "cells"
    for when in (
        at_the_cells_start,
        lambda process: wait_for_a_step_checkpoint(process, next(cells.glob("*")) / "checkpoints"),
    ):
        returncode, errors = stop(when)
        assert returncode == train.EXIT_PREEMPTED, errors[-3000:]
        lines = [line for line in errors.splitlines() if line.startswith("preempted:")]
        assert len(lines) == 1, errors[-3000:]
        assert lines[0].startswith("preempted: cell [1/1] sgd batch=64 seed=0 (sgd-b64-s0-"), lines
        assert "stopped by SIGTERM" in lines[0] and "run the same command" in lines[0], lines
        assert "Traceback" not in errors
    (cell,) = cells.glob("*")
    epoch, step = checkpoints.saved(str(cell / "checkpoints"))[-1]
    assert lines[0].endswith(
        f"checkpoint {checkpoints.stem(str(cell / 'checkpoints'), epoch, step)}; "
        "run the same command to resume"
    ), lines
    finished = subprocess.run(
        [sys.executable, "-m", "keras_lars.tools.batch_study", *args],
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    inside = f", step {step} of epoch {epoch + 1}" if step else ""
    assert f"resuming {cell} after epoch {epoch}{inside}" in (cell / "train.log").read_text()
    assert "study: 1 cell(s) trained" in finished.stdout
