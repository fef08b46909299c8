"""python -m keras_lars.tools.train"""

from keras_lars.tools.train import run

run()
