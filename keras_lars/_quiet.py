"""Our programs start quietly: TensorFlow's start-up chatter left out.

When the main program is one of keras_lars's (a `keras-lars-*` console
script or `python -m keras_lars.tools...`) and the user did not set
TF_CPP_MIN_LOG_LEVEL, keras_lars's import brings in TensorFlow first, with its
log level at 2 (warnings and below hidden) and with the lines its C++ code
writes to stderr while loading (oneDNN, absl's InitializeLog notice, CPU
features) left out; any other line it printed then is passed on. A program
restarted by a tool (another Keras backend) does the same (QUIETED).
"""

import contextlib
import os
import re
import sys
import tempfile

CHATTER = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations are on"
    r"|cpu_feature_guard|To enable the following instructions|rebuild TensorFlow with"
    r"|Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered"
    r"|TF-TRT Warning|Could not find cuda drivers|This TensorFlow binary is optimized"
)

QUIETED = "KERAS_LARS_QUIETED_TF"  # the log level set here, for restarted programs


def our_program(argv=None):
    """Whether the command line `argv` (default: this process's) runs one of
    our programs: `python [options] -m keras_lars.tools...` or a
    `keras-lars-*` console script."""
    argv = sys.orig_argv if argv is None else argv
    position = 1
    while position < len(argv):  # the interpreter's options, up to what it runs
        argument = argv[position]
        if argument == "-m":
            module = argv[position + 1] if position + 1 < len(argv) else ""
            return module.startswith("keras_lars.tools.")
        if argument == "-c" or not argument.startswith("-") or argument == "-":
            return os.path.basename(argument).startswith("keras-lars-")
        position += 2 if argument in ("-X", "-W") else 1
    return False


def quiet_tensorflow():
    """Imports TensorFlow without its start-up lines (see the module's docstring)."""
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    users = level is not None and level != os.environ.get(QUIETED)
    if users or "tensorflow" in sys.modules:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = os.environ[QUIETED] = "2"
    with tempfile.TemporaryFile(mode="w+b") as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            with contextlib.suppress(ImportError):  # the tool says what is missing
                import tensorflow  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        kept = [
            line
            for line in captured.read().decode(errors="replace").splitlines(keepends=True)
            if not CHATTER.search(line)
        ]
    sys.stderr.write("".join(kept))
    sys.stderr.flush()
