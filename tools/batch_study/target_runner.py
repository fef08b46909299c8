"""Running a steps-to-target study (target_search.py): batch by batch, each
optimizer's rate search, then the extra seeds; every trial the store lacks is
trained with the training tool and appended to trials.jsonl, and the results
are rewritten after it, from the trials run so far and those of the plan the
store held when the run began (walk). Batch-major order keeps the optimizers
side by side when a study is stopped part way."""

import contextlib
import dataclasses
import functools
import gc
import json
import math
import os
import shutil
import time

import keras

from keras_lars.tools import input_pipeline
from keras_lars.tools import storage
from keras_lars.tools import train
from keras_lars.tools.batch_study import adaptive_arm
from keras_lars.tools.batch_study.cell_store import append_record
from keras_lars.tools.batch_study.cell_store import load_store
from keras_lars.tools.batch_study.cells import resolve_batch_sizes
from keras_lars.tools.batch_study.noise_along import measure_along
from keras_lars.tools.batch_study.quasi_results import write_quasi_outputs
from keras_lars.tools.batch_study.quasi_search import best_trial
from keras_lars.tools.batch_study.quasi_search import check_space
from keras_lars.tools.batch_study.quasi_search import quasi_trial
from keras_lars.tools.batch_study.runner import train_logged
from keras_lars.tools.batch_study.target_results import GRID_FIELDS
from keras_lars.tools.batch_study.target_results import TRIAL_FIELDS
from keras_lars.tools.batch_study.target_results import trial_rows
from keras_lars.tools.batch_study.target_results import write_target_outputs
from keras_lars.tools.batch_study.target_search import best_step
from keras_lars.tools.batch_study.target_search import budget_steps
from keras_lars.tools.batch_study.target_search import budget_warning
from keras_lars.tools.batch_study.target_search import next_step
from keras_lars.tools.batch_study.target_search import noise_scale_run
from keras_lars.tools.batch_study.target_search import rule_rate
from keras_lars.tools.batch_study.target_search import seed_batches
from keras_lars.tools.batch_study.target_search import seed_candidates
from keras_lars.tools.batch_study.target_search import seeded_point
from keras_lars.tools.batch_study.target_search import trial
from keras_lars.tools.batch_study.target_search import untuned_batches
from keras_lars.tools.model_dir_names import CHECKPOINTS
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.study_files import TRIALS_FILE
from keras_lars.tools.train.loop import Diverged


def trial_row(t, summary, wall):
    """The store's row of Trial `t` from its run's summary."""
    found = summary["target"]
    evaluations = summary["evaluations"]
    collapsed = found.get("collapsed")  # the tool's --collapse_patience ended it there
    if found["reached"]:
        seconds = found["seconds"]
    elif collapsed:
        seconds = collapsed["seconds"]
    else:
        seconds = sum(h["seconds"] for h in summary["history"])
    stopped = {"collapsed_step": collapsed["step"]} if collapsed else {}
    noise = {}
    if t.config.noise_scale:  # at the target, or at the last evaluation (none: NaN)
        at = found if found["reached"] else (evaluations or [None])[-1]
        noise = {
            "noise_scale": at["noise_scale"] if at else math.nan,  # diverged before one
            "noise_scale_step": at["step"] if at else None,
        }
    row = {
        "optimizer": t.optimizer,
        "batch_size": t.batch_size,
        "seed": t.seed,
        "rate_step": t.rate_step,
        "budget_step": t.budget_step,
        "peak_learning_rate": t.config.peak_learning_rate,
        "reached": found["reached"],
        "steps": found["step"] if found["reached"] else found["steps"],
        "examples": found["examples"],
        "seconds": round(seconds, 3),
        "best_val_accuracy": max((e["val_accuracy"] for e in evaluations), default=0.0),
        "budget_steps": t.config.train_steps,
        "eval_every_steps": t.config.eval_every_steps,
        "wall_seconds": round(wall, 2),
        "key": t.key,
        **noise,
        **stopped,
        **{k: found[k] for k in ("test_accuracy",) if k in found},  # --validation_examples
    }
    if t.config.adaptive_batch != "off":  # the examples of its batches, its budget in epochs
        return row | adaptive_arm.trial_fields(t, row["steps"], summary)
    return row


def diverged_summary(t, error):
    """The summary of Trial `t` that stopped at a non-finite loss (the
    tool's Diverged `error`): not reached, with what it trained before."""
    state = error.state
    steps = t.config.train_steps or adaptive_arm.steps_done(state)  # adaptive: its epochs'
    target = {"reached": False, "steps": steps, "examples": steps * t.batch_size}
    return {"history": [], **state, "target": target, "evaluations": state.get("evaluations", [])}


def run_trial(t):
    """Trains Trial `t` (or resumes it); its store record. Its checkpoints
    are removed once it is stored; its summary and log stay. A trial that
    diverges is not reached (its train.log has the step)."""
    started = time.time()
    try:
        summary = train_logged(t.config, "it was stored")
    except Diverged as error:
        print(f"  {t.name}: diverged: {error}", flush=True)
        summary = diverged_summary(t, error)
    row = trial_row(t, summary, time.time() - started)
    keras.backend.clear_session()
    gc.collect()
    shutil.rmtree(os.path.join(t.config.model_dir, CHECKPOINTS), ignore_errors=True)
    return {
        "key": t.key,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "config": dataclasses.asdict(t.config),
        "row": row,
        "evaluations": summary["evaluations"],
        **(
            {"adaptive_batch": adaptive_arm.decisions_of(summary)}
            if t.config.adaptive_batch != "off"
            else {}
        ),
    }


def seed_zero_search(study, trial_at, row_of):
    """Seed 0's search over the trials trial_at(k, budget_step=j) of one
    optimizer and batch (target_search's docstring): the chosen (k, j) and
    the rows of its trials, {(k, j): row}."""
    results = {}
    while (k := next_step(results, study.search.max_rate_steps)) is not None:
        results[k] = row_of(trial_at(k))
    k = best_step(results)
    budgets = {0: results[k]}  # the schedule's length at the chosen rate
    while (j := next_step(budgets, study.search.max_budget_doublings)) is not None:
        budgets[j] = row_of(trial_at(k, budget_step=j))
    rows = {(s, 0): row for s, row in results.items()}
    return k, best_step(budgets), rows | {(k, b): row for b, row in budgets.items()}


class NotStored(Exception):
    """A trial the store lacks, met by the walk over what it holds."""


def walk(study, batches, num_train, row_of, warn):
    """Walks the study's plan (target_search's docstring) in its order,
    calling row_of(Trial), which returns the trial's row or raises
    NotStored; `warn` gets the budget warnings and the lines of untuned
    batches not run. An optimizer whose search meets NotStored stops there
    (its later batches depend on that trial), and so do the seeds and the
    noise-scale run of a batch that meets it. An optimizer whose choice at a
    batch missed the target stops before an untuned batch after it."""
    untuned = untuned_batches(study, num_train)
    chosen = {}  # (optimizer, batch) -> (centre, k, j)
    searched = {}  # (optimizer, batch) -> {(k, j): seed 0's row}
    fewest = {}  # optimizer -> (batch, its fewest steps to the target so far)
    stopped = set()  # optimizers, and (optimizer, batch) of seeds, stopped (docstring)
    for i, batch in enumerate(batches):
        for optimizer in study.optimizers:
            if optimizer in stopped:
                continue
            centre = rule_rate(study, optimizer, batch)
            if i:  # the rate chosen at the batch before, scaled by the rule (untuned: not)
                before, k, j = chosen[(optimizer, batches[i - 1])]
                ratio = centre / rule_rate(study, optimizer, batches[i - 1])
                centre = before * study.search.rate_step**k * (1 if batch in untuned else ratio)
            if batch in untuned and not searched[(optimizer, batches[i - 1])][(k, j)]["reached"]:
                warn(
                    f"{optimizer} at batch {batch} (untuned): not run, as its choice at batch "
                    f"{batches[i - 1]} did not reach the target; it would train its whole "
                    "budget at a rate not known to reach it."
                )
                stopped.add(optimizer)
                continue
            budget = budget_steps(study.search, batch, num_train)
            warning = budget_warning(optimizer, batch, budget, fewest.get(optimizer))
            if warning:
                warn(warning)
            trial_at = functools.partial(  # trial_at(k, budget_step=j)
                trial, study, optimizer, batch, centre, seed=0, num_train=num_train
            )
            try:
                if batch in untuned:  # the batch before's choice, once
                    k, rows = 0, {(0, j): row_of(trial_at(0, budget_step=j))}
                else:
                    k, j, rows = seed_zero_search(study, trial_at, row_of)
            except NotStored:
                stopped.add(optimizer)
                continue
            chosen[(optimizer, batch)] = (centre, k, j)
            searched[(optimizer, batch)] = rows
            best = rows[(k, j)]
            if best["reached"] and best["steps"] < fewest.get(optimizer, (0, math.inf))[1]:
                fewest[optimizer] = (batch, best["steps"])
    for batch in seed_batches(study, batches, num_train):
        for optimizer in study.optimizers:
            if (optimizer, batch) not in searched:
                continue
            centre = chosen[(optimizer, batch)][0]
            search = searched[(optimizer, batch)]
            candidates, runs = seed_candidates(search), {}
            try:
                for k, j in candidates:  # on to the next point while a seed misses
                    seeds = [
                        trial(study, optimizer, batch, centre, k, seed, num_train, budget_step=j)
                        for seed in range(1, study.seeds)
                    ]
                    runs[(k, j)] = [search[(k, j)], *map(row_of, seeds)]
                    if all(r["reached"] for r in runs[(k, j)]):
                        break
            except NotStored:
                stopped.add((optimizer, batch))
                continue
            chosen[(optimizer, batch)] = (centre, *seeded_point(candidates, runs))
    batch, micro = noise_scale_run(study, num_train)
    for optimizer in study.optimizers if batch else ():
        if (optimizer, batch) in chosen and (optimizer, batch) not in stopped:
            centre, k, j = chosen[(optimizer, batch)]
            noise = trial(study, optimizer, batch, centre, k, 0, num_train, micro, budget_step=j)
            with contextlib.suppress(NotStored):
                row_of(noise)


def quasi_walk(study, batches, num_train, row_of, warn):
    """Walks a --search=quasi_random study's plan (quasi_search.py) as
    `walk` walks the grid's: batch by batch, each optimizer's --trials
    search trials, then at the batches of --seed_batch_sizes the seeds 1 ..
    --seeds at its best trial when that reached the goal. An optimizer whose
    search meets NotStored stops there; the seeds of a batch that meet it stop
    too."""
    stopped, best = set(), {}  # best: optimizer -> its best trial at this batch
    seeded = set(seed_batches(study, batches, num_train))
    trial_of = adaptive_arm.adaptive_trial if study.search.adaptive else quasi_trial
    for batch in batches:
        for optimizer in study.optimizers:
            if optimizer in stopped:
                continue
            try:
                rows = {
                    i: row_of(trial_of(study, optimizer, batch, i, 0, num_train))
                    for i in range(study.search.trials)
                }
            except NotStored:
                stopped.add(optimizer)
                continue
            best[optimizer] = best_trial(rows)
            if not rows[best[optimizer]]["reached"]:
                del best[optimizer]  # no settings known to reach the goal: no seeds
        for optimizer in study.optimizers if batch in seeded else ():
            if optimizer in stopped or optimizer not in best:
                continue
            with contextlib.suppress(NotStored):
                for seed in range(1, study.seeds + 1):
                    row_of(trial_of(study, optimizer, batch, best[optimizer], seed, num_train))


PROTOCOL_FILE = "protocol.json"


def check_protocol(study, path):
    """ConfigError naming the first setting in which the protocol of the
    store at `path` differs from the study's (Study.search.protocol; a
    store without PROTOCOL_FILE beside it is the grid's on the test split,
    the protocol before it existed), or one the store's protocol has and the
    study's lacks (the adaptive arm's, in a fixed-batch study). The store is
    left as it is. Returns the protocol to record beside a new store
    (record_protocol), None where one is recorded."""
    wanted = study.search.protocol(study.shared)
    recorded = os.path.join(os.path.dirname(path), PROTOCOL_FILE)
    if os.path.exists(recorded):
        with open(recorded) as f:
            found = json.load(f)
    elif os.path.exists(path) and os.path.getsize(path):
        found = {"search": "grid", "validation_examples": 0, "validation_seed": 0}
    else:
        return wanted

    def shown(v):
        return ",".join(map(str, v)) if isinstance(v, list) else v

    for name in [*wanted, *(n for n in found if n not in wanted)]:
        if found.get(name) != wanted.get(name):
            value = shown(wanted[name]) if name in wanted else "not set"
            stored = shown(found[name]) if name in found else "not set"
            raise ConfigError(
                f"--{name}={value}: the store {path} was made under another protocol "
                f"(--{name}={stored}); give another --study_dir (the store is left as it is)."
            )
    return None


def record_protocol(path, protocol):
    """Writes `protocol` (check_protocol's) beside the store at `path`."""
    if protocol is not None:
        with storage.atomic_file(os.path.join(os.path.dirname(path), PROTOCOL_FILE)) as f:
            json.dump(protocol, f, indent=1)


def run_target_study(study):
    """Runs the trials of the steps-to-target `study` that the store lacks;
    returns (rows of the study's trials, keys of those trained by this
    call). SIGTERM, SIGHUP or SIGINT stop it as they stop the training tool."""
    preemption = train.Preemption()
    action = "stopping the study at its running trial's next step boundary"
    with preemption.handling(action=action):
        return _run(study, preemption)


def _run(study, preemption):
    data = input_pipeline.load(study.shared)
    num_train = data.info.num_train
    batches = resolve_batch_sizes(study, num_train)
    quasi, adaptive = study.search.search == "quasi_random", bool(study.search.adaptive)
    if quasi:
        check_space(study, batches)
    compare = adaptive_arm.checked_compare(study, num_train) if adaptive else None
    os.makedirs(study.study_dir, exist_ok=True)
    path = os.path.join(study.study_dir, TRIALS_FILE)
    fields = [f for f in TRIAL_FIELDS if f not in GRID_FIELDS]
    if adaptive:  # its budget is in epochs
        fields = [f if f != "budget_steps" else "budget_epochs" for f in fields]
    protocol = check_protocol(study, path)  # another protocol's store: refused before it is read
    records = load_store(path, fields)
    record_protocol(path, protocol)  # after the store is known usable: nothing written before
    walk_plan = quasi_walk if quasi else walk
    write_outputs = write_quasi_outputs if quasi else write_target_outputs
    if adaptive:
        write_outputs = functools.partial(adaptive_arm.write_adaptive_outputs, compare=compare)
    stored = []  # the trials of this plan the store holds, up to the first it lacks

    def stored_row(t):
        if t.key not in records:
            raise NotStored(t.key)
        stored.append(t)
        (row,) = trial_rows([t], records)
        return row

    walk_plan(study, batches, num_train, stored_row, warn=lambda line: None)
    seen, trained = [], []

    def row_of(t):
        where = f"[{len(seen) + 1}] {t.label}"
        if t.key in records:
            print(f"{where}: done before ({t.name})", flush=True)
        else:
            if preemption.signal:
                raise train.Preempted(
                    f"stopped by {preemption.signal} before trial {where}; run the same "
                    "command to go on"
                )
            budget = t.config.train_steps or f"{t.config.train_epochs} epochs of"
            print(f"{where}: up to {budget} steps ...", flush=True)
            try:
                record = run_trial(t)
            except train.Preempted as error:
                raise train.Preempted(f"trial {where} ({t.name}) {error}") from None
            append_record(path, record)
            records[t.key] = record
            trained.append(t.key)
            row = record["row"]
            result = f"reached at step {row['steps']}" if row["reached"] else "not reached"
            if "collapsed_step" in row:
                result += f" (collapsed to chance: stopped at step {row['collapsed_step']})"
            print(
                f"{where}: {result}, best accuracy {row['best_val_accuracy']:.4f} "
                f"({row['wall_seconds']:.0f} s in this process)",
                flush=True,
            )
        seen.append(t)
        if trained and trained[-1] == t.key:  # with what the store held, for whole tables
            keys = {s.key for s in stored}
            so_far = stored + [s for s in seen if s.key not in keys]
            write_outputs(study, so_far, records, num_train)
        (row,) = trial_rows([t], records)
        return row

    walk_plan(study, batches, num_train, row_of, warn=lambda line: print(line, flush=True))
    write_outputs(study, seen, records, num_train)
    if quasi and study.search.noise_batch_sizes:
        measure_along(study, seen, records, num_train, data)
    print(
        f"study: {len(trained)} trial(s) trained, {len(seen) - len(trained)} found done; "
        f"tables and plot in {study.study_dir}",
        flush=True,
    )
    return trial_rows(seen, records), trained
