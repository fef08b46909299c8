"""keras-lars-plan reads every file given to it as untrusted
(tools/untrusted_json.py): a FIFO, a device, a symlink loop, a huge or
deeply nested file, a number out of range, a field of the wrong type or sign.
Each is one `error:` line naming the flag, the file and the field, at once
(in-process: the planner's main with its settings made here)."""

import json
import os

import pytest

from keras_lars.tools import untrusted_json
from keras_lars.tools.plan import cli
from tests.test_plan_target import FIT
from tests.test_plan_target import TABLE
from tests.test_plan_target import write_run
from tests.test_plan_target import write_study

GIVEN = dict(target_s_min=10.0, target_b_crit=100.0, devices=1, devices_per_node=1)


def plan_error(monkeypatch, capsys, **values):
    """The one line keras-lars-plan's main exits with, for these settings."""
    options = cli.PlanSettings(**values)
    monkeypatch.setattr(cli.settings, "options_from_flags", lambda schema: options)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["keras-lars-plan"])
    assert capsys.readouterr().out == ""
    message = str(stopped.value.code)
    assert "\n" not in message and message.startswith("error: ")
    return message


def _summary(directory, **fields):
    """A run directory whose summary.json is write_run's with `fields` set in
    its config (None: removed) or, for train_images_per_second, at the top."""
    path = write_run(directory)
    with open(os.path.join(path, "summary.json")) as f:
        summary = json.load(f)
    for name, value in fields.items():
        holder = summary if name == "train_images_per_second" else summary["config"]
        holder[name] = value
    with open(os.path.join(path, "summary.json"), "w") as f:
        f.write(json.dumps(summary).replace('"@INF@"', "1e999"))
    return path


def _raw(directory, data):
    """A run directory whose summary.json holds `data` (bytes)."""
    os.makedirs(directory)
    with open(os.path.join(directory, "summary.json"), "wb") as f:
        f.write(data)
    return str(directory)


def _fifo(directory):
    os.mkfifo(directory / "fifo")
    return str(directory / "fifo")


def _loop(directory):
    os.symlink(directory / "b", directory / "a")
    os.symlink(directory / "a", directory / "b")
    return str(directory / "a")


def _huge(directory):
    with open(directory / "huge", "wb") as f:
        f.truncate(untrusted_json.MAX_BYTES + 1)  # sparse: no disk used
    return str(directory / "huge")


RUNS = {
    "a FIFO": (_fifo, "it is a FIFO (named pipe), not a file."),
    "/dev/zero": (lambda d: "/dev/zero", "it is a character device, not a file."),
    "a symlink loop": (_loop, "cannot read it: Too many levels of symbolic links."),
    "too large": (_huge, "it holds more than 64 MB: not read."),
    "200,000 deep": (
        lambda d: _raw(d / "run", b"[" * 200_000 + b"]" * 200_000),
        "summary.json: it nests deeper than 64 levels: not read.",
    ),
    "100 deep": (
        lambda d: _raw(d / "run", b"[" * 100 + b"]" * 100),
        "summary.json: it nests deeper than 64 levels: not read.",
    ),
    "401 digits": (
        lambda d: _raw(d / "run", b'{"config": {"global_batch_size": ' + b"9" * 401 + b"}}"),
        "summary.json: it is not JSON the tools read: an integer of 401 digits.",
    ),
    "not UTF-8": (lambda d: _raw(d / "run", b"\xff"), None),
    "accumulation ab": (
        lambda d: _summary(d / "run", gradient_accumulation_steps="ab"),
        'summary.json: config.gradient_accumulation_steps: "ab" is not an integer.',
    ),
    "accumulation -1": (
        lambda d: _summary(d / "run", gradient_accumulation_steps=-1),
        "summary.json: config.gradient_accumulation_steps: -1 must be >= 1.",
    ),
    "batch true": (
        lambda d: _summary(d / "run", global_batch_size=True),
        "summary.json: config.global_batch_size: true is not an integer.",
    ),
    "batch 0": (
        lambda d: _summary(d / "run", global_batch_size=0),
        "summary.json: config.global_batch_size: 0 must be >= 1.",
    ),
    "batch '123'": (
        lambda d: _summary(d / "run", global_batch_size="123"),
        'summary.json: config.global_batch_size: "123" is not an integer.',
    ),
    "rate -1": (
        lambda d: _summary(d / "run", train_images_per_second=-1),
        "summary.json: train_images_per_second: -1 must be > 0.",
    ),
    "rate 1e999": (
        lambda d: _summary(d / "run", train_images_per_second="@INF@"),
        "summary.json: train_images_per_second: inf is not a finite number.",
    ),
    "rate 1e308": (
        lambda d: _summary(d / "run", train_images_per_second=1e308),
        "summary.json: train_images_per_second: 1e+308 images/s at batch 256 is a step of "
        "2.56e-306 s: not a measurement.",
    ),
    "image size 3": (
        lambda d: _summary(d / "run", image_size=3),
        "summary.json: config.image_size: 3 must be >= 7.",
    ),
    "image size 10**6": (
        lambda d: _summary(d / "run", image_size=10**6),
        "summary.json: config.image_size: 1000000 must be <= 65536.",
    ),
    "model 7": (
        lambda d: _summary(d / "run", model=7),
        "summary.json: config.model: 7 is not a string.",
    ),
    "not an object": (
        lambda d: _raw(d / "run", b"[1, 2]"),
        'summary.json: not a keras-lars-train summary (no "config").',
    ),
}


@pytest.mark.parametrize("make, expected", RUNS.values(), ids=RUNS.keys())
def test_a_hostile_run_is_one_line_naming_the_file_and_field(
    make, expected, tmp_path, monkeypatch, capsys
):
    path = make(tmp_path)
    message = plan_error(monkeypatch, capsys, **GIVEN, from_run=(path,))
    if expected is None:  # not UTF-8: what the decoder says is its own
        assert message.startswith(f"error: --from_run={path}: summary.json: it is not JSON: ")
    else:
        assert message == f"error: --from_run={path}: {expected}"


def _fit(**fields):
    """FIT with the lamb fit's `fields` set (or the document's, for noise_scales)."""
    document = json.loads(json.dumps(FIT))
    for name, value in fields.items():
        if name == "noise_scales":
            document[name] = value
        else:
            document["fits"]["lamb"][name] = value
    return document


STUDIES = {
    "batch 1e999": (
        _fit(batches=[32, "@INF@", 512]),
        "fit.json: fits.lamb.batches[1]: inf is not an integer.",
    ),
    "batch 0": (_fit(batches=[0, 128, 512]), "fit.json: fits.lamb.batches[0]: 0 must be >= 1."),
    "batch -64": (
        _fit(batches=[-64, 128, 512]),
        "fit.json: fits.lamb.batches[0]: -64 must be >= 1.",
    ),
    "batch '123'": (
        _fit(batches=["123", 128, 512]),
        'fit.json: fits.lamb.batches[0]: "123" is not an integer.',
    ),
    "S_min infinite": (
        _fit(s_min="@INF@"),
        "fit.json: fits.lamb.s_min: inf is not a finite number.",
    ),
    "S_min true": (_fit(s_min=True), "fit.json: fits.lamb.s_min: true is not a number."),
    "noise scales a list": (
        _fit(noise_scales=[1, 2]),
        "fit.json: noise_scales: not an object of optimizers.",
    ),
    "a rate of -1": (
        ("table", dict(TABLE[0], chosen_rate=-1)),
        "steps_to_target.json: rows[0].chosen_rate: -1 must be > 0.",
    ),
    "steps NaN": (
        ("table", dict(TABLE[0], steps_mean="@NAN@")),
        "steps_to_target.json: rows[0].steps_mean: nan is not a finite number.",
    ),
}


@pytest.mark.parametrize("document, expected", STUDIES.values(), ids=STUDIES.keys())
def test_a_hostile_study_is_one_line_naming_the_file_and_field(
    document, expected, tmp_path, monkeypatch, capsys
):
    table = None
    if isinstance(document, tuple):  # a bad row of the table, the fit good
        document, table = FIT, [document[1], *TABLE[1:]]
    study = write_study(tmp_path / "study", document, table)
    for name in ("fit.json", "steps_to_target.json"):
        path = os.path.join(study, name)
        if os.path.exists(path):
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace('"@INF@"', "1e999").replace('"@NAN@"', "NaN"))
    message = plan_error(monkeypatch, capsys, target_study=study, target_optimizer="lamb")
    assert message == f"error: --target_study={study}: {study}/{expected}"


def test_infinite_flags_and_a_run_without_a_curve_are_one_line(monkeypatch, capsys):
    with pytest.raises(cli.ConfigError) as raised:
        cli.PlanSettings(target_s_min=float("inf"), target_b_crit=100.0)
    assert str(raised.value) == "--target_s_min=inf: must be a finite number."
    assert plan_error(monkeypatch, capsys, from_run=("/tmp/run",)) == (
        "error: --from_run: it times the steps of time to accuracy: give a source of the steps "
        "to the target with it (--target_study, --target_s_min or --target_noise_scale)."
    )
