"""The training loop's guards and bookkeeping through the tool: divergence
and its rollbacks, a failed checkpoint write, throughput and progress lines,
--help. LAUNCHES: the runs of the tool's main in this process (Shallue et
al.'s simple CNN on the 8x8 digits, 327k parameters), each once, shared by
the tests that read them; a failed write and --help in processes of their own.
"""

import json
import math
import os
import re
import sys

import pytest

from keras_lars.tools import checkpoints
from keras_lars.tools import settings
from keras_lars.tools import train
from tests.train_tool import assert_same_weights
from tests.train_tool import console_script
from tests.train_tool import run_main
from tests.train_tool import run_tool
from tests.train_tool import tool_command


def _limit_file_size(limit_bytes):
    """run_tool's command for the tool whose files may not grow past
    `limit_bytes` (EFBIG, like a full disk) instead of it being killed by
    SIGXFSZ: a Python that sets both and execs the tool (no preexec_fn,
    which is unsafe with threads)."""
    setup = (
        "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_bytes}, {limit_bytes})); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    return lambda *args: [sys.executable, "-c", setup, *tool_command(*args)[1:]]


# The tests' runs of the tool's main: name: its arguments. All 1438 digits:
# 11 steps an epoch at the default batch of 128. At 1e6 LARS multiplies each
# layer's weights by about 1 + 1e6 * 0.001 a step: the logits overflow within
# a few steps.
TINY = ["--model=simple_cnn"]
LAUNCHES = {
    "divergence_rollback": [
        *TINY,
        "--train_epochs=2",
        "--warmup_epochs=1",
        "--base_learning_rate=1e6",
        "--divergence_rollbacks=2",
        "--divergence_rate_factor=1e-6",
        "--noeval",
    ],
    "divergence_after_the_last_rollback": [
        *TINY,
        "--train_epochs=1",
        "--warmup_epochs=0",
        "--base_learning_rate=1e6",
        "--divergence_rollbacks=1",
        "--noeval",
    ],
    # 11 steps of 16 an epoch, one execution each.
    "images_per_second": [
        *TINY,
        "--global_batch_size=16",
        "--train_examples=176",
        "--eval_examples=64",
        "--train_epochs=2",
        "--warmup_epochs=1",
        "--steps_per_execution=11",
        "--base_learning_rate=1",
        "--log_every_seconds=0.000001",
    ],
    "divergence": [*TINY, "--train_epochs=2", "--warmup_epochs=0", "--base_learning_rate=1e6"],
}


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """{name: (model_dir, exit status, stdout, stderr)} of LAUNCHES, each run
    once, on first use, in a model dir of its own."""
    root = tmp_path_factory.mktemp("launches")
    done = {}

    def launch(name, capfd):
        if name not in done:
            model_dir = root / name / "run"
            capfd.readouterr()
            status = run_main(*LAUNCHES[name], f"--model_dir={model_dir}")
            done[name] = (model_dir, status, *capfd.readouterr())
        return done[name]

    return launch


# --- --help -------------------------------------------------------------------------
def test_help_lists_every_setting():
    process = run_tool(["--help"], command=console_script)  # absl's, before Keras loads
    assert process.returncode == 1  # absl's --help
    for field in settings.fields(train.Config):
        assert f"--{field.name}:" in process.stdout or f"--[no]{field.name}:" in process.stdout, (
            field.name
        )


# --- divergence, a failed write, throughput -----------------------------------------
def test_divergence_stops_with_one_error_line_and_checkpoints_nothing(launches, capfd):
    model_dir, status, _, stderr = launches("divergence", capfd)
    assert status == 1
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr
    assert re.fullmatch(
        r"error: (loss|val_loss|variable \S+) became non-finite at step \d+ \(epoch 1\); "
        r"last good checkpoint: none \(no checkpoint yet\)",
        errors[0],
    ), errors[0]
    assert checkpoints.epochs_saved(str(model_dir / "checkpoints")) == []
    # config.json comes with the first checkpoint: a failed start locks nothing.
    assert not (model_dir / "config.json").exists() and not (model_dir / "summary.json").exists()
    assert not (model_dir / "run.lock").exists()


def test_divergence_rollback_lowers_the_rate_and_a_resume_keeps_it(launches, tmp_path, capfd):
    model_dir, status, _, stderr = launches("divergence_rollback", capfd)
    args = [*LAUNCHES["divergence_rollback"], f"--model_dir={model_dir}"]
    assert status == 0, stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if "rolling back" in line]
    assert len(warnings) == 1 and re.fullmatch(
        r"warning: (loss|variable \S+) became non-finite at step \d+ \(epoch 1\); rolling back "
        r"to the start with the peak learning rate x1e-06 \(rollback 1 of 2\)",
        warnings[0],
    ), warnings
    summary = json.loads((model_dir / "summary.json").read_text())
    assert all(math.isfinite(h["loss"]) for h in summary["history"])
    # lr = 1e6 * 1e-6 * 128 / 256 at the end of warmup, in the checkpoint's state too.
    assert summary["history"][0]["learning_rate"] == pytest.approx(0.5)
    directory = model_dir / "checkpoints"
    state = json.loads((directory / "ckpt-0002.json").read_text())
    assert (state["rate_factor"], state["rollbacks"]) == (1e-6, 1)

    # A resume from epoch 1 keeps the lowered rate: the same last epoch.
    first_run = tmp_path / "first.weights.h5"
    os.replace(directory / "ckpt-0002.weights.h5", first_run)
    (directory / "ckpt-0002.json").unlink()
    assert run_main(*args) == 0
    assert "rolling back" not in capfd.readouterr().err
    # The simple CNN's 4 kernels and 4 biases, their 8 momenta, the step count.
    assert_same_weights(first_run, directory / "ckpt-0002.weights.h5", 16)


def test_divergence_after_the_last_rollback_is_an_error(launches, capfd):
    _, status, _, stderr = launches("divergence_after_the_last_rollback", capfd)
    assert status == 1, stderr[-3000:]
    assert "(rollback 1 of 1)" in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "last good checkpoint: none" in last


def test_a_failed_checkpoint_write_is_one_line_and_leaves_no_file(tmp_path):
    # Real writes failing mid-file (RLIMIT_FSIZE, a limit of the process):
    # h5py's error, before a traceback, left a state file without weights.
    # The simple CNN's weights are 1.3 MB, and its first checkpoint comes
    # after its one step.
    model_dir = tmp_path / "run"
    process = run_tool(
        [*TINY, "--train_steps=1", "--warmup_epochs=0", "--noeval", f"--model_dir={model_dir}"],
        command=_limit_file_size(2**20),
    )
    assert process.returncode == 1, process.stderr[-3000:]
    assert "Traceback" not in process.stderr
    weights = model_dir / "checkpoints" / "ckpt-0001.weights.h5"
    last = process.stderr.strip().splitlines()[-1]
    assert last == f"error: cannot write {weights}: File too large"
    assert os.listdir(model_dir / "checkpoints") == []  # no state, no partial-* file
    assert not (model_dir / "config.json").exists()  # the directory is not locked to this run


def test_images_per_second_with_one_execution_per_epoch(launches, capfd):
    model_dir, status, stdout, stderr = launches("images_per_second", capfd)
    assert status == 0, stderr[-3000:]
    history = json.loads((model_dir / "summary.json").read_text())["history"]
    assert "images_per_second" not in history[0]  # the first epoch traces
    assert history[1]["images_per_second"] > 0
    # Off a terminal, progress lines within the epochs (here after every execution).
    assert "epoch 1/2: step 11/11, loss " in stdout
    assert "epoch 2/2: step 11/11, loss " in stdout
