"""Time to accuracy over global batch x devices: steps to the target from a
curve S(B) (target_curve.py), or the study's measured steps at the batches
it measured, times the seconds of a step at (B, p).

A cell: p devices, global batch B, b = B / p images a device (p must divide
B and the devices fill whole nodes). The step's device time comes from one
of two places:

    measured   a line d(b) = fixed + per_image * b fitted on the user's runs
               (--from_run) or on the study's own trials (its host), when
               the planned model is the one measured (measured_step.py)
    modelled   the planner's device model (step.py, device.py) of --model on
               --device: k micro-batches a step, the fewest (k divides b)
               whose b / k images fit a device's memory (gradient
               accumulation: k forward-backward passes, one all-reduce, one
               update), compute = k * compute(b / k), fixed = c_fixed

    exposed  = all-reduce - 2/3 compute / k   (with --overlap: the last
               micro-batch's backward pass hides it; else all of it)
    step     = compute + fixed + exposed (+ the input stall, as step.py)
    time     = S * step,   device-hours = time * p / 3600

A study's curve is its model's: the planner times the study's model unless
told to time another (--target_from_other_model), and then says so on every
answer. The columns are the devices asked for (--devices, or a sweep with
--target_devices), else those the step was measured on.
"""

import dataclasses
import math

from keras_lars.tools.plan import measured_step
from keras_lars.tools.plan import run_noise
from keras_lars.tools.plan import target_curve
from keras_lars.tools.plan.cost_models import allreduce_time
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.memory import memory_estimate
from keras_lars.tools.plan.step import BACKWARD_FRACTION
from keras_lars.tools.plan.step import StepTime
from keras_lars.tools.plan.step import exposed_communication
from keras_lars.tools.plan.target_flags import parse_counts
from keras_lars.tools.settings import ConfigError

OTHER_PLANS = ("layers", "layout_out", "batch_schedule", "image_size_schedule")  # one batch's
DEVICE_FLAGS = frozenset(
    ("device", "images_per_second", "peak_tflops", "utilization", "memory_bandwidth")
)  # flags that ask for the modelled device


# --- one cell --------------------------------------------------------------------------------
def communication_seconds(options, devices):
    """The all-reduce of the gradients over `devices` (the cluster flags')."""
    gradient = options.profile().parameters * DTYPE_BYTES[options.gradient_dtype]
    return allreduce_time(gradient, options.cluster(devices))


def cell_step(options, batch, devices, accumulation=1, line=None):
    """The StepTime of global `batch` on `devices` in `accumulation`
    micro-batches: device time from the measured `line`, else the
    planner's device model."""
    per_device = batch / devices
    if line:
        compute, fixed = line.per_image * per_device, line.fixed
    else:
        device = options.device_model()
        compute = accumulation * device.compute_seconds(
            options.profile(), per_device / accumulation
        )
        fixed = device.fixed_step_seconds
    communication = communication_seconds(options, devices)
    exposed = exposed_communication(
        communication, BACKWARD_FRACTION * compute / accumulation, options.overlap
    )
    stall = 0.0
    if options.input_images_per_second:
        busy = compute + fixed + exposed
        stall = max(0.0, per_device / options.input_images_per_second - busy)
    return StepTime(compute, communication, exposed, stall, fixed)


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
    """One (batch, devices) choice: its steps to the target (`measured`: the
    study's mean at that batch, else S(B)), its step, or why it cannot run
    (`refused`: '-' or 'mem')."""

    batch: int
    devices: int
    steps: float = 0.0
    step: StepTime = None
    accumulation: int = 1
    refused: str = ""
    extrapolated: bool = False
    measured: bool = False

    @property
    def seconds(self):
        return self.steps * self.step.step

    @property
    def device_hours(self):
        return self.seconds * self.devices / 3600


def cell(options, curve, batch, devices, line=None):
    """The Cell of `batch` on `devices` ('-': p does not divide B, the
    devices do not fill whole nodes or B is more than the examples; 'mem':
    not one image fits; a measured `line`: no accumulation, its device's
    memory is not modelled)."""
    per_node = min(options.devices_per_node, devices)
    examples = curve.max_batch or options.examples
    if batch % devices or devices % per_node or batch > examples:
        return Cell(batch, devices, refused="-")
    k = 1 if line else micro_batches(options, batch // devices)
    if k is None:
        return Cell(batch, devices, refused="mem")
    step = cell_step(options, batch, devices, k, line)
    measured = curve.measured_steps.get(batch)
    steps = curve.steps(batch) if measured is None else measured
    return Cell(
        batch,
        devices,
        steps,
        step,
        k,
        extrapolated=curve.extrapolated(batch),
        measured=measured is not None,
    )


# --- the grid ------------------------------------------------------------------------------
def default_batches(curve):
    """Powers of two from the smallest measured batch (or B_crit / 16) to 4x
    the largest (or 16 B_crit) and at most the study's examples, at most 12,
    and the study's other measured batches."""
    if curve.measured:
        low, high = min(curve.measured), 4 * max(curve.measured)
    else:
        low, high = curve.b_crit / 16, curve.b_crit * 16
    first = max(0, math.floor(math.log2(max(low, 1))))
    last = max(first, math.ceil(math.log2(max(high, 1))))
    while curve.max_batch and last > first and 2**last > curve.max_batch:
        last -= 1
    powers = {2**e for e in range(first, min(last, first + 11) + 1)}
    return tuple(sorted(powers | set(curve.measured_steps)))


def columns(options, line, given):
    """The device counts planned: --target_devices (a sweep), else --devices
    where given, else those the step was measured on, else --devices."""
    if options.target_devices:
        return parse_counts(options.target_devices)
    if line and "devices" not in given:
        return line.devices
    return (options.devices,)


def grid(options, curve, counts, line=None):
    """[[Cell per device count] per batch] over the flags' batches."""
    batches = parse_counts(options.target_batches) if options.target_batches else None
    return [
        [cell(options, curve, batch, count, line) for count in counts]
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


# --- what is planned --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Planned:
    """The settings planned (model and image size set), the measured line
    (None: the device model), the lines saying where the step comes from,
    and `mismatch`: '' or the text every answer carries when the curve is
    another model's."""

    options: object
    line: object
    step_lines: tuple
    mismatch: str = ""


def _with_model(options, model, image_size, origin):
    """`options` planning `model` at `image_size`; a ConfigError names `origin`."""
    try:
        return dataclasses.replace(
            options,
            model=model,
            image_size=image_size,
            global_batch_size=0,
            layout_out="",
            layers=False,
            batch_schedule="",
            image_size_schedule="",
            adaptive_batch="off",  # the grid's cells: fixed batches
        )
    except ConfigError as error:
        raise ConfigError(f"{origin}: planning {model} at {image_size}: {error}") from None


def planned(options, curve, given):
    """The Planned of the flags (the module docstring: whose model, whose step)."""
    runs = [measured_step.read_run(path, options.from_run_devices) for path in options.from_run]
    source = target_curve.source_flags(options)[0]
    if runs:
        model, image_size = measured_step.same_model(runs)
        origin = f"--from_run={runs[0].path}"
        for name, value in (("model", model), ("image_size", image_size)):
            if name in given and getattr(options, name) != value:
                raise ConfigError(
                    f"--{name}={getattr(options, name)}: the --from_run runs trained {model} "
                    f"at {image_size}, and the step is theirs: leave out --{name}."
                )
    elif {"model", "image_size"} & given or not curve.model:
        model, image_size, origin = options.model, options.image_size, "--model"
    else:
        model, image_size = curve.model, curve.image_size or options.image_size
        origin = source
    options = _with_model(options, model, image_size, origin)
    mismatch = ""
    trained = (curve.model, curve.image_size or image_size)
    if curve.model and trained != (model, image_size):
        if not options.target_from_other_model:
            raise ConfigError(
                f"{origin}: the step would be timed for {model} at {image_size}, but "
                f"{source}'s steps to the target are {trained[0]}'s at {trained[1]}: another "
                f"model's curve; plan {trained[0]} (leave out --model), or give "
                "--target_from_other_model to time this curve for it anyway."
            )
        mismatch = f"curve of {trained[0]} at {trained[1]}, timed for {model} at {image_size}"
    if runs:
        line = measured_step.runs_line(
            runs, lambda run: communication_seconds(options, run.replicas), options.overlap
        )
        where = ", ".join(
            f"{run.path}: {run.images_per_second:,.1f} images/s at batch {run.global_batch:,} "
            f"on {run.replicas}"
            + (f" x {run.accumulation} micro-batches" if run.accumulation > 1 else "")
            for run in runs
        )
        return Planned(
            options,
            line,
            (
                f"step      {model} at {image_size}, measured (--from_run): {where}",
                *measured_step.line_text(line),
            ),
            mismatch,
        )
    line = None
    if curve.study and not mismatch and not DEVICE_FLAGS & given:
        batches = set(curve.measured) | set(curve.measured_steps)
        line = measured_step.study_host_line(curve.study, curve.optimizer, batches)
    if line:
        return Planned(
            options,
            line,
            (
                f"step      {model} at {image_size}, measured on the study's host: its "
                f"{curve.optimizer} trials' seconds over their steps (evaluations included, as "
                "the study ran them), one device; --from_run or --device to time another",
                *measured_step.line_text(line),
            ),
        )
    return Planned(options, None, _modelled_lines(options), mismatch)


def _modelled_lines(options):
    """Where a modelled step comes from, and its small-batch penalty."""
    _, half, _, source = options.device_settings()
    step = (
        f"step      the planner's model of {options.model} at {options.image_size} on a "
        f"{options.device} (--device; {source}), no measured run (--from_run)"
    )
    if half > 0:
        penalty = (
            f"penalty   below {half:,.0f} images a device the device runs under half its rate "
            f"({'--half_batch' if options.half_batch >= 0 else 'the calibration'})"
        )
    else:
        penalty = (
            f"penalty   no small-batch penalty known for a {options.device} (its throughputs "
            "are at one batch size; --half_batch gives one): small per-device batches are "
            "optimistic"
        )
    return step, penalty


# --- the report ----------------------------------------------------------------------------
def _steps_text(steps):
    return f"{steps:,.1f}" if steps < 100 else f"{steps:,.0f}"


def _rate_text(curve, batch):
    if curve.tuned_at(batch):
        return f"{curve.tuned_at(batch)[0]:.4g}"
    return "untuned" if curve.untuned_at(batch) else "none"


def _table(cells, curve, value, title):
    """The title and the rows of `cells`, every column as wide as its widest text."""
    header = ["batch"]
    show_steps = bool(curve.measured_steps)
    show_rates = bool(curve.tuned or curve.untuned)
    header += ["steps"] if show_steps else []
    header += ["S(B)"]
    header += ["rate"] if show_rates else []
    header += [f"{c.devices:,}" for c in cells[0]]
    rows = []
    for row in cells:
        batch = row[0].batch
        texts = [f"{batch:,}{'*' if curve.extrapolated(batch) else ' '}"]
        if show_steps:
            measured = curve.measured_steps.get(batch)
            texts.append("-" if measured is None else _steps_text(measured))
        texts.append(_steps_text(curve.steps(batch)))
        if show_rates:
            texts.append(_rate_text(curve, batch))
        for c in row:
            texts.append(
                c.refused or value(c) + (f" a{c.accumulation}" if c.accumulation > 1 else "")
            )
        rows.append(texts)
    widths = [max(len(text) for text in column) + 2 for column in zip(header, *rows)]
    widths[0] = max(widths[0], 9)

    def line(texts):
        return "".join(f"{text:>{width}}" for text, width in zip(texts, widths))

    header[0] += " "
    return [title, line(header), *(line(texts) for texts in rows)]


def _notes(cells, curve):
    notes = []
    if curve.measured_steps:
        notes.append(
            "steps: the study's mean steps to the target at the batches it measured, which "
            "the cells use; -: not measured, the cells use the fit S(B)"
        )
    if curve.tuned or curve.untuned:
        notes.append(
            "rate: the peak rate the study tuned at that batch; untuned: it ran the batch "
            "before's; none: no rate tuned there (a row of the fit)"
        )
    if any(curve.extrapolated(row[0].batch) for row in cells):
        measured = sorted(curve.measured)
        notes.append(
            f"*: outside the batches fitted ({measured[0]:,} .. {measured[-1]:,}): S(B) "
            "extrapolated"
        )
    if any(c.accumulation > 1 for row in cells for c in row):
        notes.append("a<k>: k micro-batches a step (gradient accumulation): b / k images fit")
    notes.append(
        "-: devices do not divide the batch, do not fill whole nodes, or the batch exceeds "
        "the examples; mem: not one image fits"
    )
    return notes


@dataclasses.dataclass(frozen=True)
class Table:
    """The grid planned: its curve, Planned, device counts and cells."""

    curve: object
    plan: Planned
    counts: tuple
    cells: list


def table(options, given=frozenset(), curve=None):
    """The Table of the flags (None: no curve flag given); `curve`: the
    StepsCurve already read, else the flags'; `given`: the names of the flags
    on the command line."""
    if curve is None and options.target_noise_from_run:  # the run's model, by the study's ratio
        curve = run_noise.run_noise_curve(options)
    elif curve is None:
        curve = target_curve.curve(options)
    if curve is None:
        if options.from_run:
            raise ConfigError(
                "--from_run: it times the steps of time to accuracy: give a source of the "
                "steps to the target with it (--target_study, --target_s_min or "
                "--target_noise_scale)."
            )
        return None
    others = [f"--{name}" for name in OTHER_PLANS if getattr(options, name)]
    if others:
        raise ConfigError(
            f"{target_curve.source_flags(options)[0]}: time to accuracy plans its own batch x "
            f"devices grid: not with {', '.join(others)}."
        )
    plan = planned(options, curve, given)
    counts = columns(plan.options, plan.line, given)
    return Table(curve, plan, counts, grid(plan.options, curve, counts, plan.line))


def report(options, duration, given=frozenset()):
    """The time-to-accuracy report (None: no curve flag given); `duration`
    formats seconds; `given`: the names of the flags on the command line."""
    found = table(options, given)
    return None if found is None else table_text(found, duration, given)


def table_text(found, duration, given=frozenset()):
    """The report of the Table `found`."""
    curve, plan, counts, cells = found.curve, found.plan, found.counts, found.cells
    options = plan.options
    lines = [
        f"time to {curve.target or 'the target'}: {curve.equation()}",
        f"curve     {curve.source}",
        *curve.details,
        *([_tuned_line(curve)] if curve.tuned else []),
        *([_untuned_line(curve)] if curve.untuned else []),
        *plan.step_lines,
        f"cluster   {options.devices_per_node} devices a node, {options.algorithm} all-reduce "
        f"of {options.gradient_dtype} gradients, overlap {'on' if options.overlap else 'off'}",
        f"devices   {', '.join(f'{n:,}' for n in counts)} "
        f"({_columns_source(options, plan, given)})",
        *([f"mismatch  {plan.mismatch} (--target_from_other_model)"] if plan.mismatch else []),
        "",
    ]
    lines += _table(
        cells,
        curve,
        lambda c: duration(c.seconds),
        "time to accuracy, global batch (rows) x devices (columns):",
    )
    lines.append("")
    lines += _table(
        cells,
        curve,
        lambda c: duration(c.device_hours * 3600),
        "device time (devices x time to accuracy; / 3600 s: device-hours):",
    )
    lines += ["", *_notes(cells, curve)]
    fastest, cheapest = best(cells)
    if fastest is None:
        lines.append("no cell of the grid can run")
        return "\n".join(lines)
    for name, c in (("fastest ", fastest), ("cheapest", cheapest)):
        lines.append(f"{name}  {answer(c, curve, plan, duration)}")
    return "\n".join(lines)


def _columns_source(options, plan, given):
    if options.target_devices:
        return "--target_devices"
    if plan.line and "devices" not in given:
        return "the devices the step was measured on; --devices or --target_devices for others"
    return "--devices" + ("" if "devices" in given else "' default; --target_devices for a sweep")


def answer(c, curve, plan, duration):
    """One answer line: the cell, its time and device-hours, where its steps come from."""
    steps = (
        f"{_steps_text(c.steps)} steps measured"
        if c.measured
        else f"{_steps_text(c.steps)} steps by the fit"
    )
    return (
        f"batch {c.batch:,} on {c.devices:,} device{'s' if c.devices > 1 else ''}"
        f"{f' x {c.accumulation} micro-batches' if c.accumulation > 1 else ''}: "
        f"{duration(c.seconds)}, {c.device_hours:.3g} device-hours "
        f"({steps}, of {c.step.step * 1e3:.4g} ms)"
        f"{' (extrapolated)' if c.extrapolated else ''}{_tuned_text(curve, c.batch)}"
        + (f"; {plan.mismatch}" if plan.mismatch else "")
    )


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
