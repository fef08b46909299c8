"""Our programs start without TensorFlow's C++ chatter (keras_lars/_quiet.py)."""

import os
import subprocess
import sys

import pytest

from keras_lars import _quiet

CHATTER = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796128023.345601    6441 port.cc:153] oneDNN custom operations are on. You "
    "may see slightly different numerical results due to floating-point round-off errors.",
    "I0000 00:00:1796128023.375623    6441 cpu_feature_guard.cc:227] This TensorFlow binary "
    "is optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild "
    "TensorFlow with the appropriate compiler flags.",
]


@pytest.mark.parametrize(
    "argv, ours",
    [
        (["python", "-m", "keras_lars.tools.train", "--model=alexnet"], True),
        (["python", "-u", "-m", "keras_lars.tools.plan"], True),
        (["python", "/usr/local/bin/keras-lars-train", "--eval"], True),
        (["python", "-m", "pytest", "-q"], False),
        (["python", "my_training.py", "-m", "keras_lars.tools.train"], False),
        (["python", "-c", "import keras_lars"], False),
        (["python"], False),
    ],
)
def test_only_our_programs_are_quieted(argv, ours):
    assert _quiet.our_program(argv) is ours


def test_the_filter_drops_the_chatter_and_keeps_every_other_line():
    kept = ["E0000 something TensorFlow really wants to say", "Traceback (most recent call last):"]
    assert [line for line in CHATTER + kept if not _quiet.CHATTER.search(line)] == kept


def _plan_with(environment):
    """A plan of keras-lars-plan (python -m), which loads Keras and TensorFlow
    once its flags are good: (its stdout, its stderr), with the environment given."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", _quiet.QUIETED)}
    env.update(environment)
    done = subprocess.run(
        [sys.executable, "-m", "keras_lars.tools.plan", "--devices=8"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


def test_a_program_shows_our_lines_only_unless_the_user_set_the_log_level():
    report, quiet = _plan_with({})
    assert quiet == ""
    # The user's own level: TensorFlow speaks as configured (at 0, its start-up lines).
    same, loud = _plan_with({"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert same == report
    assert _quiet.CHATTER.search(loud), loud[-3000:]
