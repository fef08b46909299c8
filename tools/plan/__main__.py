"""`python -m keras_lars.tools.plan`: the keras-lars-plan program."""

from keras_lars.tools.plan.cli import run

if __name__ == "__main__":
    run()
