"""keras-lars-plan's command line run in the test's process (its ~7 s start
saved): tests/test_plan_target.py keeps the program's own processes."""

import contextlib
import io
import sys

from absl import flags

from keras_lars.tools import settings
from keras_lars.tools.plan import cli


def run_plan(*argv):
    """(exit status, stdout, stderr) of keras-lars-plan `argv`: absl parses
    it with the planner's flags, as the program does (a refused value ends in
    parse_flags' one line), then cli.main's steps. The status is the
    interpreter's: 0, or 1 with SystemExit's text on stderr."""
    flag_values = flags.FlagValues()
    settings.define_flags(cli.PlanSettings, flag_values)
    out, err = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            settings.parse_flags(["keras-lars-plan", *argv], flag_values)
            options = settings.options_from_flags(cli.PlanSettings, flag_values)
            cli.run_options(options, settings.from_flags(cli.PlanSettings, flag_values)[1])
        except SystemExit as stopped:
            if stopped.code is None or isinstance(stopped.code, int):
                status = stopped.code or 0
            else:
                print(stopped.code, file=sys.stderr)
                status = 1
    return status, out.getvalue(), err.getvalue()
