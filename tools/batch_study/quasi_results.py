"""The results of a --search=quasi_random study (quasi_search.py), rewritten
after every trial: the trials, one row per optimizer and batch with Shallue's
statistic beside the seeds' mean at the best trial's settings, the fit of
McCandlish et al. (target_results.fit) to each, the ranking with half the
trials, and the robustness of S_min and B_crit to the target.

Robustness: trials stop at the goal, so every lower target's first
evaluation is in their evaluations; at each target of --robustness_targets
and the goal, the fewest steps to it over a batch's search trials (Shallue's
statistic at that target) are fitted per optimizer.
"""

import json
import os

import numpy as np

from keras_lars.tools import storage
from keras_lars.tools.batch_study.quasi_search import best_trial
from keras_lars.tools.batch_study.quasi_search import shallue_steps
from keras_lars.tools.batch_study.results import write_table
from keras_lars.tools.batch_study.target_results import TITLES
from keras_lars.tools.batch_study.target_results import TRIAL_FIELDS
from keras_lars.tools.batch_study.target_results import fit
from keras_lars.tools.batch_study.target_results import plot
from keras_lars.tools.batch_study.target_results import study_header
from keras_lars.tools.batch_study.target_results import trial_rows

QUASI_TRIAL_FIELDS = (*TRIAL_FIELDS, "trial", "momentum", "warmup_fraction", "test_accuracy")
QUASI_TABLE_FIELDS = (
    "optimizer",
    "batch_size",
    "trials",
    "trials_reached",
    "best_trial",
    "chosen_rate",
    "momentum",
    "warmup_fraction",
    "budget_steps",
    "steps_shallue",
    "steps_shallue_half",
    "seeds",
    "seeds_reached",
    "steps_mean",
    "steps_min",
    "steps_max",
    "examples_mean",
    "seconds_mean",
    "test_accuracy",
    "eval_every_steps",
    "eval_fraction_of_steps",
)
ROBUSTNESS_FIELDS = ("target_accuracy", "optimizer", "batches", "s_min", "e_min", "b_crit")


def quasi_table(rows):
    """One row per (optimizer, batch) of the trial rows (QUASI_TABLE_FIELDS):
    the best search trial (seed 0) and its settings, Shallue's statistic over
    all trials and over the first half, and the seeds at the best trial's
    settings (1 .. --seeds; means over those that reached the goal)."""
    found = []
    for optimizer, batch in dict.fromkeys((r["optimizer"], r["batch_size"]) for r in rows):
        mine = [r for r in rows if (r["optimizer"], r["batch_size"]) == (optimizer, batch)]
        search = {r["trial"]: r for r in mine if r["seed"] == 0}
        if not search:
            continue
        best = search[best_trial(search)]
        half = [search[i] for i in sorted(search)[: max(1, len(search) // 2)]]
        seeds = [r for r in mine if r["seed"] and r["trial"] == best["trial"]]
        reached = [r for r in seeds if r["reached"]]
        shallue = shallue_steps(search.values())

        def mean(name, reached=reached):
            return float(np.mean([r[name] for r in reached])) if reached else None

        found.append(
            {
                "optimizer": optimizer,
                "batch_size": batch,
                "trials": len(search),
                "trials_reached": sum(r["reached"] for r in search.values()),
                "best_trial": best["trial"],
                "chosen_rate": best["peak_learning_rate"],
                "momentum": best["momentum"],
                "warmup_fraction": best["warmup_fraction"],
                "budget_steps": best["budget_steps"],
                "steps_shallue": shallue,
                "steps_shallue_half": shallue_steps(half),
                "seeds": len(seeds),
                "seeds_reached": len(reached),
                "steps_mean": mean("steps"),
                "steps_min": min((r["steps"] for r in reached), default=None),
                "steps_max": max((r["steps"] for r in reached), default=None),
                "examples_mean": mean("examples"),
                "seconds_mean": mean("seconds"),
                "test_accuracy": best.get("test_accuracy") if best["reached"] else None,
                "eval_every_steps": best["eval_every_steps"],
                "eval_fraction_of_steps": (
                    best["eval_every_steps"] / shallue if shallue is not None else None
                ),
            }
        )
    return sorted(found, key=lambda r: (r["optimizer"], r["batch_size"]))


def _fit_rows(summary, steps):
    """target_results.fit's rows of one optimizer with `steps` (a row ->
    steps or None) as the measure."""
    return [
        {
            "batch_size": r["batch_size"],
            "steps_mean": steps(r),
            "seeds": 1,
            "seeds_reached": int(steps(r) is not None),
            "tuned": True,
        }
        for r in summary
    ]


def seed_mean(r):
    """The seeds' mean steps at the best settings when every seed reached the goal."""
    return r["steps_mean"] if r["seeds"] and r["seeds_reached"] == r["seeds"] else None


def fits(summary, steps):
    """{optimizer: fit or None} with `steps` as the measure."""
    optimizers = dict.fromkeys(r["optimizer"] for r in summary)
    return {
        o: fit(_fit_rows([r for r in summary if r["optimizer"] == o], steps)) for o in optimizers
    }


def rankings(summary):
    """Per batch, the optimizers ordered by Shallue's statistic with all the
    trials and with the first half (a miss last): [{"batch_size", "all",
    "half", "same"}]. Where they differ, the result needs more than half the trials."""
    found = []
    for batch in sorted({r["batch_size"] for r in summary}):
        mine = [r for r in summary if r["batch_size"] == batch]

        def order(name, mine=mine):
            ranked = sorted(mine, key=lambda r: (r[name] is None, r[name] or 0, r["optimizer"]))
            return [r["optimizer"] for r in ranked]

        every, half = order("steps_shallue"), order("steps_shallue_half")
        found.append({"batch_size": batch, "all": every, "half": half, "same": every == half})
    return found


def steps_to(evaluations, target):
    """The step of the first of `evaluations` at `target` or above, or None."""
    return next((e["step"] for e in evaluations if e["val_accuracy"] >= target), None)


def robustness(trials, records, targets):
    """ROBUSTNESS_FIELDS rows: at each of `targets`, per optimizer, the fit
    to the fewest steps to it over each batch's search trials (module docstring)."""
    search = [t for t in trials if t.seed == 0 and t.key in records]
    found = []
    for target in targets:
        best = {}  # (optimizer, batch) -> fewest steps to target, or None
        for t in search:
            steps = steps_to(records[t.key].get("evaluations", []), target)
            now = best.get((t.optimizer, t.batch_size))
            best[(t.optimizer, t.batch_size)] = min(
                (s for s in (steps, now) if s is not None), default=None
            )
        for optimizer in dict.fromkeys(o for o, _ in best):
            rows = [
                {"optimizer": o, "batch_size": b, "steps_shallue": s}
                for (o, b), s in sorted(best.items())
                if o == optimizer
            ]
            fitted = fit(_fit_rows(rows, lambda r: r["steps_shallue"]))
            found.append(
                {
                    "target_accuracy": target,
                    "optimizer": optimizer,
                    **(fitted or {"batches": [], "s_min": None, "e_min": None, "b_crit": None}),
                }
            )
    return found


def robustness_markdown(rows):
    """The robustness rows as a Markdown table: S_min and B_crit per target
    (a row) and optimizer (two columns)."""
    optimizers = list(dict.fromkeys(r["optimizer"] for r in rows))
    head = " | ".join(f"{TITLES.get(o, o)} S_min | {TITLES.get(o, o)} B_crit" for o in optimizers)
    lines = [f"| target | {head} |", "|---|" + "---|---|" * len(optimizers)]
    for target in sorted({r["target_accuracy"] for r in rows}):
        cells = []
        for o in optimizers:
            r = next((r for r in rows if (r["target_accuracy"], r["optimizer"]) == (target, o)), {})
            if r.get("s_min") is None:
                cells += ["", ""]
            else:
                b_crit = "∞" if r["b_crit"] == float("inf") else f"{r['b_crit']:,.0f}"
                cells += [f"{r['s_min']:,.0f}", b_crit]
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_quasi_outputs(study, trials, records, num_train):
    """trials.*, steps_to_target.*, robustness.*, fit.json and
    steps_to_target.png in the study dir, from the records of `trials`."""
    rows = trial_rows(trials, records)
    if not rows:
        return
    header = study_header(study, trials[0].config, num_train)
    rows = [{k: r.get(k) for k in QUASI_TRIAL_FIELDS} for r in rows]
    directory = study.study_dir
    write_table(os.path.join(directory, "trials"), QUASI_TRIAL_FIELDS, rows, header)
    summary = quasi_table(rows)
    write_table(os.path.join(directory, "steps_to_target"), QUASI_TABLE_FIELDS, summary, header)
    goal = trials[0].config.target_accuracy
    targets = (*study.search.robustness_targets, goal)
    robust = robustness(trials, records, targets)
    write_table(os.path.join(directory, "robustness"), ROBUSTNESS_FIELDS, robust, header)
    seeded, shallue = fits(summary, seed_mean), fits(summary, lambda r: r["steps_shallue"])
    found = dict(header, fits=seeded, fits_shallue=shallue, rankings=rankings(summary))
    with storage.atomic_file(os.path.join(directory, "fit.json")) as f:
        json.dump(found, f, indent=1)
    shown = []  # the seeds' mean, or Shallue's statistic where no seed ran
    for r in summary:
        if not r["seeds"]:
            steps = r["steps_shallue"]
            r = dict(r, steps_mean=steps, steps_min=steps, steps_max=steps)
        shown.append(dict(r, tuned=True))
    config = trials[0].config
    split = "validation" if config.validation_examples else "test"
    title = (
        f"{config.model} on {config.dataset} ({num_train} training images): steps to {split} "
        f"accuracy {goal}, {study.search.trials} quasi-random trials per optimizer and batch"
    )
    plot(shown, seeded, {}, os.path.join(directory, "steps_to_target.png"), title)
