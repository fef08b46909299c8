"""The layout file's old name: the module is keras_lars.tools.layout_file
(tools/layout_file.py), beside both tools, since keras-lars-plan writes the
file and keras-lars-train reads it (the train package no longer imports the
plan package). Kept until collectives.py and tests/test_damaged_input.py
import the new name."""

from keras_lars.tools.layout_file import *  # noqa: F403
