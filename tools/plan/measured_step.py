"""A step's device time measured on the user's device, for time to accuracy
(time_to_accuracy.py): from keras-lars-train runs (`--from_run`, their
summary.json) or from a steps-to-target study's own trials (its
trials.jsonl: the seconds each trial trained over its steps, on the study's
host).

Each measurement is a point (b, d): b images a device a step, d the device
seconds of that step (the step less the all-reduce it waited for, modelled
from the cluster flags: d = step - comm without overlap; with overlap d = step
while comm <= 2/3 step, else 3 (step - comm)). The points give a line

    d(b) = fixed + per_image * b        (two or more batches: least squares of
                                         the relative error, (d(b) - d) / d, so
                                         that no batch's seconds outweigh the rest)

whose fixed part is the small-batch penalty: below b_half = fixed /
per_image images a device the device runs under half its full rate. One
batch alone cannot tell the two apart: the step is then taken as
proportional to b (fixed 0), and the report says so. Every file is read as
untrusted (tools/untrusted_json.py); every error is one line naming the flag,
the file and the field.
"""

import dataclasses
import glob
import os
import statistics

from keras_lars.models import BUILDERS
from keras_lars.tools import untrusted_json
from keras_lars.tools.model_dir_names import CHECKPOINTS
from keras_lars.tools.model_dir_names import LAYOUT
from keras_lars.tools.model_dir_names import SUMMARY_FILE
from keras_lars.tools.plan.config import IMAGE_SIZE_CHECK
from keras_lars.tools.plan.step import BACKWARD_FRACTION
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.study_files import TRIALS_FILE

SHORTEST_STEP = 1e-6  # seconds: a step measured shorter is not a measurement
NEWEST_STATES = 8  # checkpoint states read for a run's replica count


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    """What a training run's summary.json says of its speed."""

    path: str
    images_per_second: float
    global_batch: int
    replicas: int
    accumulation: int
    model: str
    image_size: int

    @property
    def step_seconds(self):
        return self.global_batch / self.images_per_second


def summary_file(path):
    """(the summary file, how errors name it: '--from_run=DIR: summary.json')."""
    if os.path.isdir(path):
        return os.path.join(path, SUMMARY_FILE), f"--from_run={path}: {SUMMARY_FILE}"
    return path, f"--from_run={path}"


def _replicas_recorded(document, directory):
    """layout.replicas of the summary, else of the newest checkpoint state
    that has it (None: none)."""
    states = sorted(glob.glob(os.path.join(directory, CHECKPOINTS, "ckpt-*.json")), reverse=True)
    for index, record in enumerate([document, *states[:NEWEST_STATES]]):
        if index:
            try:
                record = untrusted_json.read_json(record)
            except untrusted_json.UntrustedFileError:
                continue
        layout = record.get(LAYOUT) if isinstance(record, dict) else None
        replicas = layout.get("replicas") if isinstance(layout, dict) else None
        if type(replicas) is int and replicas >= 1:
            return replicas
    return None


def read_run(path, devices=0):
    """The MeasuredRun of a model dir or summary.json (`devices` > 0: the
    replicas, else the run's record of them); ConfigError naming --from_run,
    the file and the field."""
    summary, name = summary_file(path)
    try:
        document = untrusted_json.read_json(summary)
    except untrusted_json.UntrustedFileError as error:
        raise ConfigError(f"{name}: {error}.") from None
    try:
        return _run(path, summary, name, document, devices)
    except untrusted_json.UntrustedFileError as error:
        raise ConfigError(f"{name}: {error}.") from None


def _run(path, summary, name, document, devices):
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f'{name}: not a keras-lars-train summary (no "config").')
    if document.get("train_images_per_second") is None:
        raise ConfigError(
            f"{name}: no train_images_per_second (no epoch of the run was timed): train at "
            "least 2 epochs, or a longer epoch."
        )
    rate = untrusted_json.number(document, "train_images_per_second")
    schedule = untrusted_json.text(config, "batch_schedule", where="config.")
    if schedule:
        raise ConfigError(
            f"{name}: config.batch_schedule: the run changed its batch ({schedule}): its "
            "throughput is not one batch's."
        )
    batch = untrusted_json.integer(config, "global_batch_size", where="config.")
    accumulation = untrusted_json.integer(
        config, "gradient_accumulation_steps", where="config.", default=1
    )
    model = untrusted_json.text(config, "model", where="config.")
    if model not in BUILDERS:
        raise untrusted_json.UntrustedFileError(
            f"config.model: {model!r} is not a keras_lars.models model"
        )
    image_size = untrusted_json.integer(config, "image_size", where="config.")
    problem = IMAGE_SIZE_CHECK(image_size, None)
    if problem:
        raise untrusted_json.UntrustedFileError(f"config.image_size: {image_size} {problem}")
    if batch / rate < SHORTEST_STEP:
        raise untrusted_json.UntrustedFileError(
            f"train_images_per_second: {rate:g} images/s at batch {batch:,} is a step of "
            f"{batch / rate:.3g} s: not a measurement"
        )
    replicas = devices or _replicas_recorded(document, os.path.dirname(summary))
    if not replicas:
        raise ConfigError(
            f"{name}: the run's replica count is not recorded (no layout in it or in a "
            "checkpoints/ckpt-*.json beside it): give --from_run_devices."
        )
    if batch % (replicas * accumulation):
        raise ConfigError(
            f"{name}: global batch {batch:,} does not divide into {replicas} replicas x "
            f"{accumulation} micro-batches (--from_run_devices?)."
        )
    return MeasuredRun(summary, rate, batch, replicas, accumulation, model, image_size)


@dataclasses.dataclass(frozen=True)
class StepLine:
    """d(b) = fixed + per_image * b device seconds a step of b images a
    device (the module docstring); `points`: (b, d, what) measured;
    `devices`: the device counts measured on; `source`: where, as text."""

    fixed: float
    per_image: float
    points: tuple
    devices: tuple
    source: str

    @property
    def proportional(self):
        """One batch measured: the fixed time is not known (taken as 0)."""
        return len({b for b, _, _ in self.points}) < 2

    @property
    def half_batch(self):
        return self.fixed / self.per_image

    def seconds(self, images):
        return self.fixed + self.per_image * images


def device_seconds(step, communication, overlap):
    """d of a measured `step` that waited for an all-reduce of
    `communication` seconds (the module docstring); None if the all-reduce
    alone is longer than the step."""
    if not overlap:
        device = step - communication
    elif communication <= BACKWARD_FRACTION * step:
        device = step
    else:
        device = (step - communication) / (1 - BACKWARD_FRACTION)
    return device if device > 0 else None


def relative_line(points):
    """(fixed, per_image) minimizing sum ((fixed + per_image b - d) / d)^2
    over `points` ((b, d, what), ...: two or more batches)."""
    weights = [(b, d, 1 / d**2) for b, d, _ in points]
    w = sum(weight for _, _, weight in weights)
    wb = sum(weight * b for b, _, weight in weights)
    wbb = sum(weight * b * b for b, _, weight in weights)
    wd = sum(weight * d for _, d, weight in weights)
    wbd = sum(weight * b * d for b, d, weight in weights)
    determinant = w * wbb - wb * wb
    return (wbb * wd - wb * wbd) / determinant, (w * wbd - wb * wd) / determinant


def fit(points, devices, source):
    """The StepLine through `points` ((b, d, what), ...): `relative_line`
    over two or more batches (a fixed part below 0 is taken as 0, the line
    then through the origin), else proportional; ConfigError where the steps
    do not grow with the batch."""
    batches = {b for b, _, _ in points}
    if len(batches) < 2:
        per_image = statistics.fmean(d / b for b, d, _ in points)
        return StepLine(0.0, per_image, tuple(points), devices, source)
    fixed, per_image = relative_line(points)
    if per_image <= 0:
        found = ", ".join(f"{d * 1e3:,.1f} ms at {b:,}" for b, d, _ in points)
        raise ConfigError(
            f"{source}: the steps do not grow with the images a device ({found}): no "
            "per-image time to fit."
        )
    if (
        fixed < 0
    ):  # through the origin: sum ((s b - d) / d)^2 is least at s = sum(b/d) / sum((b/d)^2)
        ratios = [b / d for b, d, _ in points]
        fixed, per_image = 0.0, sum(ratios) / sum(r * r for r in ratios)
    return StepLine(fixed, per_image, tuple(points), devices, source)


def runs_line(runs, communication, overlap):
    """The StepLine of MeasuredRuns; `communication(run)`: the all-reduce
    seconds of its step (the cluster flags')."""
    points = []
    for run in runs:
        comm = communication(run)
        device = device_seconds(run.step_seconds, comm, overlap)
        if device is None:
            raise ConfigError(
                f"--from_run={run.path}: its {run.step_seconds * 1e3:.1f} ms a step are less "
                f"than the planner's all-reduce over {run.replicas} replicas ({comm * 1e3:.1f} "
                "ms): check --from_run_devices and the link flags."
            )
        points.append((run.global_batch // run.replicas, device, run.path))
    devices = tuple(sorted({run.replicas for run in runs}))
    return fit(points, devices, "--from_run")


def same_model(runs):
    """(model, image size) the runs share; ConfigError naming two that differ."""
    first = runs[0]
    for run in runs[1:]:
        if (run.model, run.image_size) != (first.model, first.image_size):
            raise ConfigError(
                f"--from_run: {first.path} trained {first.model} at {first.image_size}, "
                f"{run.path} {run.model} at {run.image_size}: one model's runs."
            )
    return first.model, first.image_size


def study_host_line(directory, optimizer, batches):
    """The StepLine of a steps-to-target study's own trials of `optimizer`
    at `batches` (median seconds a step over the trials at each batch, on
    one device: the study's runs), or None where the study has no trials
    file or its trials ran on several devices or processes."""
    path = os.path.join(directory, TRIALS_FILE)
    flag = f"--target_study={directory}: {TRIALS_FILE}"
    if not os.path.lexists(path):
        return None
    try:
        trials = untrusted_json.read_json_lines(path)
        steps = {}
        for number, trial in enumerate(trials, 1):
            row = trial.get("row") if isinstance(trial, dict) else None
            config = trial.get("config") if isinstance(trial, dict) else None
            if not isinstance(row, dict) or row.get("optimizer") != optimizer:
                continue
            where = f"line {number}: "
            if untrusted_json.text(config, "strategy", where=where + "config.") != "default":
                return None
            if untrusted_json.integer(config, "num_processes", where=where + "config.") != 1:
                return None
            batch = untrusted_json.integer(row, "batch_size", where=where + "row.")
            ran = untrusted_json.integer(row, "steps", minimum=0, where=where + "row.")
            seconds = untrusted_json.number(row, "seconds", positive=False, where=where + "row.")
            if batch in batches and ran > 0 and seconds > 0:
                steps.setdefault(batch, []).append(seconds / ran)
    except untrusted_json.UntrustedFileError as error:
        raise ConfigError(f"{flag}: {error}.") from None
    if not steps:
        return None
    points = [(b, statistics.median(steps[b]), f"median of {len(steps[b])}") for b in sorted(steps)]
    return fit(points, (1,), f"--target_study={directory}'s trials")


def line_text(line):
    """The lines that say what a StepLine is and where it comes from."""
    found = ", ".join(f"{d * 1e3:,.1f} ms at {b:,}" for b, d, _ in line.points)
    if line.proportional:
        shape = (
            f"one batch measured: the step taken as proportional to the images a device, "
            f"{line.per_image * 1e3:.4g} ms an image (no fixed time or small-batch penalty "
            "known: measure a second batch)"
        )
    elif line.fixed == 0:
        shape = (
            f"{line.per_image * 1e3:.4g} ms an image, no fixed time: the line through the "
            "points put it below 0 (the larger batch ran slower an image: timings of a busy "
            "machine?), so none, and no small-batch penalty"
        )
    else:
        shape = (
            f"fixed {line.fixed * 1e3:,.1f} ms + {line.per_image * 1e3:.4g} ms an image: "
            f"below {line.half_batch:,.0f} images a device it runs under half its full rate"
        )
    return [f"measured  device seconds a step by images a device: {found}", f"fit       {shape}"]
