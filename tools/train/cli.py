"""The keras-lars-train entry point: flags in, one line and an exit status out.

0    trained (or already done)
1    `error: ...`: a bad flag, data, model dir or checkpoint, or divergence
75   preempted (SIGTERM/SIGHUP/SIGINT, or a lost peer): run the same command again

The flags are checked first (`check_flags`), before Keras, TensorFlow or JAX
load: importing this module, config.py and resolve.py imports none of them, so
a bad flag or value, and --help, answer at once. Then the program loads them
(keras_lars/_quiet.py, `release`) and `main` runs.
"""

import os
import sys

from absl import app
from absl import flags

from keras_lars import _quiet
from keras_lars.tools import settings
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import cluster
from keras_lars.tools.train.config import BACKENDS
from keras_lars.tools.train.config import Config
from keras_lars.tools.train.resolve import config_from_flags


def known_errors():
    """The errors `main` answers with one line `error: ...` (their modules load Keras)."""
    from keras_lars.tools import checkpoints
    from keras_lars.tools import input_pipeline
    from keras_lars.tools import storage
    from keras_lars.tools.train.loop import Diverged

    return (
        ConfigError,
        Diverged,
        input_pipeline.DataError,
        storage.StorageError,
        checkpoints.CheckpointError,
    )


def __getattr__(name):
    if name == "KNOWN_ERRORS":  # loaded on first use: known_errors()
        return known_errors()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backend_problem(backend):
    """The error line for Keras's backend `backend` if the tools do not run on it."""
    if backend in BACKENDS:
        return None
    return (
        f"error: Keras's backend is {backend!r} (KERAS_BACKEND or ~/.keras/keras.json); "
        f"the tools run on {' or '.join(BACKENDS)}: set --backend or KERAS_BACKEND."
    )


def use_backend(wanted, module):
    """Makes sure Keras runs on `wanted` (None: the configured backend): the
    program restarts itself (`python -m module` with the same arguments)
    with KERAS_BACKEND=wanted if Keras was loaded with another one, and exits
    with one error line on a backend the tools do not run on."""
    import keras

    loaded = keras.backend.backend()
    if wanted and wanted != loaded:
        sys.stdout.flush(), sys.stderr.flush()
        command = [sys.executable, "-m", module, *sys.argv[1:]]
        os.execve(sys.executable, command, dict(os.environ, KERAS_BACKEND=wanted))
    problem = backend_problem(loaded)
    if problem:
        sys.exit(problem)


def check_flags(values, given):
    """Exits with the line `main` would end with for flag values `values`
    (names `given` on the command line) if one is bad, or if the cluster's
    environment is (cluster.check_environment); imports no Keras (but for
    --recipe) and runs nothing."""
    if not values["backend"]:
        problem = backend_problem(settings.keras_backend())
        if problem:
            sys.exit(problem)
    try:
        config = config_from_flags(values, given)
        cluster.check_environment(config, values["backend"] or settings.keras_backend())
    except ConfigError as error:
        sys.exit(f"error: {error}")


def lost_peer(error, values):
    """The one line for a lost worker or process of the run (flag values
    `values`), naming the checkpoint a rerun resumes from; None otherwise."""
    import keras

    from keras_lars.tools.train.preemption import describe_lost_peer
    from keras_lars.tools.train.runtime import runtime_class

    backend = keras.backend.backend()
    who = "processes" if backend == "jax" else "workers"
    return describe_lost_peer(error, values, runtime_class(backend).collective_failed, who)


def main(argv, flag_values=flags.FLAGS):
    """The run of parsed `flag_values` (absl's, by default; the tests parse
    their own to run the program in their process)."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    values, given = settings.from_flags(Config, flag_values)
    check_flags(values, given)
    if values["backend"] and "keras" not in sys.modules:  # Keras loads on it: no restart
        os.environ["KERAS_BACKEND"] = values["backend"]
    try:
        _quiet.release()  # the flags are good: Keras, TensorFlow, JAX load now
    except ImportError as error:  # keras_lars's own line: the backend's package is missing
        if str(error).startswith("keras_lars"):
            sys.exit(f"error: {error}")
        raise
    import keras

    from keras_lars.tools.train.loop import train_and_evaluate
    from keras_lars.tools.train.preemption import EXIT_PREEMPTED
    from keras_lars.tools.train.preemption import Preempted

    use_backend(values["backend"], "keras_lars.tools.train")
    try:
        config = config_from_flags(values, given, log=lambda line: print(line, flush=True))
        train_and_evaluate(config)
    except Preempted as error:
        print(f"preempted: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_PREEMPTED)
    except Exception as error:
        line = lost_peer(error, values)
        if line:
            sys.stdout.flush()
            print(f"error: {line}", file=sys.stderr, flush=True)
            if keras.backend.backend() == "jax":
                # jax.distributed's shutdown at exit would wait for the lost
                # process until its heartbeat timeout, then abort.
                os._exit(EXIT_PREEMPTED)
            sys.exit(EXIT_PREEMPTED)
        if isinstance(error, known_errors()):
            sys.exit(f"error: {error}")
        raise


def run(argv=None):
    """Defines the flags and runs `main`."""
    settings.define_flags(Config)
    app.run(main, argv, flags_parser=settings.parse_flags)
