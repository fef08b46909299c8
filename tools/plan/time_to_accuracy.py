"""Time to accuracy over global batch x devices: steps to the target from a
curve S(B) (target_curve.py) times the seconds of a step at (B, p), the
planner's step model (step.py) scaled to a measured run.

A cell: p devices, global batch B, b = B / p images a device (p must divide
B and the devices fill whole nodes); k micro-batches a step, the fewest
(k divides b) whose b / k images fit a device's memory (gradient
accumulation: k forward-backward passes, one all-reduce, one update):

    compute  = s * k * compute(b / k)          compute(): the device model
    fixed    = s * c_fixed
    exposed  = all-reduce - 2/3 compute / k    (with --overlap: the last
               micro-batch's backward pass hides it; else all of it)
    step     = compute + fixed + exposed (+ the input stall, as step.py)
    time     = S(B) * step,   device-hours = time * p / 3600

s scales the device to a run (`--from_run`): its global batch B_r on p_r
replicas with k_r micro-batches took B_r / r seconds a step (r: its
train_images_per_second); s is the factor that makes the model's step at
(B_r, p_r, k_r) equal that (the communication is not scaled: it comes from
the cluster flags). Without a run s = 1: the device's own calibration.
"""

import dataclasses
import glob
import json
import math
import os

from keras_lars.models import BUILDERS
from keras_lars.tools.model_dir_names import CHECKPOINTS
from keras_lars.tools.model_dir_names import LAYOUT
from keras_lars.tools.model_dir_names import SUMMARY_FILE
from keras_lars.tools.plan import target_curve
from keras_lars.tools.plan.cost_models import allreduce_time
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.memory import memory_estimate
from keras_lars.tools.plan.step import BACKWARD_FRACTION
from keras_lars.tools.plan.step import StepTime
from keras_lars.tools.plan.step import exposed_communication
from keras_lars.tools.plan.target_flags import DEFAULT_DEVICE_COUNTS
from keras_lars.tools.plan.target_flags import parse_counts
from keras_lars.tools.settings import ConfigError

OTHER_PLANS = ("layers", "layout_out", "batch_schedule", "image_size_schedule")  # one batch's


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


def _records(document, directory):
    """The run's records, newest first: its summary, then (for a summary of an
    earlier version, which has no layout) its checkpoints/ckpt-*.json states."""
    yield document
    states = glob.glob(os.path.join(directory, CHECKPOINTS, "ckpt-*.json"))
    for path in sorted(states, reverse=True):
        try:
            with open(path) as f:
                yield json.load(f)
        except (OSError, ValueError):
            continue


def _replicas_recorded(document, directory):
    """layout.replicas of the first of the run's records that has it (None: none)."""
    for record in _records(document, directory):
        layout = record.get(LAYOUT) if isinstance(record, dict) else None
        replicas = layout.get("replicas") if isinstance(layout, dict) else None
        if isinstance(replicas, int) and replicas >= 1:
            return replicas
    return None


def read_run(path, devices=0):
    """The MeasuredRun of a model dir or summary.json (`devices` > 0: the
    replicas, else the run's record of them); ConfigError naming --from_run
    and the file."""
    flag = f"--from_run={path}"
    summary = os.path.join(path, SUMMARY_FILE) if os.path.isdir(path) else path
    document = target_curve.read_json(flag, summary)
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f'{flag}: {summary} is not a keras-lars-train summary (no "config").')
    rate = document.get("train_images_per_second")
    if not isinstance(rate, (int, float)) or not rate > 0:
        raise ConfigError(
            f"{flag}: {summary} has no train_images_per_second (no epoch of the run was "
            "timed): train at least 2 epochs, or a longer epoch."
        )
    if config.get("batch_schedule"):
        raise ConfigError(
            f"{flag}: {summary}: the run changed its batch (--batch_schedule="
            f"{config['batch_schedule']}): its throughput is not one batch's."
        )
    batch = config.get("global_batch_size")
    if not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"{flag}: {summary}: its config has no global_batch_size.")
    replicas = devices or _replicas_recorded(document, os.path.dirname(summary))
    if not replicas:
        raise ConfigError(
            f"{flag}: {summary}: the run's replica count is not recorded (no layout in it or "
            "in a checkpoints/ckpt-*.json beside it): give --from_run_devices."
        )
    accumulation = config.get("gradient_accumulation_steps") or 1
    if batch % (replicas * accumulation):
        raise ConfigError(
            f"{flag}: {summary}: global batch {batch:,} does not divide into {replicas} "
            f"replicas x {accumulation} micro-batches (--from_run_devices?)."
        )
    return MeasuredRun(
        summary,
        float(rate),
        batch,
        replicas,
        accumulation,
        config.get("model") or "",
        config.get("image_size") or 0,
    )


# --- one cell --------------------------------------------------------------------------------
def cell_step(options, batch, devices, accumulation=1, scale=1.0):
    """The StepTime of global `batch` on `devices` in `accumulation`
    micro-batches, the device's compute and fixed time times `scale`."""
    profile, device = options.profile(), options.device_model()
    micro = batch / devices / accumulation
    compute = scale * accumulation * device.compute_seconds(profile, micro)
    fixed = scale * device.fixed_step_seconds
    gradient = profile.parameters * DTYPE_BYTES[options.gradient_dtype]
    communication = allreduce_time(gradient, options.cluster(devices))
    exposed = exposed_communication(
        communication, BACKWARD_FRACTION * compute / accumulation, options.overlap
    )
    stall = 0.0
    if device.input_images_per_second:
        busy = compute + fixed + exposed
        stall = max(0.0, batch / devices / device.input_images_per_second - busy)
    return StepTime(compute, communication, exposed, stall, fixed)


def calibrate_scale(options, run):
    """The s at which the model's step of `run` takes its measured seconds
    (bisection: the step grows with s); ConfigError when the measured step
    is shorter than the model's communication alone."""
    target = run.step_seconds

    def step(scale):
        return cell_step(options, run.global_batch, run.replicas, run.accumulation, scale).step

    if step(0.0) >= target:
        raise ConfigError(
            f"--from_run={run.path}: its {target * 1e3:.1f} ms a step are less than the "
            f"planner's all-reduce over {run.replicas} replicas ({step(0.0) * 1e3:.1f} ms): "
            "check --from_run_devices and the link flags."
        )
    low, high = 0.0, 1.0
    while step(high) < target:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if step(middle) < target else (low, middle)
    return (low + high) / 2


def micro_batches(options, per_device):
    """The fewest k dividing `per_device` whose micro-batch fits a device's
    memory (None: not one image fits)."""
    for k in range(1, per_device + 1):
        if per_device % k:
            continue
        memory = memory_estimate(
            options.profile(),
            per_device // k,
            DTYPE_BYTES[options.activation_dtype],
            options.capacity(),
        )
        if memory.verdict != "does not fit":
            return k
    return None


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (batch, devices) choice: its steps to the target, its step, or
    why it cannot run (`refused`: '-' or 'mem')."""

    batch: int
    devices: int
    steps: float = 0.0
    step: StepTime = None
    accumulation: int = 1
    refused: str = ""
    extrapolated: bool = False

    @property
    def seconds(self):
        return self.steps * self.step.step

    @property
    def device_hours(self):
        return self.seconds * self.devices / 3600


def cell(options, curve, batch, devices, scale):
    """The Cell of `batch` on `devices` ('-': p does not divide B, the
    devices do not fill whole nodes or B is more than the examples; 'mem':
    not one image fits)."""
    per_node = min(options.devices_per_node, devices)
    examples = curve.max_batch or options.examples
    if batch % devices or devices % per_node or batch > examples:
        return Cell(batch, devices, refused="-")
    k = micro_batches(options, batch // devices)
    if k is None:
        return Cell(batch, devices, refused="mem")
    step = cell_step(options, batch, devices, k, scale)
    return Cell(batch, devices, curve.steps(batch), step, k)


# --- the grid ------------------------------------------------------------------------------
def default_batches(curve):
    """Powers of two from the smallest measured batch (or B_crit / 16) to 4x
    the largest (or 16 B_crit) and at most the study's examples, at most 12."""
    if curve.measured:
        low, high = min(curve.measured), 4 * max(curve.measured)
    else:
        low, high = curve.b_crit / 16, curve.b_crit * 16
    first = max(0, math.floor(math.log2(max(low, 1))))
    last = max(first, math.ceil(math.log2(max(high, 1))))
    while curve.max_batch and last > first and 2**last > curve.max_batch:
        last -= 1
    return tuple(2**e for e in range(first, min(last, first + 11) + 1))


def grid(options, curve, scale):
    """[[Cell per device count] per batch] over the flags' grid."""
    batches = parse_counts(options.target_batches) if options.target_batches else None
    counts = parse_counts(options.target_devices or DEFAULT_DEVICE_COUNTS)
    return [
        [cell(options, curve, batch, count, scale) for count in counts]
        for batch in batches or default_batches(curve)
    ]


def best(cells):
    """(fastest, cheapest) of the cells that run: least time (then fewer
    device-hours), fewest device-hours (then less time); None, None if none."""
    runs = [c for row in cells for c in row if not c.refused]
    if not runs:
        return None, None
    fastest = min(runs, key=lambda c: (c.seconds, c.device_hours))
    cheapest = min(runs, key=lambda c: (c.device_hours, c.seconds))
    return fastest, cheapest


# --- the report ----------------------------------------------------------------------------
def run_options(options, run):
    """The planner's settings for the run's model and image size (the rest:
    the flags')."""
    if run.model not in BUILDERS:
        raise ConfigError(
            f"--from_run={run.path}: its model {run.model!r} is not a keras_lars.models one."
        )
    return dataclasses.replace(
        options,
        model=run.model,
        image_size=run.image_size or options.image_size,
        global_batch_size=0,
        layout_out="",
        layers=False,
    )


def speed_line(options, run, scale):
    """Where the step time comes from."""
    profile = f"{options.model} at {options.image_size} on a {options.device} (--device)"
    if run is None:
        return f"step      the planner's model of {profile}, not scaled (no --from_run)"
    modelled = cell_step(options, run.global_batch, run.replicas, run.accumulation).step
    return (
        f"step      the planner's model of {profile}, its device time x{scale:.3g}: --from_run "
        f"{run.path} measured {run.images_per_second:,.1f} images/s at batch "
        f"{run.global_batch:,} on {run.replicas} replica{'s' if run.replicas > 1 else ''}"
        + (f" x {run.accumulation} micro-batches" if run.accumulation > 1 else "")
        + f" ({run.step_seconds * 1e3:.1f} ms a step; the model {modelled * 1e3:.1f} ms)"
    )


def _steps_text(steps):
    return f"{steps:,.1f}" if steps < 100 else f"{steps:,.0f}"


def _table(cells, value, title):
    counts = [c.devices for c in cells[0]]
    lines = [title, f"{'batch':>9}{'steps':>10}" + "".join(f"{n:>13,}" for n in counts)]
    for row in cells:
        batch = row[0].batch
        steps = next((_steps_text(c.steps) for c in row if not c.refused), "-")
        texts = []
        for c in row:
            text = c.refused or value(c) + (f" a{c.accumulation}" if c.accumulation > 1 else "")
            texts.append(f"{text:>13}")
        lines.append(
            f"{batch:>8,}{'*' if row[0].extrapolated else ' '}{steps:>10}" + "".join(texts)
        )
    return lines


def report(options, duration):
    """The time-to-accuracy report (None: no curve flag given); `duration`
    formats seconds."""
    curve = target_curve.curve(options)
    if curve is None:
        return None
    others = [f"--{name}" for name in OTHER_PLANS if getattr(options, name)]
    if others:
        raise ConfigError(
            f"{target_curve.source_flags(options)[0]}: time to accuracy plans its own batch x "
            f"devices grid: not with {', '.join(others)}."
        )
    run = read_run(options.from_run, options.from_run_devices) if options.from_run else None
    if run:
        options = run_options(options, run)
    scale = calibrate_scale(options, run) if run else 1.0
    cells = grid(options, curve, scale)
    cells = [
        [dataclasses.replace(c, extrapolated=curve.extrapolated(c.batch)) for c in row]
        for row in cells
    ]
    lines = [
        f"time to {curve.target or 'the target'}: {curve.equation()}",
        f"curve     {curve.source}",
        *([_tuned_line(curve)] if curve.tuned else []),
        *([_untuned_line(curve)] if curve.untuned else []),
        speed_line(options, run, scale),
        f"cluster   {options.devices_per_node} devices a node, {options.algorithm} all-reduce "
        f"of {options.gradient_dtype} gradients, overlap {'on' if options.overlap else 'off'}",
    ]
    trained = (curve.model, curve.image_size or options.image_size)
    if curve.model and trained != (options.model, options.image_size):
        lines.append(
            f"note      the study trained {trained[0]} at {trained[1]}, the steps are timed "
            f"for {options.model} at {options.image_size}: the curve is assumed to carry over"
        )
    lines.append("")
    lines += _table(
        cells,
        lambda c: duration(c.seconds),
        "time to accuracy, global batch (rows) x devices (columns):",
    )
    lines.append("")
    lines += _table(
        cells,
        lambda c: duration(c.device_hours * 3600),
        "device time (devices x time to accuracy; / 3600 s: device-hours):",
    )
    notes = []
    if any(row[0].extrapolated for row in cells):
        measured = sorted(curve.measured)
        notes.append(
            f"*: outside the batches measured ({measured[0]:,} .. {measured[-1]:,}): S(B) "
            "extrapolated"
        )
    if any(c.accumulation > 1 for row in cells for c in row):
        notes.append("a<k>: k micro-batches a step (gradient accumulation): b / k images fit")
    notes.append(
        "-: devices do not divide the batch, do not fill whole nodes, or the batch exceeds "
        "the examples; mem: not one image fits"
    )
    lines += [""] + notes
    fastest, cheapest = best(cells)
    if fastest is None:
        lines.append("no cell of the grid can run")
        return "\n".join(lines)
    for name, c in (("fastest ", fastest), ("cheapest", cheapest)):
        lines.append(
            f"{name}  batch {c.batch:,} on {c.devices:,} device{'s' if c.devices > 1 else ''}"
            f"{f' x {c.accumulation} micro-batches' if c.accumulation > 1 else ''}: "
            f"{duration(c.seconds)}, {c.device_hours:.3g} device-hours "
            f"({_steps_text(c.steps)} steps of {c.step.step * 1e3:.1f} ms)"
            f"{' (extrapolated)' if c.extrapolated else ''}{_tuned_text(curve, c.batch)}"
        )
    return "\n".join(lines)


def _tuned_line(curve):
    """The study's tuned peak rate and schedule length at each batch it fitted."""
    found = ", ".join(f"{b:,}: {r:.4g} over {t:,} steps" for b, r, t in curve.tuned)
    return f"rates     the study's tuned peak rate and schedule length by batch: {found}"


def _untuned_line(curve):
    """The steps the study measured at its untuned batches, beside S(B)."""
    found = ", ".join(
        f"{b:,}: {_untuned_steps(s)} at {r:.4g} over {t:,} steps (S(B) {curve.steps(b):,.1f})"
        for b, s, r, t in curve.untuned
    )
    return f"untuned   the study's batches run at the batch before's choice, not fitted: {found}"


def _untuned_steps(steps):
    return "not reached" if steps is None else f"{steps:,.0f} steps"


def _tuned_text(curve, batch):
    """'; peak rate r over a t-step schedule (tuned by the study)' for a batch
    the study tuned; a warning for one it did not; '' without a study table."""
    if not curve.tuned:
        return ""
    found = curve.tuned_at(batch)
    untuned = curve.untuned_at(batch)
    if found is None and untuned:
        steps, rate, schedule = untuned
        return (
            f"; the study tuned no rate at this batch ({_untuned_steps(steps)} "
            f"at {rate:.4g} over {schedule:,} steps, untuned)"
        )
    if found is None:
        return "; the study tuned no rate at this batch"
    return f"; peak rate {found[0]:.4g} over a {found[1]:,}-step schedule (tuned by the study)"
