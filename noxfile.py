"""The TensorFlow x Keras version matrix, one fresh virtual environment per pair.

    nox -s matrix                           # every pair: the whole suite
    nox -t oldest -- tests/test_lars.py     # one pair (tags: oldest, newest), some tests
    nox -s oldest_ci                        # CI's stage: the oldest pair, all but the
                                            # version-independent modules (tests/tiers.py)
    nox -s matrix_table                     # docs/versions.md's table from the results
    nox -s wheel                            # the sdist and wheel built and twine-checked, the
                                            # wheel installed and used from elsewhere

Each pair installs the README's test extras (plus the `jax` extra, in the same
resolver call so that it picks a jax that fits that TensorFlow) and pins
`tensorflow-cpu` and `keras`. Each run appends a row to docs/matrix-results.tsv
(committed: date, pair, jax, passed, failed, errors, skipped, seconds, scope, and
the JAX road's passed/failed: the tests that run Keras's JAX backend), from
which `matrix_table` writes the table of docs/versions.md.
uv makes the environments when it is installed (pip install nox uv).
"""

import datetime
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ElementTree

import nox

nox.options.default_venv_backend = "uv|virtualenv"
# uv installs without byte-compiling (pip compiles at install). Where
# PYTHONDONTWRITEBYTECODE is set (this project's machines and CI's), every process
# would then compile the sources of each package it imports: `import tensorflow`
# took 10.1 s of CPU on the oldest pair uncompiled, 4.2 s compiled (2026-12-07).
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")
nox.options.sessions = ["matrix"]

# (TensorFlow, Keras): each TensorFlow line with the Keras of its release
# (never below the floor, 3.8) and with the newest Keras 3.
PAIRS = [
    ("2.17.1", "3.8.0"),
    ("2.17.1", "3.15.1"),
    ("2.18.1", "3.8.0"),
    ("2.18.1", "3.15.1"),
    ("2.19.1", "3.10.0"),
    ("2.19.1", "3.15.1"),
    ("2.20.0", "3.11.3"),
    ("2.20.0", "3.15.1"),
    ("2.21.0", "3.15.1"),
]
OLDEST, NEWEST = PAIRS[0], PAIRS[-1]
RESULTS = os.path.join("docs", "matrix-results.tsv")
COLUMNS = [
    "date",
    "tensorflow",
    "keras",
    "jax",
    "passed",
    "failed",
    "errors",
    "skipped",
    "seconds",
    "scope",
    "jax_passed",
    "jax_failed",
    "commit",
]
VERSIONS_PAGE = os.path.join("docs", "versions.md")
# The wheel session's run: the quick start's job cut to 2 epochs (warmup 1) of
# the first 256 digits (2 steps each; was all 1,438, 11 steps each: ~2 of CI's
# minutes for the same code).
SHORTENED = ["--train_epochs=2", "--warmup_epochs=1", "--train_examples=256"]
# As README's test command: 2 processes, the several-process tests in one
# (tests/tiers.py's SEVERAL_PROCESSES).
IN_TWO_PROCESSES = ["-q", "-n", "2", "--dist", "loadgroup"]
TABLE_START, TABLE_END = "<!-- matrix: nox -s matrix_table -->", "<!-- /matrix -->"


def _jax_pins(keras):
    """Keras 3.8/3.9's JAX backend calls jax.spmd_mode, which jax 0.6.1 removed."""
    major, minor = (int(part) for part in keras.split(".")[:2])
    return ["jax<0.6.1"] if (major, minor) < (3, 10) else []


def _tags(pair):
    return [tag for tag, edge in (("oldest", OLDEST), ("newest", NEWEST)) if pair == edge]


@nox.session
@nox.parametrize(
    "tensorflow, keras",
    [nox.param(tf, k, id=f"tf{tf}-keras{k}", tags=_tags((tf, k))) for tf, k in PAIRS],
)
def matrix(session, tensorflow, keras):
    """The test suite (or the tests named after --) on one pair."""
    scope = "some tests" if session.posargs else "whole suite"
    _suite(session, tensorflow, keras, session.posargs, scope)


@nox.session
def oldest_ci(session):
    """CI's oldest-pair stage: the whole suite on the oldest pair but the
    modules that exercise no version-dependent path and thirteen single-process
    tests (tests/tiers.py's VERSION_INDEPENDENT and
    NEWEST_ONLY_IN_CI, each with its reason), which the newest pair runs."""
    selection = "not version_independent and not newest_only_in_ci"
    _suite(session, *OLDEST, ["-m", selection], "all but version-independent, newest-only")


def _suite(session, tensorflow, keras, pytest_args, scope):
    """Installs the pair in the session's environment and runs pytest with
    `pytest_args`, appending its row (`scope`) to RESULTS."""
    session.install(
        "-e",
        ".[cpu,tools,test,jax]",
        f"tensorflow-cpu=={tensorflow}",
        f"keras=={keras}",
        *_jax_pins(keras),
        "pip",  # uv makes environments without it; the wheel test builds with it
    )
    shown = session.run(
        "python",
        "-c",
        "import tensorflow, keras, jax; print(tensorflow.__version__, keras.__version__, "
        "jax.__version__)",
        silent=True,
    )
    if shown is None:  # nox --install-only
        return
    versions = shown.split()[-3:]
    print("tensorflow {} keras {} jax {}".format(*versions))
    report = os.path.join(session.create_tmp(), "junit.xml")
    commit, started = _commit(), time.time()
    try:
        session.run(
            "python", "-m", "pytest", *IN_TWO_PROCESSES, f"--junitxml={report}", *pytest_args
        )
    finally:
        _record(versions, report, time.time() - started, scope, commit)


def _commit():
    """The tested commit (git's short hash), "+changes" when tracked files
    other than the results differ from it; "-" outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                f":!{RESULTS}",
                f":!{VERSIONS_PAGE}",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "-"
    return head + ("+changes" if changed else "")


def _on_jax(case):
    """Whether a junit test case runs Keras's JAX backend (the JAX road): its
    `jax_road` property (tests/tiers.py, since 2026-12-04), else its id
    names jax."""
    if any(p.get("name") == "jax_road" for p in case.iter("property")):
        return True
    name = f"{case.get('classname', '')}::{case.get('name', '')}".lower()
    return "jax" in name


def _record(versions, report, seconds, scope, commit):
    if not os.path.exists(report):
        return
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    jax_cases = [case for case in suite.iter("testcase") if _on_jax(case)]
    jax_failed = sum(
        1
        for case in jax_cases
        if case.find("failure") is not None or case.find("error") is not None
    )
    jax_skipped = sum(1 for case in jax_cases if case.find("skipped") is not None)
    row = [
        datetime.date.today().isoformat(),
        *versions,
        passed,
        counts["failures"],
        counts["errors"],
        counts["skipped"],
        f"{seconds:.0f}",
        scope,
        len(jax_cases) - jax_failed - jax_skipped,
        jax_failed,
        commit,
    ]
    new = not os.path.exists(RESULTS)
    with open(RESULTS, "a") as f:
        if new:
            f.write("\t".join(COLUMNS) + "\n")
        f.write("\t".join(map(str, row)) + "\n")


@nox.session
def wheel(session):
    """Builds the sdist and the wheel (`python -m build`: the wheel from the
    sdist), checks both with `twine check --strict` (the metadata and README
    as PyPI renders it), installs the wheel (not editable) with the README's
    tool extras in a fresh environment, and from an unrelated directory checks
    that it installed one top-level package at keras_lars.__version__, runs
    the four programs, builds ResNet-50 with its 25,557,032 parameters and
    trains 2 epochs."""
    dist = os.path.join(session.create_tmp(), "dist")
    shutil.rmtree(dist, ignore_errors=True)
    session.install("build", "twine")
    session.run("python", "-m", "build", "--outdir", dist, ".", silent=True)
    built = sorted(os.listdir(dist))
    session.run("twine", "check", "--strict", *(os.path.join(dist, name) for name in built))
    (wheel_file,) = [name for name in built if name.endswith(".whl")]
    session.install(f"{os.path.join(dist, wheel_file)}[cpu,tools]")
    elsewhere = os.path.join(session.create_tmp(), "elsewhere")
    os.makedirs(elsewhere, exist_ok=True)
    session.chdir(elsewhere)
    session.run(
        "python",
        "-c",
        "import keras_lars; from importlib import metadata; v = keras_lars.__version__; "
        f"print('keras_lars', v, 'built as', {built!r}); "
        "assert metadata.version('keras-lars') == v, metadata.version('keras-lars'); "
        f"assert all(f'-{{v}}' in name for name in {built!r})",
    )
    # What `pip show -f keras-lars` lists: every installed file but the scripts.
    session.run(
        "python",
        "-c",
        "from importlib import metadata; tops = {str(f).split('/')[0] "
        "for f in metadata.files('keras-lars') if not str(f).startswith('..')}; "
        "print('installed top-level entries:', sorted(tops)); "
        "assert {t for t in tops if not t.endswith('.dist-info')} == {'keras_lars'}",
    )
    for program, flag in (
        ("keras-lars-train", "--global_batch_size"),
        ("keras-lars-study", "--batch_sizes"),
        ("keras-lars-make-tfrecords", "--input_dir"),
        ("keras-lars-plan", "--algorithm"),
    ):
        # absl's --help exits with status 1.
        shown = session.run(program, "--help", silent=True, success_codes=[0, 1])
        if flag not in shown:
            session.error(f"{program} --help does not list {flag}:\n{shown}")
    session.run(
        "python",
        "-c",
        "import keras_lars.models, numpy; "
        "n = sum(int(numpy.prod(v.shape)) for v in "
        "keras_lars.models.resnet50().trainable_weights); "
        "print('ResNet-50 trainable parameters:', n); assert n == 25557032, n",
    )
    # The default run cut to two epochs of 256 digits, into runs/digits, from the
    # installed wheel (test_train_runs' test_default_run_writes_checkpoints_logs_and_summary
    # runs it from the source tree; the whole 15-epoch job's accuracy is README's quick
    # start).
    session.run("keras-lars-train", *SHORTENED)
    # The same run through python -m: found finished, nothing retrained.
    session.run("python", "-m", "keras_lars.tools.train", *SHORTENED)


@nox.session(venv_backend="none")
def matrix_table(session):
    """Rewrites docs/versions.md's table: the newest whole-suite result of each pair."""
    latest = {}
    with open(RESULTS) as f:
        rows = [dict(zip(COLUMNS, line.rstrip("\n").split("\t"))) for line in f][1:]
    for row in rows:
        if row["scope"] == "whole suite":
            latest[(row["tensorflow"], row["keras"])] = row
    lines = [
        "| TensorFlow | Keras | jax | passed | failed | errors | skipped | JAX road "
        "(passed / failed) | minutes | run on |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pair in PAIRS:
        row = latest.get(pair)
        if row is None:
            lines.append(f"| {pair[0]} | {pair[1]} | | not run | | | | | | |")
            continue
        lines.append(
            f"| {pair[0]} | {pair[1]} | {row['jax']} | {row['passed']} | {row['failed']} | "
            f"{row['errors']} | {row['skipped']} | {row['jax_passed']} / {row['jax_failed']} | "
            f"{int(row['seconds']) / 60:.1f} | {row['date']} |"
        )
    with open(VERSIONS_PAGE) as f:
        page = f.read()
    head, rest = page.split(TABLE_START)
    _, tail = rest.split(TABLE_END)
    with open(VERSIONS_PAGE, "w") as f:
        f.write(head + TABLE_START + "\n" + "\n".join(lines) + "\n" + TABLE_END + tail)
    print("\n".join(lines))
