"""The adaptive arm of a steps-to-target study (--search=quasi_random with
--adaptive_batch=RULE): the training tool's adaptive batch, started at each
of --batch_sizes, tuned as the fixed arm is tuned, and set beside a
fixed-batch study of the same target (--compare_study).

A trial takes the fixed arm's point i of the quasi-random search
(quasi_search.py: the same --trials points over the peak rate, 1 - momentum,
the warmup fraction and the budget) at its start batch B_0, in
--noise_scale_micro_batches micro-batches (B_simple is measured from them; the
micro-batch grows with the batch). A run's steps are not known in advance, so
its budget (the decay length) is in epochs: the fixed arm's at B_0, the same
examples, rounded up to whole epochs,

    epochs = ceil(T(B_0) * budget factor / floor(N / B_0)),   warmup = fraction * epochs.

A run whose batch grows needs more examples to the target than one at B_0
(examples grow with the batch): the upper end of --budget_range must leave
room for that, or its trials miss. The tool decides at epoch ends (at least
--adaptive_batch_every_epochs apart): a run that reaches the target within
its first epoch never changes its batch.

It evaluates every max(1, floor(--eval_fraction * F / B_max)) steps (F:
--target_examples_floor, 0: N; B_max: --adaptive_batch_max). By steps, as the
tool evaluates (--eval_every_steps), and bounded by B_max because no step
takes more than B_max examples: a run that needs E >= F examples to the
target takes S >= E / B_max >= F / B_max steps, so the interval is at most
--eval_fraction of S whatever path the batch takes (the fixed arm's bound at
its largest batch). The price: at the small batches early on it evaluates
more often than the fixed arm there, and the seconds (evaluations included, as
the fixed arm's) count that.

Examples to the target (`examples_to`): the batch is B_0 up to the first
decision and B_d after decision d (summary.json's adaptive_batch: at update
s_d, the batch of the updates after it), so with s_0 = 0 and s_{n+1} = inf,

    E(S) = sum_d B_d * max(0, min(S, s_{d+1}) - s_d).

The comparison (`same_steps`): the fixed study's fit of the optimizer,
S(B) = S_min (1 + B_crit / B) = S_min + E_min / B, takes S_a steps at

    B_f = B_crit / (S_a / S_min - 1) = E_min / (S_a - S_min),   E_f = S_a * B_f,

and none where S_a <= S_min: fewer steps than any fixed batch. S_a and E_a
are the means over the seeds at the best trial's settings (the fixed arm's
fit is of its seeds' means), where every seed reached the target.
"""

import math
import os

import numpy as np

from keras_lars.tools import storage
from keras_lars.tools import untrusted_json
from keras_lars.tools.batch_study.quasi_results import QUASI_TABLE_FIELDS
from keras_lars.tools.batch_study.quasi_results import QUASI_TRIAL_FIELDS
from keras_lars.tools.batch_study.quasi_results import quasi_table
from keras_lars.tools.batch_study.quasi_results import seed_mean
from keras_lars.tools.batch_study.quasi_search import point_trial
from keras_lars.tools.batch_study.quasi_search import point_values
from keras_lars.tools.batch_study.results import write_table
from keras_lars.tools.batch_study.target_results import TITLES
from keras_lars.tools.batch_study.target_results import study_header
from keras_lars.tools.batch_study.target_results import trial_rows
from keras_lars.tools.batch_study.target_search import budget_steps
from keras_lars.tools.settings import ConfigError

# The arm's trial rows: the fixed arm's, the budget in epochs (budget_steps: none).
TRIAL_FIELDS = (*QUASI_TRIAL_FIELDS, "budget_epochs", "batch_at_target", "decisions")
COMPARISON_FIELDS = (
    "optimizer",
    "start_batch",
    "seeds",
    "seeds_reached",
    "steps_adaptive",
    "examples_adaptive",
    "seconds_adaptive",
    "steps_shallue",
    "s_min",
    "e_min",
    "b_crit",
    "fixed_batch_same_steps",
    "fixed_examples_same_steps",
    "verdict",
    "nearest_fixed_batch",
    "nearest_fixed_steps",
    "nearest_fixed_examples",
    "nearest_fixed_seconds",
    "fewest_fixed_batch",
    "fewest_fixed_steps",
    "fewest_fixed_examples",
)
FEWER = "fewer steps than any fixed batch"


def eval_interval(search, num_train):
    """The arm's evaluation interval in steps (module docstring)."""
    floor = search.target_examples_floor or num_train
    return max(1, math.floor(search.eval_fraction * floor / search.adaptive["adaptive_batch_max"]))


def adaptive_trial(study, optimizer, batch_size, index, seed, num_train, point=None):
    """Trial `index` of the arm at (optimizer, start batch) with `seed`
    (module docstring); `point`: its u (default: the sequence's)."""
    search = study.search
    values = point_values(search, index, point)
    epoch = num_train // batch_size
    epochs = math.ceil(budget_steps(search, batch_size, num_train) * values[3] / epoch)
    return point_trial(
        study,
        optimizer,
        batch_size,
        index,
        seed,
        values,
        0,  # the length is the epochs
        train_epochs=epochs,
        warmup_epochs=values[2] * epochs,
        eval_every_steps=eval_interval(search, num_train),
        gradient_accumulation_steps=search.noise_scale_micro_batches,
        **search.adaptive,
    )


def decisions_of(summary):
    """The decisions in a run's summary (or a diverged run's state)."""
    found = summary.get("adaptive_batch") or []
    return found["decisions"] if isinstance(found, dict) else found


def examples_to(step, start_batch, decisions):
    """E(step) of the module docstring: the examples of updates 1 .. `step`
    when the batch is `start_batch` until the first of `decisions` ({"step",
    "batch_size"}, in order) and each decision's batch after it."""
    steps = [0, *(d["step"] for d in decisions), math.inf]
    batches = [start_batch, *(d["batch_size"] for d in decisions)]
    return sum(b * max(0, min(step, steps[i + 1]) - steps[i]) for i, b in enumerate(batches))


def batch_at(step, start_batch, decisions):
    """The batch of update `step` (the last decision before it, else the start)."""
    return next((d["batch_size"] for d in reversed(decisions) if d["step"] < step), start_batch)


def steps_done(state):
    """The updates a diverged run made before it stopped (at least 1)."""
    marks = [h.get("steps", 0) for h in state.get("history", [])]
    marks += [e["step"] for e in state.get("evaluations", [])] + [1]
    return max(marks)


def trial_fields(t, steps, summary):
    """The arm's own fields of Trial `t`'s row, with its `steps` (to the
    target, or run) and its summary."""
    decisions = decisions_of(summary)
    return {
        "examples": examples_to(steps, t.batch_size, decisions),
        "budget_steps": None,
        "budget_epochs": t.config.train_epochs,
        "batch_at_target": batch_at(steps, t.batch_size, decisions),
        "decisions": len(decisions),
    }


def same_steps(steps, s_min, e_min):
    """(B_f, E_f): the fixed batch that takes `steps` by the fit S(B) =
    S_min + E_min / B, and its examples (module docstring); (None, None)
    where `steps` <= S_min (fewer steps than any fixed batch) or E_min is 0."""
    if steps <= s_min or e_min <= 0:
        return None, None
    batch = e_min / (steps - s_min)
    return batch, steps * batch


# --- the fixed study to compare with ---------------------------------------------------------
def checked_compare(study, num_train):
    """read_compare's, once --adaptive_batch_max is known to fit the
    `num_train` training examples (a ConfigError naming it otherwise)."""
    high = study.search.adaptive["adaptive_batch_max"]
    if high > num_train:
        raise ConfigError(
            f"--adaptive_batch_max={high} exceeds the {num_train} training examples: an epoch "
            "would have no step."
        )
    return read_compare(study)


def read_compare(study):
    """{optimizer: {"s_min", "e_min", "b_crit", "rows"}} of --compare_study
    (None without it): its fit.json's fit of each of the study's optimizers
    and its steps_to_target.json rows where every seed reached the target,
    read as untrusted; a ConfigError naming the flag and the file otherwise,
    or where its target or evaluation split is not the study's."""
    directory = study.search.compare_study
    if not directory:
        return None
    flag = f"--compare_study={directory}"
    path = os.path.join(directory, "fit.json")
    try:
        document = untrusted_json.read_json(path)
        fits, header = (
            document.get(k) if isinstance(document, dict) else None for k in ("fits", "study")
        )
        if not isinstance(fits, dict) or not isinstance(header, dict):
            raise untrusted_json.UntrustedFileError(
                "not a steps-to-target study's fit (no study and fits)"
            )
        _check_same_goal(study, header)
        table = os.path.join(directory, "steps_to_target.json")
        rows = untrusted_json.read_json(table).get("rows", []) if os.path.exists(table) else []
        found = {}
        for optimizer in study.optimizers:
            fit = fits.get(optimizer)
            if not isinstance(fit, dict):
                raise untrusted_json.UntrustedFileError(
                    f"fits.{optimizer} is null: fewer than 3 batches where every seed reached "
                    "the target"
                    if optimizer in fits
                    else f"fits has no {optimizer}"
                )
            where = f"fits.{optimizer}."
            s_min = untrusted_json.number(fit, "s_min", positive=False, where=where)
            e_min = untrusted_json.number(fit, "e_min", positive=False, where=where)
            found[optimizer] = {
                "s_min": s_min,
                "e_min": e_min,
                "b_crit": e_min / s_min if s_min else math.inf,
                "rows": _measured(rows, optimizer),
            }
    except untrusted_json.UntrustedFileError as error:
        raise ConfigError(f"{flag}: {path}: {error}.") from None
    except AttributeError:  # a steps_to_target.json that is not an object
        raise ConfigError(f"{flag}: its steps_to_target.json is not a study's table.") from None
    return found


def _check_same_goal(study, header):
    """UntrustedFileError where the fixed study's target or split is not `study`'s."""
    shared = study.shared
    for name in ("target_accuracy", "validation_examples", "validation_seed", "dataset", "model"):
        if header.get(name) != getattr(shared, name):
            raise untrusted_json.UntrustedFileError(
                f"study.{name} is {header.get(name)!r}, not this study's --{name}="
                f"{getattr(shared, name)} (the same target on the same evaluation split)"
            )


def _measured(rows, optimizer):
    """The fixed study's rows of `optimizer` where every seed reached the
    target: [{"batch_size", "steps", "examples", "seconds"}], by batch."""
    found = []
    for i, r in enumerate(rows if isinstance(rows, list) else []):
        if not isinstance(r, dict) or r.get("optimizer") != optimizer:
            continue
        if not r.get("seeds") or r.get("seeds_reached") != r.get("seeds"):
            continue
        where = f"steps_to_target.json rows[{i}]."
        found.append(
            {
                "batch_size": untrusted_json.integer(r, "batch_size", where=where),
                "steps": untrusted_json.number(r, "steps_mean", where=where),
                "examples": untrusted_json.number(r, "examples_mean", where=where),
                "seconds": untrusted_json.number(r, "seconds_mean", positive=False, where=where),
            }
        )
    return sorted(found, key=lambda r: r["batch_size"])


def comparison(summary, compare):
    """COMPARISON_FIELDS rows: per optimizer and start batch of the arm's
    table (quasi_table), its seeds' steps, examples and seconds beside the
    fixed fit's batch of the same steps (`same_steps`) and the measured fixed
    rows nearest in steps and with the fewest steps."""
    found = []
    for r in summary:
        fixed = compare[r["optimizer"]]
        steps = seed_mean(r)
        batch, examples = (
            same_steps(steps, fixed["s_min"], fixed["e_min"]) if steps else (None,) * 2
        )
        if steps is None:
            verdict = "not reached by every seed"
        elif batch is None:
            verdict = FEWER if steps <= fixed["s_min"] else "more steps than every fixed batch"
        else:
            more = "no more" if r["examples_mean"] <= examples else "more"
            verdict = f"{more} examples than the fixed batch of its steps"
        measured = fixed["rows"]
        nearest = (
            min(measured, key=lambda m: abs(math.log(m["steps"] / steps)))
            if steps and measured
            else {}
        )
        fewest = min(measured, key=lambda m: m["steps"]) if measured else {}
        found.append(
            {
                "optimizer": r["optimizer"],
                "start_batch": r["batch_size"],
                "seeds": r["seeds"],
                "seeds_reached": r["seeds_reached"],
                "steps_adaptive": steps,
                "examples_adaptive": r["examples_mean"] if steps else None,
                "seconds_adaptive": r["seconds_mean"] if steps else None,
                "steps_shallue": r["steps_shallue"],
                "s_min": fixed["s_min"],
                "e_min": fixed["e_min"],
                "b_crit": fixed["b_crit"],
                "fixed_batch_same_steps": batch,
                "fixed_examples_same_steps": examples,
                "verdict": verdict,
                **{f"nearest_fixed_{k}": nearest.get(k) for k in ("steps", "examples", "seconds")},
                "nearest_fixed_batch": nearest.get("batch_size"),
                "fewest_fixed_batch": fewest.get("batch_size"),
                "fewest_fixed_steps": fewest.get("steps"),
                "fewest_fixed_examples": fewest.get("examples"),
            }
        )
    return found


# --- the arm's outputs ------------------------------------------------------------------------
def write_adaptive_outputs(study, trials, records, num_train, compare=None):
    """trials.*, steps_to_target.* (the fixed arm's table: best trial per
    optimizer and start batch, the seeds at its settings), comparison.*
    (with --compare_study: `compare`, read_compare's) and adaptive_batch.png
    in the study dir, from the records of `trials`."""
    rows = trial_rows(trials, records)
    if not rows:
        return
    header = study_header(study, trials[0].config, num_train)
    directory = study.study_dir
    rows = [{k: r.get(k) for k in TRIAL_FIELDS} for r in rows]
    write_table(os.path.join(directory, "trials"), TRIAL_FIELDS, rows, header)
    summary = quasi_table(rows)
    write_table(os.path.join(directory, "steps_to_target"), QUASI_TABLE_FIELDS, summary, header)
    if compare:
        found = comparison(summary, compare)
        write_table(os.path.join(directory, "comparison"), COMPARISON_FIELDS, found, header)
    chosen = [
        t
        for t in trials
        if t.key in records
        for r in summary
        if (t.optimizer, t.batch_size, t.rate_step)
        == (r["optimizer"], r["batch_size"], r["best_trial"])
    ]
    config = trials[0].config
    title = (
        f"{config.model} on {config.dataset}: --adaptive_batch={config.adaptive_batch} to "
        f"accuracy {config.target_accuracy}, the best of {study.search.trials} trials and its seeds"
    )
    plot(chosen, records, os.path.join(directory, "adaptive_batch.png"), title)


def plot(trials, records, path, title):
    """The batch (a step line) and the decisions' B_simple (dots, dashed)
    against the steps, log batch axis, one colour per optimizer; seed 0
    drawn thicker, each run's last step marked (a circle: the target, an x:
    a miss). Returns the figure, drawn and written to `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    axes.set_yscale("log", base=2)
    colours = {o: f"C{i}" for i, o in enumerate(dict.fromkeys(t.optimizer for t in trials))}
    for t in trials:
        record, colour = records[t.key], colours[t.optimizer]
        decisions, row = record.get("adaptive_batch", []), record["row"]
        steps = [0, *(d["step"] for d in decisions), row["steps"]]
        batches = [t.batch_size, *(d["batch_size"] for d in decisions)]
        width = 2 if t.seed == 0 else 0.8
        label = (
            f"{TITLES.get(t.optimizer, t.optimizer)} from {t.batch_size}" if t.seed == 0 else None
        )
        axes.step(steps, [*batches, batches[-1]], where="post", color=colour, lw=width, label=label)
        scales = [(d["step"], d["noise_scale"]) for d in decisions if d["noise_scale"] > 0]
        if scales:
            axes.plot(*np.array(scales).T, "o--", color=colour, lw=width / 2, markersize=3)
        axes.plot(row["steps"], batches[-1], "o" if row["reached"] else "x", color=colour)
    axes.set_xlabel("steps")
    axes.set_ylabel("global batch; B_simple")
    axes.grid(True, which="both", alpha=0.3)
    if trials:
        axes.legend(title="solid: batch (seed 0 thick); dots: B_simple", fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    with storage.atomic_file(path, "wb") as f:
        figure.savefig(f, format="png")
    return figure
