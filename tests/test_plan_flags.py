"""keras-lars-plan checks its flags first: an unknown flag, a bad value and
--help answer in one line (or the flags' listing) from the console script,
before the planner's models, Keras, TensorFlow or JAX load (tools/plan/cli.py).
The run itself: tests/test_plan.py and the other test_plan_* modules."""

import os
import subprocess
import sys
import sysconfig

import pytest

from keras_lars import _quiet
from keras_lars.tools import settings
from keras_lars.tools.plan.config import PlanSettings

SCRIPT = os.path.join(sysconfig.get_path("scripts"), "keras-lars-plan")
HEAVY = ("keras", "tensorflow", "jax")
BAD = [
    ("--no_such_flag", "error: Unknown command line flag 'no_such_flag'."),
    ("--devices=abc", "error: flag --devices=abc: invalid literal for int() with base 10: 'abc'."),
    ("--devices=0", "error: --devices=0: must be >= 1."),
]


def _plan(*arguments, python_options=()):
    """The console script run on `arguments` as a user runs it (from a folder
    holding no tools/, without the tests' TensorFlow log level): its
    CompletedProcess."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", _quiet.QUIETED)}
    return subprocess.run(
        [sys.executable, *python_options, SCRIPT, *arguments],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(SCRIPT),
        env=env,
        timeout=300,
    )


def _imported(stderr):
    """The top-level packages `python -X importtime` says were imported."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize("flag, line", BAD)
def test_a_bad_flag_or_value_is_one_line_and_status_1(flag, line):
    done = _plan(flag)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", line + "\n")


def test_help_lists_every_setting():
    done = _plan("--help")
    assert done.returncode == 1, done.stderr  # absl's --help ends with status 1
    assert "USAGE:" in done.stdout and done.stderr == ""
    for field in settings.fields(PlanSettings):
        assert f"  --{field.name}:" in done.stdout or f"  --[no]{field.name}:" in done.stdout


def test_no_keras_tensorflow_or_jax_before_the_flags_are_good():
    for flag in [flag for flag, _ in BAD] + ["--help"]:
        done = _plan(flag, python_options=("-X", "importtime"))
        imported = _imported(done.stderr)
        assert "absl" in imported and "keras_lars" in imported, done.stderr[-2000:]
        assert not imported & set(HEAVY), f"{flag}: {sorted(imported & set(HEAVY))}"
