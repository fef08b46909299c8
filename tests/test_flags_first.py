"""The programs check their flags before Keras, TensorFlow or JAX load:
a bad flag, a bad value and --help answer without importing them
(keras_lars/_quiet.py's hold, tools/train/cli.py's check_flags), with the
line and exit status they always had."""

import os
import subprocess
import sys

import pytest

from tests.launcher_tasks import slurm_env

HEAVY = ("tensorflow", "jax", "keras")

# console script, its module (python -m), a bad value and its line, a flag of its --help
PROGRAMS = [
    (
        "keras-lars-train",
        "keras_lars.tools.train",
        "--global_batch_size=-1",
        "error: --global_batch_size=-1: must be >= 1.",
        "--global_batch_size",
    ),
    (
        "keras-lars-study",
        "keras_lars.tools.batch_study",
        "--seeds=0",
        "error: --seeds=0: must be >= 1.",
        "--batch_sizes",
    ),
    (
        "keras-lars-make-tfrecords",
        "keras_lars.tools.make_tfrecords",
        "--jpeg_quality=0",
        "error: --jpeg_quality=0: must be in [1, 101).",
        "--input_dir",
    ),
]


def _command(script, module):
    """The console script as installed next to this Python, else `python -m module`."""
    path = os.path.join(os.path.dirname(sys.executable), script)
    return [path] if os.path.isfile(path) else ["-m", module]


def _run(script, module, *argv):
    """(exit status, stdout, stderr lines but -X importtime's, modules imported)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *_command(script, module), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.expanduser("~"),  # not the repository: the installed package
    )
    lines, imported = [], set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[1].strip())
        else:
            lines.append(line)
    return done.returncode, done.stdout, lines, imported


def _heavy(imported):
    return sorted(name for name in imported if name.split(".")[0] in HEAVY)


def _imported(done):
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }


def test_the_import_lines_are_read():
    """The checks below can fail: the lines name what was imported, Keras included."""
    _, _, _, imported = _run("keras-lars-train", "keras_lars.tools.train", "--no_such_flag")
    assert "keras_lars.tools.train.config" in imported
    code = "import keras_lars; keras_lars.LARS"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True
    )
    assert "keras" in _heavy(_imported(done))


@pytest.mark.parametrize("script, module, bad_value, line, flag", PROGRAMS)
def test_a_bad_flag_answers_before_keras_loads(script, module, bad_value, line, flag):
    status, _, lines, imported = _run(script, module, "--no_such_flag")
    assert status == 1
    assert lines == ["error: Unknown command line flag 'no_such_flag'."]
    assert _heavy(imported) == []


@pytest.mark.parametrize(
    "value, line",
    [
        (
            "--optimizer=adamw",
            "error: flag --optimizer=adamw: value should be one of <lars|lamb|sgd|nesterov|adam>.",
        ),
        (
            "--global_batch_size=many",
            "error: flag --global_batch_size=many: invalid literal for int() with base 10: 'many'.",
        ),
    ],
)
def test_a_value_absl_refuses_is_one_line_too(value, line):
    """Not absl's "FATAL Flags parsing error" and its hint: the settings' form."""
    status, _, lines, imported = _run("keras-lars-train", "keras_lars.tools.train", value)
    assert (status, lines) == (1, [line])
    assert _heavy(imported) == []


@pytest.mark.parametrize("script, module, bad_value, line, flag", PROGRAMS)
def test_a_bad_value_answers_its_line_before_keras_loads(script, module, bad_value, line, flag):
    status, _, lines, imported = _run(script, module, bad_value)
    assert (status, lines) == (1, [line])
    assert _heavy(imported) == []


@pytest.mark.parametrize("script, module, bad_value, line, flag", PROGRAMS)
def test_help_answers_before_keras_loads(script, module, bad_value, line, flag):
    status, stdout, _, imported = _run(script, module, "--help")
    assert status == 1  # absl's --help
    assert flag in stdout
    assert _heavy(imported) == []


def test_a_bad_combination_answers_before_keras_loads():
    status, _, lines, imported = _run(
        "keras-lars-train", "keras_lars.tools.train", "--strategy=mirrored", "--backend=jax"
    )
    assert (status, lines) == (
        1,
        ["error: --strategy=mirrored: needs --backend=tensorflow (on JAX use --distribution)."],
    )
    assert _heavy(imported) == []


def test_a_recipe_is_applied_and_checked_before_keras_loads():
    # keras_lars.recipes is plain Python: the MLPerf table, then the flag's check.
    status, _, lines, imported = _run(
        "keras-lars-train", "keras_lars.tools.train", "--recipe=mlperf", "--base_learning_rate=-1"
    )
    assert (status, lines[-1:]) == (1, ["error: --base_learning_rate=-1.0: must be > 0."])
    assert _heavy(imported) == []


def test_the_recipe_is_still_a_registered_keras_object():
    import keras

    import keras_lars

    recipe = keras_lars.resnet50_lars_recipe(32768)
    assert keras.saving.get_registered_object("keras_lars>LarsRecipe") is keras_lars.LarsRecipe
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(recipe))
    assert again == recipe


def test_a_held_library_loads_on_its_first_public_name(tmp_path):
    """In our programs (a keras-lars-* script here) keras_lars and
    keras_lars.models wait; their light facts need nothing, a public name
    loads them."""
    script = tmp_path / "keras-lars-probe.py"
    script.write_text(
        "import sys\n"
        "import keras_lars.models\n"
        "from keras_lars.tools.train.config import Config\n"
        "Config()\n"
        "print(keras_lars.models.NAMES[0], 'keras' in sys.modules)\n"
        "print(keras_lars.compat.__name__, 'LARS' in vars(keras_lars))\n"
        "print(keras_lars.LARS.__name__, 'keras' in sys.modules)\n"
        "print(keras_lars.models.BUILDERS['resnet18'].__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.stdout.split("\n") == [
        "resnet18 False",
        "keras_lars.compat False",  # a submodule loads alone
        "LARS True",
        "resnet18",
        "",
    ], done.stderr


def test_the_data_sets_of_the_flags_are_the_sources():
    from keras_lars.tools import input_pipeline
    from keras_lars.tools.datasets import DATASETS

    assert list(DATASETS) == list(input_pipeline.SOURCES)


def test_the_model_names_are_the_builders():
    from keras_lars import models

    assert tuple(models.BUILDERS) == models.NAMES
    assert all(models.BUILDERS[name].__name__ == name for name in models.NAMES)


def test_the_backend_read_without_keras_is_keras_s(tmp_path):
    """settings.keras_backend in a program holding Keras back (a keras-lars-*
    script) reads what Keras reads."""
    script = tmp_path / "keras-lars-backend.py"
    script.write_text(
        "import sys\n"
        "from keras_lars.tools import settings\n"
        "print(settings.keras_backend(), 'keras' in sys.modules)\n"
    )
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "keras.json").write_text('{"backend": "jax"}')
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "KERAS_HOME")}
    for environment in [
        {"KERAS_HOME": str(tmp_path / "home")},
        {"KERAS_HOME": str(tmp_path / "home"), "KERAS_BACKEND": "tensorflow"},
        {"KERAS_HOME": str(tmp_path / "empty")},
    ]:
        done = [
            subprocess.run(
                [sys.executable, *command],
                capture_output=True,
                text=True,
                env={**env, **environment},
                timeout=300,
            )
            for command in (
                [str(script)],
                ["-c", "import keras; print(keras.backend.backend(), True)"],
            )
        ]
        guess, keras_s = (d.stdout.strip().split("\n")[-1].split() for d in done)
        assert guess[1] == "False", done[0].stderr
        assert guess[0] == keras_s[0], environment


@pytest.mark.parametrize(
    "argv, environment, line",
    [
        (
            ["--strategy=multi_worker", "--cluster=slurm"],
            {"SLURM_JOB_ID": "5"},
            "error: --cluster=slurm: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, "
            "SLURM_STEP_TASKS_PER_NODE are not set: run the tool as a task of srun (see "
            "docs/launchers.md)",
        ),
        (
            ["--strategy=multi_worker"],
            {},
            "error: --strategy=multi_worker --cluster=auto: found no cluster here: TF_CONFIG is "
            "not set and neither are SLURM's SLURM_JOB_ID and SLURM_PROCID (run it under srun); "
            "set TF_CONFIG, or see docs/launchers.md",
        ),
        (
            ["--backend=jax", "--num_processes=0"],
            {**slurm_env(5, 0), "JAX_COORDINATOR_PORT": "abc"},
            "error: --num_processes=0 (SLURM detected): JAX_COORDINATOR_PORT='abc' (the "
            "coordinator's port under SLURM) is not a port, a whole number in [1, 65535]",
        ),
    ],
)
def test_a_start_outside_its_cluster_answers_before_keras_loads(
    argv, environment, line, monkeypatch, tmp_path
):
    """The cluster's environment is checked with the flags
    (tools/train/cluster.check_environment): outside srun, the tool ends in
    its line at once, not after TensorFlow's 7 s start."""
    for name in os.environ:
        if name.startswith(("SLURM", "TF_CONFIG")):
            monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    model_dir = tmp_path / "run"
    status, _, lines, imported = _run(
        "keras-lars-train", "keras_lars.tools.train", *argv, f"--model_dir={model_dir}"
    )
    assert (status, lines) == (1, [line])
    assert _heavy(imported) == []
    assert not model_dir.exists()
