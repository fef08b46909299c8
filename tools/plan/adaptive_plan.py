"""An adaptive-batch run planned (keras-lars-plan --adaptive_batch): its
expected steps, examples and time to accuracy, from a steps-to-target
study's fit (target_curve.py) and its noise scale measured at fixed weights
along the chosen run (noise_scales.json, tools/batch_study/noise_along.py).

Progress phi in [0, 1] is the fraction of the way to the goal. The study's
B_simple(phi) is its measured points for the optimizer (the rows' fraction
and noise_scale, at the measured batch nearest the start; rows without a
noise_scale are not measurements), or the user's (--adaptive_noise_curve,
with any source of S_min and B_crit), piecewise linear between them and
constant beyond the first and the last. Its SHAPE gives the critical batch
along the run, the fit's B_crit = E_min / S_min its SCALE:

    B_crit(phi) = B_crit_fit * B_simple(phi) / integral_0^1 B_simple dphi

so that a fixed batch B takes exactly the fit's steps and examples

    S = S_min integral_0^1 (1 + B_crit(phi) / B) dphi = S_min (1 + B_crit_fit / B)
    E = S_min integral_0^1 (B + B_crit(phi)) dphi      = B S

and a constant B_simple gives B_crit(phi) = B_crit_fit. A step at batch B
advances phi by 1 / (S_min (1 + B_crit(phi) / B)); taken continuously, n
steps at batch B from phi = a reach b with

    n = S_min (b - a) + (E_min / B) integral_a^b B_simple dphi / integral_0^1 B_simple dphi

(B_simple linear on each piece: a quadratic in b, solved exactly). The
controller runs as keras-lars-train --adaptive_batch runs it: epochs of
floor(N / B) steps (N training examples, keras_lars.steps_per_epoch), and
at the end of every `every_epochs` epochs before the goal the batch becomes

    B' = keras_lars.adaptive_batch.next_batch_size(B, B_simple of the interval,
             target, B_min, B_max, growth, q = the devices)

with B_simple of the interval the curve's mean over the progress it made
(integral over [phi_last, phi] / (phi - phi_last); a constant's exactly
itself). The run ends at the step where phi reaches 1 (rounded up to a
whole step): steps = sum of each phase's, examples = sum of steps x batch,
time = sum of steps x the step at that batch on the planned devices
(time_to_accuracy.cell, as the grid's).
With B_min = B_max the batch never changes and the steps are ceil(S(B)).
The rule of --adaptive_batch sets the learning rate, which the curve takes
as tuned at every batch: the plan is the same under each rule.
"""

import bisect
import dataclasses
import functools
import itertools
import math

import keras_lars
from keras_lars.adaptive_batch import next_batch_size
from keras_lars.tools.plan import run_noise
from keras_lars.tools.plan import target_curve
from keras_lars.tools.plan import time_to_accuracy as tta
from keras_lars.tools.plan.target_flags import parse_noise_curve
from keras_lars.tools.settings import ConfigError

MAX_DECISIONS = 10_000  # a run that could take more is refused before it is planned


@dataclasses.dataclass(frozen=True)
class NoiseCurve:
    """B_simple(phi): piecewise linear through (fractions, values), constant
    beyond the ends; measured at `batch` for `optimizer`, read from `path`."""

    fractions: tuple
    values: tuple
    batch: int = 0
    optimizer: str = ""
    path: str = ""

    def at(self, phi):
        """B_simple at progress `phi`."""
        xs, vs = self.fractions, self.values
        if phi <= xs[0]:
            return vs[0]
        if phi >= xs[-1]:
            return vs[-1]
        i = bisect.bisect_right(xs, phi)
        x0, x1, v0, v1 = xs[i - 1], xs[i], vs[i - 1], vs[i]
        return v0 + (v1 - v0) * (phi - x0) / (x1 - x0)

    def pieces(self, a, b):
        """[(x0, x1, v0, v1)]: the linear pieces of B_simple over [a, b]."""
        xs = [a, *(x for x in self.fractions if a < x < b), b]
        return [(x0, x1, self.at(x0), self.at(x1)) for x0, x1 in itertools.pairwise(xs)]

    def integral(self, a, b):
        """integral_a^b B_simple dphi (exact: trapezoids of linear pieces)."""
        return sum((x1 - x0) * (v0 + v1) / 2 for x0, x1, v0, v1 in self.pieces(a, b))

    def mean(self, a, b):
        """B_simple's mean over [a, b] (a < b): the first piece's plus the
        others' departures from it, weighted by width (a constant's: itself)."""
        pieces = self.pieces(a, b)
        first = (pieces[0][2] + pieces[0][3]) / 2
        departures = sum((x1 - x0) * ((v0 + v1) / 2 - first) for x0, x1, v0, v1 in pieces)
        return first + departures / sum(x1 - x0 for x0, x1, _, _ in pieces)

    @functools.cached_property
    def total(self):
        """integral_0^1 B_simple dphi (the mean over the run)."""
        return self.integral(0.0, 1.0)


def steps_between(curve, noise, a, b, batch):
    """Steps from progress `a` to `b` at `batch` (the module docstring; from
    0 to 1: the fit's S(B) = S_min + E_min / B)."""
    return curve.s_min * (b - a) + curve.e_min / batch * (noise.integral(a, b) / noise.total)


def progress_after(curve, noise, a, steps, batch):
    """The progress `steps` steps at `batch` reach from `a` (1 at most)."""
    c = curve.e_min / (batch * noise.total)
    left = steps
    for x0, x1, v0, v1 in noise.pieces(a, 1.0):
        whole = curve.s_min * (x1 - x0) + c * (x1 - x0) * (v0 + v1) / 2
        if whole >= left:  # S t + c (v0 t + k t^2 / 2) = left, t = phi - x0
            k, p = (v1 - v0) / (x1 - x0), curve.s_min + c * v0
            t = 2 * left / (p + math.sqrt(max(0.0, p * p + 2 * c * k * left)))
            return min(x0 + t, x1)
        left -= whole
    return 1.0


@dataclasses.dataclass(frozen=True)
class Decision:
    """One decision: after `epoch` epochs and `step` steps, at progress
    `progress`, B_simple of the interval `noise_scale`: `batch` -> `new_batch`."""

    epoch: int
    step: int
    progress: float
    noise_scale: float
    batch: int
    new_batch: int


@dataclasses.dataclass(frozen=True)
class AdaptiveRun:
    """The simulated run: `phases` ((batch, steps), ...) in order, its
    decisions, and the epochs to the goal (the last one partly run)."""

    phases: tuple
    decisions: tuple
    epochs: int

    @property
    def steps(self):
        return sum(steps for _, steps in self.phases)

    @property
    def examples(self):
        return sum(batch * steps for batch, steps in self.phases)


def simulate(
    curve,
    noise,
    examples,
    start,
    minimum,
    maximum,
    growth,
    target,
    every_epochs=1,
    multiple_of=1,
):
    """The AdaptiveRun of the controller (the module docstring) on
    `examples` training examples, from batch `start` within [minimum,
    maximum]; `curve` a target_curve.StepsCurve, `noise` a NoiseCurve."""
    batch, begin, done = start, 0.0, 0  # the phase's batch, its start, its steps so far
    last, epoch, step = 0.0, 0, 0
    phases, decisions = [], []
    while True:
        per_epoch = keras_lars.steps_per_epoch(examples, batch)
        block = per_epoch * every_epochs
        left = steps_between(curve, noise, begin, 1.0, batch) - done
        if left <= block:  # the goal within these epochs: no decision
            final = math.ceil(left)
            phases.append((batch, done + final))
            epochs = epoch + math.ceil(final / per_epoch)
            return AdaptiveRun(tuple(phases), tuple(decisions), epochs)
        done, step, epoch = done + block, step + block, epoch + every_epochs
        now = progress_after(curve, noise, begin, done, batch)
        reading = noise.mean(last, now) if now > last else noise.at(now)
        new = next_batch_size(batch, reading, target, minimum, maximum, growth, multiple_of)
        decisions.append(Decision(epoch, step, now, reading, batch, new))
        last = now
        if new != batch:
            phases.append((batch, done))
            batch, begin, done = new, now, 0


# --- the study's noise curve ------------------------------------------------------------------
def study_noise(directory, optimizer, batch):
    """The NoiseCurve of `optimizer` in the study's noise_scales.json, at its
    measured batch nearest `batch` (log scale; ties: the larger); a
    ConfigError naming the flag, the file and the field otherwise."""
    path, rows = run_noise.noise_rows(
        directory, optimizer, "no noise-scale curve", "--adaptive_batch"
    )
    measured = max({r.batch for r in rows}, key=lambda b: (-abs(math.log(b / batch)), b))
    points = sorted((r.fraction, r.noise_scale) for r in rows if r.batch == measured)
    for (first, _), (second, _) in itertools.pairwise(points):
        if first == second:
            raise ConfigError(
                f"--target_study={directory}: {path}: rows: {optimizer} at batch {measured:,} "
                f"has two measurements at fraction {first:g}: one a point."
            )
    fractions, values = zip(*points)
    return NoiseCurve(fractions, values, measured, optimizer, path)


# --- the report -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Column:
    """The adaptive run on `devices`: its AdaptiveRun and seconds, or why
    it cannot run (`refused`)."""

    devices: int
    run: AdaptiveRun = None
    seconds: float = 0.0
    refused: str = ""


def _bounds(options):
    """(start, B_min, B_max) of the flags."""
    start = options.global_batch_size
    return start, options.adaptive_batch_min or start, options.adaptive_batch_max


def plan_column(options, found, noise, examples, devices):
    """The Column of `devices` for the planned Table `found`."""
    start, low, high = _bounds(options)
    if any(b % devices for b in (start, low, high)):
        return Column(
            devices,
            refused=f"{devices:,} devices do not divide --global_batch_size, "
            "--adaptive_batch_min and _max (each batch is a multiple of the devices)",
        )
    run = simulate(
        found.curve,
        noise,
        examples,
        start,
        low,
        high,
        options.adaptive_batch_growth,
        options.adaptive_batch_target,
        options.adaptive_batch_every_epochs,
        devices,
    )
    seconds = 0.0
    for batch, steps in run.phases:
        c = tta.cell(found.plan.options, found.curve, batch, devices, found.plan.line)
        if c.refused:
            why = "not one image fits" if c.refused == "mem" else "the devices do not fill nodes"
            return Column(devices, run, refused=f"batch {batch:,}: {why}")
        seconds += steps * c.step.step
    return Column(devices, run, seconds)


def _check(options, curve, noise, examples, where):
    """ConfigError where the bounds do not fit the examples, or the run would
    take more than MAX_DECISIONS decisions (before any planning)."""
    _, low, high = _bounds(options)
    if high > examples:
        raise ConfigError(
            f"--adaptive_batch_max={high} exceeds the {examples:,} training examples ({where}): "
            "an epoch would have no step."
        )
    every = options.adaptive_batch_every_epochs
    # the steps are at most S(B_min) (every phase's at B_min), each interval at least B_max's
    decisions = curve.steps(low) / (keras_lars.steps_per_epoch(examples, high) * every)
    if decisions > MAX_DECISIONS:
        raise ConfigError(
            f"--adaptive_batch_every_epochs={every}: the run "
            f"could take up to {decisions:,.0f} decisions to the goal, more than the "
            f"{MAX_DECISIONS:,} planned: decide less often."
        )


def report(options, duration, given=frozenset()):
    """The time-to-accuracy report with the adaptive run of --adaptive_batch
    beside the grid's best fixed batches."""
    curve = target_curve.curve(options)
    if options.adaptive_noise_curve:
        fractions, values = zip(*parse_noise_curve(options.adaptive_noise_curve))
        noise = NoiseCurve(fractions, values, path="--adaptive_noise_curve")
    else:
        noise = study_noise(options.target_study, curve.optimizer, options.global_batch_size)
    examples = curve.max_batch or options.examples
    where = "the study's fit.json study.train_examples" if curve.max_batch else "--examples"
    _check(options, curve, noise, examples, where)
    found = tta.table(options, given, curve)
    columns = [plan_column(options, found, noise, examples, p) for p in found.counts]
    lines = [tta.table_text(found, duration, given), ""]
    lines += _source_lines(options, curve, noise, examples, where)
    for column in columns:
        lines += _column_lines(column, found, duration)
    return "\n".join(lines)


def _source_lines(options, curve, noise, examples, where):
    start, low, high = _bounds(options)
    points = ", ".join(f"{x:g}: {v:,.4g}" for x, v in zip(noise.fractions, noise.values))
    every = options.adaptive_batch_every_epochs
    return [
        f"adaptive  --adaptive_batch={options.adaptive_batch} from batch {start:,} "
        f"(--global_batch_size) within {low:,} .. {high:,} (--adaptive_batch_min, _max), "
        f"at most x{options.adaptive_batch_growth:g} a decision (--adaptive_batch_growth), "
        f"target {options.adaptive_batch_target:g} x B_simple (--adaptive_batch_target), "
        f"deciding every {every} epoch{'s' if every > 1 else ''} of {examples:,} examples "
        f"({where}); the rule sets the rate, which the curve takes as tuned",
        f"B_simple  {_noise_source(noise)}: {points}; piecewise linear, constant beyond; its "
        f"mean over the run {noise.total:,.4g}",
        f"B_crit    at p = {curve.b_crit:,.4g} x B_simple(p) / {noise.total:,.4g}: the "
        + (
            f"fit's E_min / S_min (fit.json fits.{curve.optimizer})"
            if curve.study
            else "curve's E_min / S_min (its line above)"
        )
        + " shaped by B_simple, so that a fixed batch B takes the curve's S(B)",
    ]


def _noise_source(noise):
    """Where the B_simple curve comes from."""
    if noise.batch:
        return (
            f"of {noise.optimizer} at batch {noise.batch:,} (the measured batch nearest the "
            f"start) by progress p to the goal, from {noise.path} (rows' fraction: noise_scale)"
        )
    return f"by progress p to the goal, from {noise.path} (fraction: B_simple)"


def _column_lines(column, found, duration):
    """The adaptive run on one column's devices, the best fixed batches of
    that column, and the decisions that changed the batch."""
    p = column.devices
    on = f"on {p:,} device{'s' if p > 1 else ''}"
    if column.refused and column.run is None:
        return [f"adaptive  {on}: -: {column.refused}"]
    run = column.run
    phases = ", ".join(f"{batch:,}: {steps:,}" for batch, steps in run.phases)
    hours = column.seconds * p / 3600
    time = column.refused or f"{duration(column.seconds)}, {hours:.3g} device-hours"
    lines = [
        f"adaptive  {on}: {time} ({run.steps:,} steps, {run.examples:,} examples, "
        f"the goal in epoch {run.epochs}; steps by batch {phases}; each batch's step as the grid's)"
    ]
    cells = [row[found.counts.index(p)] for row in found.cells]
    runs = [c for c in cells if not c.refused]
    fewer = [c for c in runs if c.steps * c.batch <= run.examples]
    fewest = min(fewer, key=lambda c: (c.steps, c.seconds), default=None)
    fastest = min(runs, key=lambda c: (c.seconds, c.device_hours), default=None)
    for name, c in (("fewest steps at no more examples", fewest), ("fastest", fastest)):
        if c is None:
            lines.append(f"  fixed, {name}: none of the grid")
            continue
        lines.append(
            f"  fixed, {name}: {tta.answer(c, found.curve, found.plan, duration)}; "
            f"{c.steps * c.batch:,.0f} examples"
        )
    changed = [d for d in run.decisions if d.new_batch != d.batch]
    kept = len(run.decisions) - len(changed)
    lines.append(
        f"  decisions {len(run.decisions)} ({kept} kept the batch)"
        + (": after epoch (step, progress), B_simple of the interval -> batch" if changed else "")
    )
    for d in changed:
        lines.append(
            f"    epoch {d.epoch} (step {d.step:,}, {d.progress:.3f}): B_simple "
            f"{d.noise_scale:,.6g}: {d.batch:,} -> {d.new_batch:,}"
        )
    return lines
