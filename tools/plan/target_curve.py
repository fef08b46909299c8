"""Steps to a target accuracy against the global batch: the curve of
McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"
(arXiv:1812.06162), from one of three sources.

Steps S and examples E = B S to a target trade off as

    (S / S_min - 1) (E / E_min - 1) = 1,  i.e.  S(B) = S_min + E_min / B
                                               = S_min (1 + B_crit / B),

B_crit = E_min / S_min: the batch that takes twice the fewest steps and
twice the fewest examples. The sources:

    a steps-to-target study   `keras-lars-study --mode=steps_to_target`'s
                              fit.json, one optimizer's fit (S_min, E_min over
                              the batches where every seed reached the target),
                              and from its steps_to_target.json the peak rate
                              and schedule length it tuned at those batches, and
                              the steps it measured at its untuned batches
    S_min and B_crit (or E_min), given
    a gradient noise scale    B_noise ~ B_crit (the paper's B_simple predicts
                              B_crit) and one measured point, S_1 steps at
                              B_1: S_min = S_1 / (1 + B_noise / B_1)

Every error is one line naming the flag (and the file).
"""

import dataclasses
import math
import os

from keras_lars.tools import untrusted_json
from keras_lars.tools.settings import ConfigError

FIT_FILE = "fit.json"  # tools/batch_study/target_results.write_target_outputs
TABLE_FILE = "steps_to_target.json"  # the same study's table


@dataclasses.dataclass(frozen=True)
class StepsCurve:
    """S(B) = s_min + e_min / B; `measured`: the batches the curve was
    measured at (a study's fitted batches, the noise scale's one point;
    empty: none, S_min and B_crit given); `max_batch`: the study's training
    examples (None: not known); `source`: where it comes from, as text."""

    s_min: float
    e_min: float
    source: str
    measured: tuple = ()
    max_batch: int = None
    target: str = ""  # "accuracy 0.9 of simple_cnn on fashion_mnist" where known
    model: str = ""  # the model the study trained, where known
    image_size: int = 0  # and its image side
    tuned: tuple = ()  # (batch, peak rate, schedule steps) the study chose, where known
    # (batch, steps to the target or None, peak rate, schedule steps): the study's
    # untuned batches (one trial at the choice of the batch before; not fitted)
    untuned: tuple = ()
    measured_steps: dict = dataclasses.field(default_factory=dict)  # {batch: mean steps}
    study: str = ""  # the study's directory, where the curve is a study's
    optimizer: str = ""
    details: tuple = ()  # lines the report prints under the source (run_noise.py's)

    def tuned_at(self, batch):
        """(peak rate, schedule steps) the study tuned at `batch`, or None."""
        return next(((r, t) for b, r, t in self.tuned if b == batch), None)

    def untuned_at(self, batch):
        """(steps or None, peak rate, schedule steps) the study ran untuned at
        `batch`, or None."""
        return next(((s, r, t) for b, s, r, t in self.untuned if b == batch), None)

    @property
    def b_crit(self):
        return self.e_min / self.s_min if self.s_min > 0 else math.inf

    def steps(self, batch):
        """S(B): the steps to the target at global batch `batch`."""
        return self.s_min + self.e_min / batch

    def extrapolated(self, batch):
        """True where `batch` lies outside the measured batches (a curve with
        none measured extrapolates nowhere: it is the given model)."""
        if not self.measured:
            return False
        return not min(self.measured) <= batch <= max(self.measured)

    def equation(self):
        b_crit = "inf (S = S_min)" if math.isinf(self.b_crit) else f"{self.b_crit:,.0f}"
        return (
            f"S(B) = S_min + E_min / B = {self.s_min:,.1f} + {self.e_min:,.0f} / B steps, "
            f"B_crit = E_min / S_min = {b_crit}"
        )


def given_curve(s_min, e_min, b_crit):
    """The curve of --target_s_min with --target_b_crit or --target_e_min
    (each > 0; the third follows)."""
    if s_min <= 0:
        raise ConfigError(
            f"--target_s_min={s_min:g}: must be > 0 with --target_b_crit or --target_e_min."
        )
    if bool(e_min) == bool(b_crit):
        raise ConfigError(
            "--target_s_min: give one of --target_b_crit and --target_e_min with it "
            f"(given: --target_b_crit={b_crit:g}, --target_e_min={e_min:g})."
        )
    for name, value in (("target_b_crit", b_crit), ("target_e_min", e_min)):
        if value < 0:
            raise ConfigError(f"--{name}={value:g}: must be > 0.")
    e_min = e_min or s_min * b_crit
    source = f"--target_s_min={s_min:g}, " + (
        f"--target_b_crit={b_crit:g}" if b_crit else f"--target_e_min={e_min:g}"
    )
    return StepsCurve(s_min, e_min, source)


def check_measured_point(steps, batch, flag, noise_scale=None):
    """ConfigError unless --target_measured_steps and --target_measured_batch
    (and a `noise_scale` given) are > 0: `flag` needs them."""
    values = (("target_measured_steps", steps), ("target_measured_batch", batch))
    if noise_scale is not None:
        values = (("target_noise_scale", noise_scale), *values)
    for name, value in values:
        if value <= 0:
            raise ConfigError(
                f"--{name}={value:g}: must be > 0 ({flag} needs "
                "--target_measured_steps and --target_measured_batch: the steps one run took "
                "to the target at that batch)."
            )


def noise_scale_curve(noise_scale, steps, batch):
    """The curve through one measured point (`steps` at `batch`) with
    B_crit = the measured noise scale."""
    check_measured_point(steps, batch, "--target_noise_scale", noise_scale)
    s_min = steps / (1 + noise_scale / batch)
    source = (
        f"B_crit = --target_noise_scale={noise_scale:g}, through {steps:g} steps at batch "
        f"{batch:,} (--target_measured_steps, --target_measured_batch)"
    )
    return StepsCurve(s_min, s_min * noise_scale, source, measured=(batch,))


def read_json(flag, path, lines=False):
    """The JSON document in `path` (`lines`: the documents of a JSON-lines
    file), read as untrusted (tools/untrusted_json.py); a ConfigError naming
    `flag` and the file otherwise."""
    read = untrusted_json.read_json_lines if lines else untrusted_json.read_json
    try:
        return read(path)
    except untrusted_json.UntrustedFileError as error:
        raise ConfigError(f"{flag}: {path}: {error}.") from None


def checked(flag, path, read, *arguments):
    """read(*arguments) (fields of a file's document), its
    UntrustedFileError a ConfigError naming `flag` and the file."""
    try:
        return read(*arguments)
    except untrusted_json.UntrustedFileError as error:
        raise ConfigError(f"{flag}: {path}: {error}.") from None


@dataclasses.dataclass(frozen=True)
class StudyFit:
    """One optimizer's fit in a study's fit.json, each field checked."""

    path: str
    document: dict
    optimizer: str
    s_min: float
    e_min: float
    batches: tuple
    model: str
    image_size: int
    examples: int


def study_fit(directory, optimizer):
    """The StudyFit of `optimizer` ('': the study's only one) in the
    steps-to-target study in `directory`."""
    flag = f"--target_study={directory}"
    if not os.path.isdir(directory):
        raise ConfigError(f"{flag}: no such directory.")
    path = os.path.join(directory, FIT_FILE)
    document = read_json(flag, path)
    fits = document.get("fits") if isinstance(document, dict) else None
    study = document.get("study") if isinstance(document, dict) else None
    if not isinstance(fits, dict) or not isinstance(study, dict) or not fits:
        raise ConfigError(
            f'{flag}: {path} is not a steps-to-target study\'s fit (no "study" and "fits").'
        )
    names = ", ".join(sorted(fits))
    if not optimizer:
        if len(fits) > 1:
            raise ConfigError(
                f"--target_optimizer: the study {path} has several optimizers ({names}): name one."
            )
        optimizer = next(iter(fits))
    if optimizer not in fits:
        raise ConfigError(
            f"--target_optimizer={optimizer}: the study {path} has no {optimizer} (it has {names})."
        )
    fit = fits[optimizer]
    if fit is None:
        raise ConfigError(
            f"--target_optimizer={optimizer}: the study {path} has no fit for {optimizer}: "
            "fewer than 3 batches where every seed reached the target."
        )
    s_min, e_min, batches = checked(flag, path, _fit, fit, optimizer)
    model, image_size, examples = checked(flag, path, _study_fields, study)
    return StudyFit(path, document, optimizer, s_min, e_min, batches, model, image_size, examples)


def study_curve(directory, optimizer):
    """One optimizer's curve from a steps-to-target study's fit.json
    (`optimizer` '': the study's only one)."""
    flag = f"--target_study={directory}"
    found = study_fit(directory, optimizer)
    path, document, optimizer = found.path, found.document, found.optimizer
    s_min, e_min, batches = found.s_min, found.e_min, found.batches
    model, image_size, examples = found.model, found.image_size, found.examples
    if s_min + e_min <= 0:
        raise ConfigError(
            f"{flag}: {path}: the fit of {optimizer} has S_min {s_min:g}, E_min {e_min:g}: "
            "no curve."
        )
    study = document["study"]
    target = f"accuracy {study.get('target_accuracy')} of {model} on {study.get('dataset')}"
    tuned, untuned, measured = _table_points(directory, flag, optimizer, batches)
    noise = checked(flag, path, _noise_scale_text, document, optimizer)
    return StepsCurve(
        s_min,
        e_min,
        f"--target_study={path}, {optimizer}, fitted on batches "
        f"{', '.join(f'{b:,}' for b in batches)}" + noise,
        measured=batches,
        max_batch=examples or None,
        target=target,
        model=model,
        image_size=image_size,
        tuned=tuned,
        untuned=untuned,
        measured_steps=measured,
        study=directory,
        optimizer=optimizer,
    )


def _fit(fit, optimizer):
    """(S_min, E_min, fitted batches) of a fit.json fit, each checked."""
    where = f"fits.{optimizer}."
    if not isinstance(fit, dict):
        raise untrusted_json.UntrustedFileError(f"fits.{optimizer}: not an object")
    s_min = untrusted_json.number(fit, "s_min", positive=False, where=where)
    e_min = untrusted_json.number(fit, "e_min", positive=False, where=where)
    return s_min, e_min, untrusted_json.integers(fit, "batches", where=where)


def _study_fields(study):
    """(model, image side, training examples) of a fit.json's study (''/0: not said)."""
    return (
        untrusted_json.text(study, "model", where="study."),
        untrusted_json.integer(study, "image_size", where="study.", default=0),
        untrusted_json.integer(study, "train_examples", where="study.", default=0),
    )


def _table_points(directory, flag, optimizer, batches):
    """From the study's table, for `optimizer`: ((batch, peak rate, schedule
    steps), ...) it chose at the fitted `batches` (those where every seed
    reached the target), ((batch, steps or None, peak rate, schedule steps),
    ...) it measured at its untuned batches (`tuned` false; a table of an
    older study has none), and {batch: mean steps measured} at the fitted
    batches and the untuned ones that reached the target; all empty when the
    study has no table."""
    path = os.path.join(directory, TABLE_FILE)
    if not os.path.lexists(path):
        return (), (), {}
    document = read_json(flag, path)
    rows = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        raise ConfigError(f'{flag}: {path}: no "rows": not a steps-to-target table.')
    tuned, untuned, measured = {}, {}, {}
    for number, r in enumerate(rows):
        if not isinstance(r, dict) or r.get("optimizer") != optimizer:
            continue
        batch, rate, budget, steps, is_tuned = checked(flag, path, _row, r, number)
        if not is_tuned:
            untuned[batch] = (steps, rate, budget)
        elif batch in batches:
            tuned[batch] = (rate, budget)
        if steps is not None and (batch in batches or not is_tuned):
            measured[batch] = steps
    return (
        tuple((b, *tuned[b]) for b in sorted(tuned)),
        tuple((b, *untuned[b]) for b in sorted(untuned)),
        measured,
    )


def _row(row, number):
    """(batch, peak rate, schedule steps, mean steps or None, tuned) of a
    table row, each checked."""
    where = f"rows[{number}]."
    tuned = row.get("tuned", True)
    if not isinstance(tuned, bool):
        raise untrusted_json.UntrustedFileError(f"{where}tuned: {tuned!r} is not true or false")
    steps = row.get("steps_mean")
    if "steps_mean" not in row and not tuned:
        raise untrusted_json.UntrustedFileError(f"{where}steps_mean: missing")
    return (
        untrusted_json.integer(row, "batch_size", where=where),
        untrusted_json.number(row, "chosen_rate", where=where),
        untrusted_json.integer(row, "budget_steps", where=where),
        None if steps is None else untrusted_json.number(row, "steps_mean", where=where),
        tuned,
    )


def source_flags(options):
    """The flags of the steps-to-target sources given (empty: none)."""
    return [
        name
        for name, given in (
            ("--target_study", options.target_study),
            (
                "--target_s_min",
                options.target_s_min or options.target_b_crit or options.target_e_min,
            ),
            ("--target_noise_scale", options.target_noise_scale),
        )
        if given
    ]


def _noise_scale_text(document, optimizer):
    """'; noise-scale average B_simple 120 at batch 512 (...)' where the
    study's fit.json holds one for `optimizer` (its "noise_scales"), else ''
    (also where that run measured none: a null, as for a diverged run). The
    study's value is the estimator's moving average read at the target step,
    weighted toward early training, so the line says it is no B_crit."""
    scales = document.get("noise_scales")
    if scales is None:
        return ""
    if not isinstance(scales, dict):
        raise untrusted_json.UntrustedFileError("noise_scales: not an object of optimizers")
    found = scales.get(optimizer)
    if found is None or (isinstance(found, dict) and found.get("noise_scale") is None):
        return ""
    where = f"noise_scales.{optimizer}."
    scale = untrusted_json.number(found, "noise_scale", where=where)
    batch = untrusted_json.integer(found, "batch_size", where=where)
    return (
        f"; noise-scale average B_simple {scale:,.0f} at batch {batch} (the study's moving "
        "average at the target step, lagged toward early training: not a B_crit)"
    )


def one_source(options):
    """The flag of the one steps-to-target source given ('': none)."""
    sources = source_flags(options)
    if len(sources) > 1:
        raise ConfigError(
            f"{sources[0]}: one source of steps to the target, not also {sources[1]}."
        )
    return sources[0] if sources else ""


def curve(options):
    """The StepsCurve the flags give (None: no time-to-accuracy source);
    one source at most."""
    if not one_source(options):
        return None
    if options.target_study:
        return study_curve(options.target_study, options.target_optimizer)
    if options.target_noise_scale:
        return noise_scale_curve(
            options.target_noise_scale, options.target_measured_steps, options.target_measured_batch
        )
    return given_curve(options.target_s_min, options.target_e_min, options.target_b_crit)
