"""The steps-to-target mode's results: the trials, the table of steps to the
target per optimizer and batch, the fit of McCandlish et al. (2018) and the
log-log plot, rewritten after every trial.

The fit: steps S and examples E = B * S to a target trade off as

    (S / S_min - 1) (E / E_min - 1) = 1,  i.e.  S(B) = S_min + E_min / B,

with B_crit = E_min / S_min the batch at which a run takes twice the fewest
steps and twice the fewest examples. S_min and E_min are fitted by weighted
least squares on the relative error, minimising sum_i ((S_i - S(B_i)) / S_i)^2
(each point's seed mean; a linear problem in (S_min, E_min)), over the batches
where every seed reached the target and the rate was tuned; with a negative
coefficient the other is fitted alone. Three batches or more make a fit.
"""

import json
import math
import os

import numpy as np

from keras_lars.tools import storage
from keras_lars.tools.batch_study.results import write_table
from keras_lars.tools.batch_study.target_search import seed_candidates
from keras_lars.tools.batch_study.target_search import seeded_point
from keras_lars.tools.batch_study.target_search import untuned_batches

TRIAL_FIELDS = (
    "optimizer",
    "batch_size",
    "seed",
    "rate_step",
    "budget_step",
    "peak_learning_rate",
    "reached",
    "steps",
    "examples",
    "seconds",
    "best_val_accuracy",
    "budget_steps",
    "eval_every_steps",
    "wall_seconds",
    "key",
)
TABLE_FIELDS = (
    "optimizer",
    "batch_size",
    "chosen_rate",
    "tuned",
    "search_trials",
    "points_seeded",
    "seeds",
    "seeds_reached",
    "steps_mean",
    "steps_min",
    "steps_max",
    "examples_mean",
    "seconds_mean",
    "budget_steps",
    "eval_every_steps",
)
GRID_FIELDS = ("rate_step", "budget_step")  # the plan's, not the store's: trial_rows
MIN_FIT_POINTS = 3


def table(rows, untuned=frozenset()):
    """One row per (optimizer, batch) of the trial rows: the rate and budget
    chosen (target_search.seeded_point: the seed-0 search's choice, or the
    next-best point where a seed missed there), whether it was searched (a
    batch in `untuned` takes the batch before's), the points the seeds ran at,
    and steps, examples and seconds to the target over the seeds run at the
    choice (means over the seeds that reached it; None when none).
    Steps to the target are those of the first evaluation that reached it,
    known to within the evaluation interval, eval_every_steps."""
    found = []
    rows = [r for r in rows if "noise_scale" not in r]  # the noise-scale runs: noise_scales()
    keys = dict.fromkeys((r["optimizer"], r["batch_size"]) for r in rows)
    for optimizer, batch in keys:
        mine = [r for r in rows if r["optimizer"] == optimizer and r["batch_size"] == batch]
        search = {(r["rate_step"], r["budget_step"]): r for r in mine if r["seed"] == 0}
        if not search:
            continue
        at = {}  # (k, j) -> every seed's row there
        for r in mine:
            at.setdefault((r["rate_step"], r["budget_step"]), []).append(r)
        candidates = seed_candidates(search)
        chosen = seeded_point(candidates, at)
        runs = at[chosen]
        reached = [r for r in runs if r["reached"]]

        def mean(name, reached=reached):
            return float(np.mean([r[name] for r in reached])) if reached else None

        found.append(
            {
                "optimizer": optimizer,
                "batch_size": batch,
                "chosen_rate": search[chosen]["peak_learning_rate"],
                "tuned": batch not in untuned,
                "search_trials": len(search),
                "points_seeded": sum(len(at.get(p, ())) > 1 for p in candidates),
                "seeds": len(runs),
                "seeds_reached": len(reached),
                "steps_mean": mean("steps"),
                "steps_min": min((r["steps"] for r in reached), default=None),
                "steps_max": max((r["steps"] for r in reached), default=None),
                "examples_mean": mean("examples"),
                "seconds_mean": mean("seconds"),
                "budget_steps": search[chosen]["budget_steps"],
                "eval_every_steps": search[chosen]["eval_every_steps"],
            }
        )
    return sorted(found, key=lambda r: (r["optimizer"], r["batch_size"]))


def noise_scales(rows):
    """{optimizer: {"batch_size", "noise_scale", "step", "reached"}} of the
    noise-scale runs among the trial rows: B_simple at the target (or at the
    last evaluation of a run that missed it)."""
    return {
        r["optimizer"]: {
            "batch_size": r["batch_size"],
            "noise_scale": r["noise_scale"] if math.isfinite(r["noise_scale"]) else None,
            "step": r["noise_scale_step"],
            "reached": r["reached"],
        }
        for r in rows
        if "noise_scale" in r
    }


def fit(rows):
    """{"s_min", "e_min", "b_crit", "batches"} fitted to the table rows of one
    optimizer (module docstring; its tuned batches), or None with fewer than
    MIN_FIT_POINTS."""
    points = [r for r in rows if r["tuned"] and r["seeds"] and r["seeds_reached"] == r["seeds"]]
    if len(points) < MIN_FIT_POINTS:
        return None
    batches = np.array([r["batch_size"] for r in points], dtype=float)
    steps = np.array([r["steps_mean"] for r in points], dtype=float)
    x, w = 1.0 / batches, 1.0 / steps
    (s_min, e_min), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), np.ones_like(w), rcond=None)
    if e_min < 0:  # S = S_min alone
        s_min, e_min = float(np.sum(w) / np.sum(w * w)), 0.0
    elif s_min < 0:  # S = E_min / B alone
        s_min, e_min = 0.0, float(np.sum(x * w) / np.sum((x * w) ** 2))
    b_crit = e_min / s_min if s_min > 0 else float("inf")
    return {
        "s_min": float(s_min),
        "e_min": float(e_min),
        "b_crit": float(b_crit),
        "batches": [int(b) for b in batches],
    }


def trial_rows(trials, records):
    """The store's rows of `trials` (those it holds), each with its Trial's
    grid steps k and j: a stored k counts from the centre of the plan that
    ran it, and a trial is found by key (its rate and budget), whatever its
    grid steps in this plan (a quasi-random trial's: its point and settings)."""
    return [
        dict(
            records[t.key]["row"],
            rate_step=t.rate_step,
            budget_step=t.budget_step,
            **t.settings_row,
        )
        for t in trials
        if t.key in records
    ]


def study_header(study, config, num_train):
    """The study's settings that its outputs start with (`config`: a trial's)."""
    search = study.search
    found = {
        "mode": "steps_to_target",
        "search": search.search,
        "target_accuracy": config.target_accuracy,
        "model": config.model,
        "dataset": config.dataset,
        "image_size": config.image_size,
        "train_examples": num_train,
        # the split of the goal and of every choice: training images held out (fixed by
        # their seed), or with none held out the test split
        "validation_examples": config.validation_examples,
        "validation_seed": config.validation_seed,
        "optimizers": list(study.optimizers),
        "rule_rates": {k: {"base": v[0], "lr_scaling": v[1]} for k, v in study.rates.items()},
        "budget_epochs": search.budget_epochs,
        "min_budget_steps": search.min_budget_steps,
    }
    if search.search == "grid":
        found.update(
            warmup_fraction=search.warmup_fraction,
            evaluations_per_epoch=search.evaluations_per_epoch,
            rate_step=search.rate_step,
            max_rate_steps=search.max_rate_steps,
            max_budget_doublings=search.max_budget_doublings,
            untuned_batch_sizes=sorted(untuned_batches(study, num_train)),
            momentum=config.momentum,
        )
    else:
        found.update(
            trials=search.trials,
            ranges={k: list(v) for k, v in search.ranges.items()},
            search_seed=search.search_seed,
            eval_fraction=search.eval_fraction,
            target_examples_floor=search.target_examples_floor or num_train,
            robustness_targets=list(search.robustness_targets),
            noise_batch_sizes=list(search.noise_batch_sizes),
            noise_fractions=list(search.noise_fractions),
        )
    if search.adaptive:  # the adaptive arm (adaptive_arm.py)
        found.update(
            adaptive=dict(search.adaptive, micro_batches=search.noise_scale_micro_batches),
            compare_study=search.compare_study,
        )
    found.update(weight_decay=config.weight_decay, end_learning_rate=config.end_learning_rate)
    return {"study": found}


def write_target_outputs(study, trials, records, num_train):
    """trials.{csv,json}, steps_to_target.{csv,json}, fit.json and
    steps_to_target.png in the study dir, from the records of `trials`."""
    rows = trial_rows(trials, records)
    if not rows:
        return
    untuned = untuned_batches(study, num_train)
    config = trials[0].config
    header = study_header(study, config, num_train)
    directory = study.study_dir
    write_table(os.path.join(directory, "trials"), TRIAL_FIELDS, rows, header)
    summary = table(rows, untuned)
    write_table(os.path.join(directory, "steps_to_target"), TABLE_FIELDS, summary, header)
    fits = {
        o: fit([r for r in summary if r["optimizer"] == o])
        for o in dict.fromkeys(r["optimizer"] for r in summary)
    }
    noise = noise_scales(rows)
    with storage.atomic_file(os.path.join(directory, "fit.json")) as f:
        json.dump(dict(header, fits=fits, noise_scales=noise), f, indent=1)
    split = "validation" if config.validation_examples else "test"
    title = (
        f"{config.model} on {config.dataset} ({num_train} training images): steps to "
        f"{split} accuracy {config.target_accuracy}, rate tuned per batch"
        + (f" but {', '.join(map(str, sorted(untuned)))}" if untuned else "")
    )
    plot(summary, fits, noise, os.path.join(directory, "steps_to_target.png"), title)


TITLES = {"sgd": "SGD", "nesterov": "Nesterov", "lars": "LARS", "lamb": "LAMB", "adam": "Adam"}
DASH = "\N{EN DASH}"  # of a range, in the Markdown tables


def _step_cell(r):
    """A table row's steps to the target: the seeds' mean [min-max] (the
    mean alone for one seed; "k of n seeds" when some missed, "not reached"
    when all did), then (peak rate, budget T; untuned)."""
    point = f"{r['chosen_rate']:.4g}, T {r['budget_steps']:,}" + ("" if r["tuned"] else "; untuned")
    if not r["seeds_reached"]:
        return f"not reached ({point})"
    steps = f"{r['steps_mean']:,.0f}"
    if r["seeds"] > 1:
        steps += f" [{r['steps_min']:,}{DASH}{r['steps_max']:,}]"
    if r["seeds_reached"] < r["seeds"]:
        steps += f", {r['seeds_reached']} of {r['seeds']} seeds"
    return f"{steps} ({point})"


def markdown_tables(optimizers, summary, fits, noise):
    """The study's results as two Markdown tables (the docs' study page), a
    column or row per optimizer in the order of `optimizers`: steps to the
    target per batch (_step_cell), and the fit (module docstring) with the
    batches it used, beside the measured noise scale B_simple."""
    cells = {(r["optimizer"], r["batch_size"]): r for r in summary}
    batches = sorted({r["batch_size"] for r in summary})
    title = [TITLES.get(o, o) for o in optimizers]
    lines = [
        "| batch | evaluation interval | " + " | ".join(title) + " |",
        "|---|---|" + "---|" * len(optimizers),
    ]
    for batch in batches:
        found = [cells.get((o, batch)) for o in optimizers]
        interval = next(r["eval_every_steps"] for r in found if r)
        row = [_step_cell(r) if r else "" for r in found]
        lines.append(f"| {batch:,} | {interval:,} | " + " | ".join(row) + " |")
    lines += [
        "",
        "| optimizer | batches fitted | S_min (steps) | E_min (examples) | B_crit = E_min / S_min "
        "| B_simple (at batch, step) |",
        "|---|---|---|---|---|---|",
    ]
    for optimizer, name in zip(optimizers, title):
        found, measured = fits.get(optimizer), noise.get(optimizer)
        if found:
            used = found["batches"]
            b_crit = "∞" if math.isinf(found["b_crit"]) else f"{found['b_crit']:,.0f}"
            fitted = [f"{min(used):,}{DASH}{max(used):,} ({len(used)})", f"{found['s_min']:,.0f}"]
            fitted += [f"{round(found['e_min'], -2):,.0f}", b_crit]
        else:
            fitted = [f"fewer than {MIN_FIT_POINTS}", "", "", ""]
        scale = ""
        if measured and measured["noise_scale"] is not None:
            scale = (
                f"{measured['noise_scale']:,.0f} ({measured['batch_size']:,}, {measured['step']:,})"
            )
            scale += "" if measured["reached"] else "; missed the target"
        lines.append(f"| {name} | " + " | ".join([*fitted, scale]) + " |")
    return "\n".join(lines) + "\n"


def at_least_a_factor(low, high, factor=4.0):
    """Log-axis limits spanning at least `factor`, around their geometric
    middle: a narrower span labels its minor ticks and can leave the
    layout no room (one batch, or equal steps everywhere)."""
    if high >= low * factor:
        return low, high
    middle = math.sqrt(low * high)
    return middle / math.sqrt(factor), middle * math.sqrt(factor)


def plot(summary, fits, noise, path, title):
    """Steps and examples to the target against the batch (log-log), one
    colour per optimizer: the seeds' mean with their range, a miss as an x at
    its budget, an untuned batch open, the perfect-scaling line through the
    smallest batch (dotted), the fit (dashed) and the measured noise scale (a
    vertical dash-dot line). Returns the figure, drawn and written to `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.6), dpi=100)
    FigureCanvasAgg(figure)
    steps_axes, examples_axes = figure.subplots(1, 2)
    for axes in (steps_axes, examples_axes):  # before the data: one point has no range
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
    optimizers = list(dict.fromkeys(r["optimizer"] for r in summary))
    for i, optimizer in enumerate(optimizers):
        colour = f"C{i}"
        mine = [r for r in summary if r["optimizer"] == optimizer]
        hit = [r for r in mine if r["steps_mean"] is not None]
        missed = [r for r in mine if r["steps_mean"] is None]
        batches = np.array([r["batch_size"] for r in hit], dtype=float)
        steps = np.array([r["steps_mean"] for r in hit], dtype=float)
        spread = np.array([[s - r["steps_min"], r["steps_max"] - s] for r, s in zip(hit, steps)])
        for axes, scale in ((steps_axes, 1.0), (examples_axes, batches)):
            if len(hit):
                axes.errorbar(
                    batches,
                    steps * scale,
                    yerr=spread.T * scale,
                    color=colour,
                    marker="o",
                    capsize=3,
                    label=optimizer,
                )
            for r in hit:  # an untuned batch: an open marker above the line's own
                if not r["tuned"]:
                    y = r["steps_mean"] * (r["batch_size"] if axes is examples_axes else 1)
                    axes.plot(
                        r["batch_size"], y, "o", color=colour, markerfacecolor="white", zorder=3
                    )
            for j, r in enumerate(missed):
                y = r["budget_steps"] * (r["batch_size"] if axes is examples_axes else 1)
                label = optimizer if not len(hit) and not j else None
                axes.plot(r["batch_size"], y, "x", color=colour, markersize=9, label=label)
        if len(hit):
            grid = np.geomspace(batches[0], max(r["batch_size"] for r in mine), 50)
            steps_axes.plot(grid, steps[0] * batches[0] / grid, ":", color=colour, alpha=0.6)
        found = fits.get(optimizer)
        if found:
            grid = np.geomspace(min(found["batches"]), max(found["batches"]), 50)
            curve = found["s_min"] + found["e_min"] / grid
            steps_axes.plot(grid, curve, "--", color=colour, alpha=0.8)
            examples_axes.plot(grid, curve * grid, "--", color=colour, alpha=0.8)
        if ((noise.get(optimizer) or {}).get("noise_scale") or 0) > 0:
            steps_axes.axvline(noise[optimizer]["noise_scale"], color=colour, ls="-.", lw=1)
    for axes, label in ((steps_axes, "steps to target"), (examples_axes, "examples to target")):
        axes.set_xlim(*at_least_a_factor(*axes.get_xlim()))
        axes.set_ylim(*at_least_a_factor(*axes.get_ylim()))
        axes.set_xlabel("global batch size")
        axes.set_ylabel(label)
        axes.grid(True, which="both", alpha=0.3)
    untuned = "open: rate not tuned; " if not all(r["tuned"] for r in summary) else ""
    steps_axes.legend(title=f"optimizer ({untuned}x: not reached)", fontsize=8)
    steps_axes.set_title(
        "dotted: perfect scaling; dashed: S_min + E_min / B; dash-dot: B_simple", fontsize=8
    )
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    with storage.atomic_file(path, "wb") as f:
        figure.savefig(f, format="png")
    return figure
