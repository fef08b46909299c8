"""The time-to-accuracy planner checked against measurement, in one run:

(1) a short run of the study's model at one batch (--calibration_batch,
    --calibration_steps, no evaluation) measures this machine's step;
(2) keras-lars-plan --target_study=STUDY --from_run=(that run)
    --target_batches=(--batches) plans the time to the study's target at
    the other batches, on this machine (its table is printed as it is);
(3) each of those batches is trained to the target with the study's
    settings there: its best trial's config (the tuned peak rate, schedule
    length, warmup, momentum, evaluation cadence, seed 0) as the study
    stored it in trials.jsonl, nothing typed here;
(4) planned / measured time to the target at each batch, with the steps and
    the step time it is made of, and whether the planner's fastest and
    cheapest batches are the measured ones.    goal: within +-25% at every
    batch, and the same choices

On a shared machine the speed can change between the short run and the
runs to the target. With --probe (the default) the short run is repeated
just before each of them, and the table's last ratio is the plan made from
that repeat: the planner's error with the machine's change left out.

The planned time is training time (steps x step), so the measured time is
too: the run's seconds to the evaluation that reached the target, less the
seconds of the evaluations to it (the run's own count: evaluation_seconds). The
planned steps are the study's mean steps to the target at that batch (its
seeds); the measured ones are this run's.

    python -m keras_lars.tools.benchmark_plan [--study=docs/batch_study/fashion_mnist_steps
        --optimizer=lars --calibration_batch=256 --batches=64,1024]

Defaults take about 5 minutes on a quiet 2-core CPU.
"""

import dataclasses
import gc
import os
import shutil
import tempfile

import keras
from absl import app

from keras_lars.tools import settings
from keras_lars.tools import train
from keras_lars.tools import untrusted_json
from keras_lars.tools.batch_study.runner import train_logged
from keras_lars.tools.model_dir_names import CHECKPOINTS
from keras_lars.tools.plan import target_curve
from keras_lars.tools.plan import time_to_accuracy
from keras_lars.tools.plan.config import PlanSettings
from keras_lars.tools.plan.report import duration
from keras_lars.tools.plan.target_flags import parse_counts
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import setting
from keras_lars.tools.study_files import TRIALS_FILE

GOAL = 0.25  # |planned / measured - 1| at most this at every batch


def _batches(value, config):
    try:
        found = parse_counts(value)
    except ValueError as error:
        return f"must be global batches separated by commas: {error}"
    if config.calibration_batch in found:
        return f"must not hold --calibration_batch ({config.calibration_batch}): other batches"
    return None


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    study: str = setting(
        "docs/batch_study/fashion_mnist_steps",
        "A steps-to-target study (keras-lars-study --mode=steps_to_target's directory): its "
        "curve, its tuned settings and its trials.",
    )
    optimizer: str = setting("lars", "The study's optimizer to plan and train.")
    calibration_batch: int = setting(
        256, "Global batch of the short run that times this machine's step.", check=at_least(1)
    )
    calibration_steps: int = setting(
        100, "Steps of the short run (no evaluation).", check=at_least(10)
    )
    batches: str = setting(
        "64,1024",
        "The other global batches to plan and train to the target (ones the study tuned).",
        check=_batches,
    )
    probe: bool = setting(
        True,
        "Repeat the short run just before each run to the target, and compare the plan made "
        "from it too (a shared machine's change of speed apart from the planner's error).",
    )
    work_dir: str = setting(
        "", "Where the runs are kept; empty: a temporary folder, removed at the end."
    )

    def __post_init__(self):
        settings.check(self)


# --- the study's settings ------------------------------------------------------------------
def best_trials(study, optimizer, batches):
    """{batch: the config dict of the study's best trial there}: seed 0 of
    the tuned peak rate and schedule length the study chose (its
    steps_to_target.json, as the planner reads it), from trials.jsonl.
    ConfigError naming the study where a batch has none."""
    curve = target_curve.study_curve(study, optimizer)
    chosen = {}
    for batch in batches:
        tuned = curve.tuned_at(batch)
        if tuned is None:
            found = ", ".join(f"{b:,}" for b, _, _ in curve.tuned)
            raise ConfigError(
                f"--study={study}: {optimizer} tuned no rate at batch {batch:,} (it tuned "
                f"{found}): no settings to train it with."
            )
        chosen[batch] = tuned
    path = os.path.join(study, TRIALS_FILE)
    try:
        records = untrusted_json.read_json_lines(path)
    except untrusted_json.UntrustedFileError as error:
        raise ConfigError(f"--study={study}: {TRIALS_FILE}: {error}.") from None
    found = {}
    for record in records:
        row, config = record.get("row", {}), record.get("config", {})
        batch = row.get("batch_size")
        if (
            row.get("optimizer") == optimizer
            and batch in chosen
            and row.get("seed") == 0
            and not config.get("noise_scale")
            and (row.get("peak_learning_rate"), row.get("budget_steps")) == chosen[batch]
        ):
            found.setdefault(batch, config)
    missing = [b for b in batches if b not in found]
    if missing:
        raise ConfigError(
            f"--study={study}: {TRIALS_FILE} has no seed-0 trial of {optimizer} at the chosen "
            f"settings of batch {missing[0]:,} (peak rate {chosen[missing[0]][0]:g} over "
            f"{chosen[missing[0]][1]:,} steps)."
        )
    return found


def study_config(stored, model_dir, **changes):
    """The train.Config of a stored trial config, in `model_dir`, with `changes`."""
    known = {f.name for f in dataclasses.fields(train.Config)}
    unknown = sorted(set(stored) - known)
    if unknown:
        raise ConfigError(
            f"{TRIALS_FILE}: config.{unknown[0]}: not a setting of this version's training tool."
        )
    return train.Config(**{**stored, "model_dir": model_dir, **changes})


# --- training -------------------------------------------------------------------------------
def trained(config):
    """Trains `config` (its output in its model dir's train.log); its summary."""
    summary = train_logged(config, "the benchmark's next run")
    keras.backend.clear_session()
    gc.collect()
    shutil.rmtree(os.path.join(config.model_dir, CHECKPOINTS), ignore_errors=True)
    return summary


@dataclasses.dataclass(frozen=True)
class Measured:
    """A run to the target: `steps` to it (None: not reached in its budget),
    `seconds` of training to it, evaluations left out, and those left out."""

    steps: int
    seconds: float
    evaluation_seconds: float

    @property
    def step(self):
        return self.seconds / self.steps


def measured(summary):
    """The Measured of a run's summary: to the target, its seconds less
    those of the evaluations within them; not reached, every evaluation's."""
    found = summary["target"]
    if not found["reached"]:
        spent = sum(record.get("evaluation_seconds", 0.0) for record in summary["history"])
        return Measured(None, float("nan"), spent)
    spent = found["evaluation_seconds"]
    return Measured(found["step"], found["seconds"] - spent, spent)


# --- planned against measured ---------------------------------------------------------------
def planned(study, optimizer, run_dir, batches):
    """(the planner's report, {batch: its Cell}): keras-lars-plan
    --target_study --from_run --target_batches, on the devices the run used."""
    given = frozenset(("target_study", "target_optimizer", "from_run", "target_batches"))
    options = PlanSettings(
        target_study=study,
        target_optimizer=optimizer,
        from_run=(run_dir,),
        target_batches=",".join(map(str, batches)),
    )
    text = time_to_accuracy.report(options, duration, given)
    curve = target_curve.curve(options)
    plan = time_to_accuracy.planned(options, curve, given)
    counts = time_to_accuracy.columns(plan.options, plan.line, given)
    cells = time_to_accuracy.grid(plan.options, curve, counts, plan.line)
    return text, {row[0].batch: row[0] for row in cells}


def choices(seconds):
    """(fastest, cheapest) batch of {batch: seconds on one device}; None
    where none has a time. On one device the device-hours are the time."""
    timed = {b: s for b, s in seconds.items() if s == s}  # not NaN
    if not timed:
        return None, None
    fastest = min(timed, key=lambda b: (timed[b], b))
    return fastest, fastest


def comparison(cells, runs, speeds=None, goal=GOAL):
    """(the planned / measured table's lines, whether the goal is met):
    `cells` {batch: planned Cell}, `runs` {batch: Measured}; `speeds`
    {batch: the machine's speed just before its run / at the short run}
    adds the ratio of the plan made at that speed."""
    header = (
        "batch",
        "steps planned",
        "measured",
        "step planned",
        "measured",
        "time planned",
        "measured",
        "planned/measured",
        "evaluations",
        *(("from the probe",) if speeds else ()),
    )
    rows, met = [], True
    for batch in sorted(runs):
        cell, run = cells[batch], runs[batch]
        if run.steps is None:
            rows.append((f"{batch:,}", f"{cell.steps:,.0f}", "not reached", *("-",) * 5))
            rows[-1] += (f"{run.evaluation_seconds:.0f} s", *(("-",) if speeds else ()))
            met = False
            continue
        ratio = cell.seconds / run.seconds
        within = abs(ratio - 1) <= goal
        met &= within
        rows.append(
            (
                f"{batch:,}",
                f"{cell.steps:,.0f}",
                f"{run.steps:,}",
                f"{cell.step.step * 1e3:,.1f} ms",
                f"{run.step * 1e3:,.1f} ms",
                duration(cell.seconds),
                duration(run.seconds),
                f"{ratio:.2f}{'' if within else ' (outside)'}",
                f"{run.evaluation_seconds:.0f} s",
                *((f"{ratio / speeds[batch]:.2f}",) if speeds else ()),
            )
        )
    widths = [max(len(t) for t in column) + 2 for column in zip(header, *rows)]
    lines = ["".join(f"{t:>{w}}" for t, w in zip(texts, widths)) for texts in (header, *rows)]
    plan = choices({b: cells[b].seconds for b in runs})
    measure = choices({b: r.seconds for b, r in runs.items()})
    for name, p, m in zip(("fastest", "cheapest"), plan, measure):
        same = p == m
        met &= same
        lines.append(
            f"{name:<9} planned batch {p:,}, measured batch "
            f"{'none' if m is None else f'{m:,}'}: {'the same' if same else 'differ'}"
        )
    verdict = "met" if met else "not met"
    if speeds:
        lines.append(
            "from the probe: planned / measured of the plan made from the short run repeated "
            "just before that batch's run; the machine's speed then: "
            + ", ".join(f"{speeds[b]:.2f} x at {b:,}" for b in sorted(speeds))
        )
    lines.append(
        f"goal: planned / measured within {1 - goal:.2f}..{1 + goal:.2f} at every batch and "
        f"the same choices: {verdict}"
    )
    return lines, met


# --- the run ---------------------------------------------------------------------------------
def benchmark(options, work_dir, say=print):
    """Runs (1)-(4) of the module docstring in `work_dir`; the goal's verdict."""
    batches = parse_counts(options.batches)
    calibration = options.calibration_batch
    stored = best_trials(options.study, options.optimizer, (calibration, *batches))
    run_dir = os.path.join(work_dir, f"calibration-{calibration}")

    def short_run(model_dir):  # its images/s
        config = study_config(
            stored[calibration],
            model_dir,
            train_steps=options.calibration_steps,
            warmup_epochs=0.0,
            eval=False,
            eval_every_steps=0,
            target_accuracy=0.0,
        )
        return trained(config)["train_images_per_second"]

    say(f"(1) {options.calibration_steps} steps at batch {calibration:,}, no evaluation ...")
    speed = short_run(run_dir)
    say(f"    {speed:,.1f} images/s")
    say(f"(2) keras-lars-plan --target_study={options.study} --from_run={run_dir} ...")
    text, cells = planned(options.study, options.optimizer, run_dir, batches)
    say(text)
    runs, speeds = {}, {}
    for batch in batches:
        if options.probe:
            now = short_run(os.path.join(work_dir, f"probe-{batch}"))
            speeds[batch] = now / speed
            say(
                f"(3) the short run again: {now:,.1f} images/s, {speeds[batch]:.2f} x the "
                "calibration's"
            )
        config = study_config(stored[batch], os.path.join(work_dir, f"target-{batch}"))
        say(
            f"(3) batch {batch:,} to {config.target_accuracy}: peak rate "
            f"{config.peak_learning_rate:g} over {config.train_steps:,} steps, seed "
            f"{config.seed} (the study's best trial) ..."
        )
        runs[batch] = measured(trained(config))
        found = runs[batch]
        say(
            "    not reached"
            if found.steps is None
            else f"    reached at step {found.steps:,}: {found.seconds:.1f} s of training, "
            f"{found.evaluation_seconds:.1f} s of evaluations"
        )
    lines, met = comparison(cells, runs, speeds)
    say("(4) planned / measured time to the target, one device:")
    say("\n".join(lines))
    return met


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    options = settings.options_from_flags(BenchmarkSettings)
    print(
        f"Keras {keras.__version__} ({keras.backend.backend()}), {os.cpu_count()} CPUs, load "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; study {options.study}, "
        f"{options.optimizer}",
        flush=True,
    )
    work_dir = options.work_dir or tempfile.mkdtemp(prefix="benchmark_plan_")
    try:
        benchmark(options, work_dir, say=lambda line: print(line, flush=True))
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    finally:
        if not options.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(f"load at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def run(argv=None):
    settings.define_flags(BenchmarkSettings)
    app.run(main, argv)


if __name__ == "__main__":
    run()
