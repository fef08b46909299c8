"""The keras-lars-study command line: flags -> Study -> run_study, and its
exit codes (1 with one error line; train.EXIT_PREEMPTED when preempted).

The flags are checked first (`check_flags`), before Keras, TensorFlow or JAX
load (importing this module, study.py and the training tool's config imports
none of them); then the program loads them and runs the study (`main`).
"""

import sys

from absl import app
from absl import flags

from keras_lars import _quiet
from keras_lars.tools import settings
from keras_lars.tools import train
from keras_lars.tools.batch_study.study import PER_CELL
from keras_lars.tools.batch_study.study import STUDY_DEFAULTS
from keras_lars.tools.batch_study.study import StudySettings
from keras_lars.tools.batch_study.study import make_study
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import cli as train_cli


def define_flags(flag_values=flags.FLAGS):
    """The study's flags: its own settings and the training tool's shared ones."""
    settings.define_flags(StudySettings, flag_values)
    settings.define_flags(train.Config, flag_values, exclude=PER_CELL, defaults=STUDY_DEFAULTS)


def study_from_flags(flag_values=flags.FLAGS):
    """The Study of the parsed flags (ConfigError naming a bad one)."""
    own, _ = settings.from_flags(StudySettings, flag_values)
    shared, given = settings.from_flags(train.Config, flag_values, exclude=PER_CELL)
    return make_study(StudySettings(**own), shared, given)


def check_flags(flag_values=flags.FLAGS):
    """Exits with the line `main` would end with if a flag value is bad;
    imports no Keras (but for a schedule or --recipe) and runs nothing."""
    if not flag_values.backend:
        problem = train_cli.backend_problem(settings.keras_backend())
        if problem:
            sys.exit(problem)
    try:
        study_from_flags(flag_values)
    except ConfigError as error:
        sys.exit(f"error: {error}")


def main(argv, flag_values=flags.FLAGS):
    """Runs the study of parsed `flag_values` (absl's, by default; the tests
    parse their own to run the program in their process) on the backend they
    name."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    check_flags(flag_values)
    _quiet.release()  # the flags are good: Keras, TensorFlow, JAX load now
    import tensorflow as tf

    from keras_lars.tools import input_pipeline
    from keras_lars.tools import storage
    from keras_lars.tools.batch_study.runner import run_study
    from keras_lars.tools.batch_study.target_runner import run_target_study

    train.use_backend(flag_values.backend, "keras_lars.tools.batch_study")
    # Every cell builds a new model, which TensorFlow reports as "retracing".
    tf.get_logger().setLevel("ERROR")
    try:
        study = study_from_flags(flag_values)
        (run_target_study if study.search else run_study)(study)
    except train.Preempted as error:
        print(f"preempted: {error}", file=sys.stderr, flush=True)
        sys.exit(train.EXIT_PREEMPTED)
    except (ConfigError, input_pipeline.DataError, storage.StorageError) as error:
        sys.exit(f"error: {error}")


def run(argv=None):
    """The keras-lars-study entry point."""
    define_flags()
    app.run(main, argv, flags_parser=settings.parse_flags)
