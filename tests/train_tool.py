"""The training tool's test helpers, for tests/test_train_*.py and the other
modules that run the tool: its command and its runs in child processes (as
users run it, `keras-lars-train ...` or `python -m keras_lars.tools.train ...`;
two at a time where several are needed: tracing a Keras model is
single-threaded), weights files, ImageNet-format records, and a command line
parsed by absl with the tool's flags.
"""

import concurrent.futures
import hashlib
import io
import os
import subprocess
import sys

import h5py
import numpy as np
import tensorflow as tf
from absl import flags
from PIL import Image

from keras_lars.tools import input_pipeline
from keras_lars.tools import settings
from keras_lars.tools import train
from tests.processes import CHILD_TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = CHILD_TIMEOUT


def tool_command(*args):
    return [sys.executable, "-m", "keras_lars.tools.train", *args]


# The console script that the package installs next to this interpreter.
TRAIN_SCRIPT = os.path.join(os.path.dirname(sys.executable), "keras-lars-train")


def run_tool(args, timeout=TIMEOUT, command=tool_command, **options):
    """The tool run to its end (options: more of subprocess.run's arguments)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        command(*args),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **options,
    )


def start_tool(args, **streams):
    """The tool started in the background (streams: Popen's stdout/stderr/text)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(tool_command(*args), cwd=ROOT, env=env, **streams)


def run_tools(arg_lists, parallel=2):
    """Runs the tool once per argument list, `parallel` at a time."""
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(run_tool, arg_lists))


# The keys of a history record or an evaluation that time the run: they
# differ between runs whose numbers are equal.
TIMINGS = ("seconds", "evaluation_seconds", "images_per_second")


def untimed(records):
    """History records or evaluations without their TIMINGS."""
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records]


def fingerprint(directory):
    """{relative path: sha256} of every file under `directory`."""
    found = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return found


def h5_arrays(path):
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, item: (
                arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
            )
        )
    return arrays


def assert_same_weights(expected_path, actual_path, at_least):
    """Both weights files hold the same arrays (more than `at_least`), bit for bit."""
    expected, actual = h5_arrays(expected_path), h5_arrays(actual_path)
    assert expected.keys() == actual.keys() and len(expected) > at_least
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)


def jpeg_bytes(pixels, quality=95):
    out = io.BytesIO()
    Image.fromarray(np.asarray(pixels, np.uint8)).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def example(jpeg, label, key="image/encoded"):
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
        )
    ).SerializeToString()


def write_records(path, records):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def unnormalize(images):
    return np.asarray(images) * input_pipeline.STDDEV_RGB + input_pipeline.MEAN_RGB


def console_script(*args):
    return [TRAIN_SCRIPT, *args]


def run_main(*argv):
    """keras-lars-train `argv` in this process, without its ~6 s start: absl
    parses `argv` with the tool's flags and cli.main runs. Returns the exit
    status as the interpreter makes it: 0, SystemExit's number, or 1 with its
    text printed to stderr (sys.exit("error: ...")). Not for --help (absl's
    app handles it) nor another --backend (main restarts the program)."""
    from keras_lars.tools.train import cli

    assert not any(a.startswith(("--help", "--backend")) for a in argv), argv
    flag_values = flags.FlagValues()
    settings.define_flags(train.Config, flag_values)
    try:
        settings.parse_flags(["train", *argv], flag_values)
        cli.main(["train"], flag_values)
    except SystemExit as stopped:
        if stopped.code is None or isinstance(stopped.code, int):
            return stopped.code or 0
        print(stopped.code, file=sys.stderr, flush=True)
        return 1
    return 0


def parse(*argv):
    """Config from a command line, through absl's parser and the tool's flags."""
    flag_values = flags.FlagValues()
    settings.define_flags(train.Config, flag_values)
    flag_values(["train", *argv])
    return train.config_from_flags(*settings.from_flags(train.Config, flag_values))
