"""The tools' settings schema (keras_lars.tools.settings), imports without side
effects, and what the built wheel installs."""

import dataclasses
import os
import subprocess
import sys
import zipfile

import pytest
from absl import flags

from keras_lars.tools import settings
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import setting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Example:
    name: str = setting("a", "A choice.", choices=("a", "b"))
    count: int = setting(3, "A count.", check=at_least(1))
    rate: float = setting(
        0.5,
        "A rate.",
        check=lambda value, config: None if value < config.count else "must be below --count",
    )
    quiet: bool = setting(False, "A switch.")
    items: tuple = setting(("x", "y"), "Some items.", choices=("x", "y", "z"))
    where: str = setting(None, "An optional path.")
    not_a_setting: int = 7

    def __post_init__(self):
        settings.check(self)


def parse(*argv, exclude=(), defaults=None):
    flag_values = flags.FlagValues()
    settings.define_flags(Example, flag_values, exclude=exclude, defaults=defaults)
    flag_values(["program", *argv])
    return settings.from_flags(Example, flag_values, exclude=exclude)


def test_flags_follow_the_declarations():
    values, given = parse()
    assert values == {
        "name": "a",
        "count": 3,
        "rate": 0.5,
        "quiet": False,
        "items": ("x", "y"),
        "where": None,
    }
    assert given == set()
    values, given = parse(
        "--name=b", "--count=9", "--rate=2", "--quiet", "--items=z", "--where=/tmp/x"
    )
    assert values == {
        "name": "b",
        "count": 9,
        "rate": 2.0,
        "quiet": True,
        "items": ("z",),
        "where": "/tmp/x",
    }
    assert given == {"name", "count", "rate", "quiet", "items", "where"}
    assert Example(**values) == Example("b", 9, 2.0, True, ("z",), "/tmp/x")
    with pytest.raises(flags.IllegalFlagValueError):
        parse("--name=c")
    with pytest.raises(flags.IllegalFlagValueError):
        parse("--count=many")
    values, _ = parse(exclude=("count",), defaults={"rate": 0.25})
    assert "count" not in values and values["rate"] == 0.25


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(name="c"), "--name=c: 'c' is not one of a, b."),
        (dict(count=0), "--count=0: must be >= 1."),
        (dict(count=2.5), "--count=2.5: must be of type int."),
        (dict(count=True), "--count=True: must be of type int."),
        (dict(rate=5.0), "--rate=5.0: must be below --count."),
        (dict(quiet="yes"), "--quiet=yes: must be of type bool."),
        (dict(items=("x", "w")), "--items=x,w: 'w' is not one of x, y, z."),
        (dict(items="x"), "--items=x: must be a list."),
        (dict(where=3), "--where=3: must be of type str."),
    ],
)
def test_checks_name_the_flag_and_value(bad, message):
    with pytest.raises(ConfigError) as error:
        Example(**bad)
    assert str(error.value) == message


def test_options_from_flags_builds_or_ends_with_one_line():
    flag_values = flags.FlagValues()
    settings.define_flags(Example, flag_values)
    flag_values(["program", "--count=4"])
    assert settings.options_from_flags(Example, flag_values).count == 4
    flag_values(["program", "--count=0"])
    with pytest.raises(SystemExit) as stop:
        settings.options_from_flags(Example, flag_values)
    assert stop.value.code == "error: --count=0: must be >= 1."


def test_ints_become_floats_and_lists_tuples():
    example = Example(rate=1, items=["z"])
    assert example.rate == 1.0 and isinstance(example.rate, float)
    assert example.items == ("z",)


def test_markdown_table_has_a_row_per_setting():
    table = settings.markdown_table(Example, defaults={"count": 4}).splitlines()
    assert table[:2] == ["| flag | default | meaning |", "|---|---|---|"]
    assert table[2] == "| `--name` | `a` | A choice. One of: a, b. |"
    assert table[3] == "| `--count` | `4` | A count. |"
    assert table[6] == "| `--items` | `x,y` | Some items. Any of: x, y, z. |"
    assert table[7] == "| `--where` |  | An optional path. |"
    assert len(table) == 2 + 6


def test_importing_any_tool_changes_no_environment_and_defines_no_flag():
    modules = [
        "keras_lars",
        "keras_lars.models",
        "keras_lars.tools.settings",
        "keras_lars.tools.storage",
        "keras_lars.tools.input_pipeline",
        "keras_lars.tools.checkpoints",
        "keras_lars.tools.train",
        "keras_lars.tools.batch_study",
        "keras_lars.tools.make_tfrecords",
        "keras_lars.tools.benchmark_train",
        "keras_lars.tools.benchmark_optimizers",
        "keras_lars.tools.plan",
        "keras_lars.tools.benchmark_allreduce",
        "keras_lars.tools.benchmark_noise_scale",
        "keras_lars.tools.benchmark_plan",
    ]
    script = (
        "import importlib, os, sys\n"
        "import keras, matplotlib, sklearn, tensorflow  # their own flags and variables\n"
        "from absl import app, flags, logging\n"
        "environment, defined = dict(os.environ), set(flags.FLAGS)\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "changed = set(os.environ.items()) ^ set(environment.items())\n"
        "assert not changed, changed\n"
        "assert set(flags.FLAGS) == defined, set(flags.FLAGS) - defined\n"
        "print('clean')\n"
    )
    environment = {
        k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL")
    }
    process = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0 and process.stdout.strip() == "clean", process.stderr[-3000:]


def test_the_repository_folders_import_under_one_name_only():
    for folder in ("models", "tools"):
        process = subprocess.run(
            [sys.executable, "-c", f"import {folder}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert process.returncode != 0
        assert f"import keras_lars.{folder}, not {folder}" in process.stderr


@pytest.mark.subprocess
def test_the_wheel_installs_one_package_and_three_programs(tmp_path):
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-w",
            str(tmp_path),
            ROOT,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    (wheel,) = [name for name in os.listdir(tmp_path) if name.endswith(".whl")]
    with zipfile.ZipFile(tmp_path / wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"keras_lars"}
    for module in (
        "keras_lars/__init__.py",
        "keras_lars/lars.py",
        "keras_lars/models/resnet.py",
        "keras_lars/models/__init__.py",
        "keras_lars/tools/__init__.py",
        "keras_lars/tools/train/__init__.py",
        "keras_lars/tools/train/runtime_jax.py",
        "keras_lars/tools/plan/records.py",
        "keras_lars/tools/batch_study/cli.py",
        "keras_lars/tools/input_pipeline/sources.py",
        "keras_lars/compat/_registry.py",
    ):
        assert module in names
    assert not [n for n in names if "/tests/" in n or n.startswith(("models/", "tools/"))]
    for line in (
        "keras-lars-train = keras_lars.tools.train:run",
        "keras-lars-study = keras_lars.tools.batch_study:run",
        "keras-lars-make-tfrecords = keras_lars.tools.make_tfrecords:run",
        "keras-lars-plan = keras_lars.tools.plan:run",
    ):
        assert line in scripts
