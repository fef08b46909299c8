"""`python -m keras_lars.tools.batch_study`: the keras-lars-study command."""

from keras_lars.tools import batch_study
from keras_lars.tools.batch_study.cli import run

# absl's --help shows the main module's docstring: the study's description.
__doc__ = batch_study.__doc__

if __name__ == "__main__":
    run()
