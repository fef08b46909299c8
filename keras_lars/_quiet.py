"""Our programs start quietly, and check their flags before anything heavy loads.

When the main program is one of keras_lars's (a `keras-lars-*` console
script or `python -m keras_lars.tools...`) and the user did not set
TF_CPP_MIN_LOG_LEVEL, keras_lars's load brings in TensorFlow first, with its
log level at 2 (warnings and below hidden) and with the lines its C++ code
writes to stderr while loading (oneDNN, absl's InitializeLog notice, CPU
features) left out; any other line it printed then is passed on. A program
restarted by a tool (another Keras backend) does the same (QUIETED).

In our programs keras_lars and keras_lars.models also hold back their imports
(Keras, and so TensorFlow or JAX) until the program has checked its flags
(`holding`): what a bad flag needs (the model names, the checks of the
settings) imports nothing heavy, so it answers at once. The program then calls
`release`, which loads both packages (TensorFlow quietly, as above); a public
name used earlier releases them too, and TensorFlow imported earlier by anyone
is quieted all the same (_QuietTensorFlow).
"""

import contextlib
import importlib
import importlib.abc
import importlib.util
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
HELD = ("keras_lars", "keras_lars.models")  # the packages that wait for `release`, in order
_held = None  # holding(): None until first asked


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


@contextlib.contextmanager
def _chatter_dropped():
    """What the block writes to stderr (file descriptor 2: TensorFlow's C++
    too), written after it without the CHATTER lines."""
    with tempfile.TemporaryFile(mode="w+b") as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            yield
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


class _QuietTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """On sys.meta_path until TensorFlow is imported: its import, whoever
    asks for it (Keras, a tool), runs under _chatter_dropped."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader  # TensorFlow's own again
        with _chatter_dropped():
            self.loader.exec_module(module)


def quiet_tensorflow():
    """TensorFlow's import leaves out its start-up lines (see the module's
    docstring): imported here, or, while the packages are held, wherever it
    comes first."""
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    users = level is not None and level != os.environ.get(QUIETED)
    if users or "tensorflow" in sys.modules:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = os.environ[QUIETED] = "2"
    if not any(isinstance(finder, _QuietTensorFlow) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())
    if not holding():
        with contextlib.suppress(ImportError):  # the tool says what is missing
            import tensorflow  # noqa: F401


def holding():
    """Whether keras_lars and keras_lars.models hold back their imports of
    Keras: in one of our programs (`our_program`) until `release`."""
    global _held
    if _held is None:
        _held = our_program()
    return _held


def release():
    """The program's flags are good: the held packages load now (their
    modules run again, importing everything). Nothing where none is held."""
    global _held
    if not holding():
        return
    _held = False
    for name in HELD:
        if name in sys.modules:
            importlib.reload(sys.modules[name])


def released(package, name):
    """The module `package`'s public `name` (a module __getattr__'s answer while it is
    held): releases the packages and returns it."""
    if not holding():
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    if importlib.util.find_spec(f"{package}.{name}") is not None:  # compat, distribute
        return importlib.import_module(f"{package}.{name}")  # a module, without the rest
    release()
    return getattr(sys.modules[package], name)
