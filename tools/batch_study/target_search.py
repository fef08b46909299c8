"""The steps-to-target mode: per optimizer and batch size, a search over the
peak learning rate for the fewest steps to the tool's --target_accuracy, then
more seeds at the chosen rate (Shallue et al. 2019: metaparameters tuned
separately at every batch size; the fewest steps over the trials counts).

A trial is one run of the training tool (optimizer, batch B, peak rate,
budget, seed). Its budget at B, with N training examples, is

    T(B) * 2^j,  T(B) = max(--min_budget_steps, ceil(--budget_epochs * N / B)) steps,

and its schedule is fitted to that budget: linear warmup over
--warmup_fraction of it, then power-2 decay to --end_learning_rate at its
end (keras_lars.WarmupPolyDecay). It evaluates --evaluations_per_epoch times
an epoch (every max(1, floor(N / B / that)) steps) and stops at the first
evaluation that reaches the target, or runs out of budget: "not reached". It
stops early, also "not reached", at a non-finite loss, or after
COLLAPSE_PATIENCE evaluations in a row at chance once it had learnt (the
tool's --collapse_patience: the network collapsed and cannot recover).

The search (seed 0) first tries rates r_k = c * f^k for integers k, f =
--rate_step, at the budget T(B) (j = 0). The centre c of the smallest batch
is its optimizer's rule rate (--base_learning_rates scaled by --lr_scaling);
at each larger batch it is the rate chosen at the batch before, scaled by
the rule from that batch to this. It tries k = 0, -1, 1; while the best
trial so far (fewest steps to the target; of trials that missed it, the
highest accuracy) is at the largest or smallest k tried, it tries the next k
beyond, up to |k| = --max_rate_steps; while every trial so far missed the
target, also k = best - 2 and best + 2 (a miss's accuracy is a weak guide to
the rate that reaches the target). Then, at the best k, the same walk over
the budget's j (the schedule's length: a run decaying sooner may reach the
target in fewer steps), up to |j| = --max_budget_doublings. The best trial's
rate and budget are chosen. At --untuned_batch_sizes there is no search: seed
0 runs once at the rate and budget step j chosen at the batch before (the rate
not scaled by the rule), and that point is the batch's choice, untuned; when
that choice missed the target, the optimizer stops there (no rate is known to
reach it, and a miss costs the whole budget at the costliest batches). Seeds
1 .. --seeds - 1 then run at the choice, at
--seed_batch_sizes (default: every batch). Chosen on one seed, a point at the
edge of reach may be a lucky seed's (the winner's curse): when a seed there
misses the target, the seeds run at the search's next-best point that reached
it (fewest steps first), up to SEED_FALLBACKS more points, and the first point
whose seeds all reach it is the batch's choice. With --noise_scale_batch_size,
each optimizer then trains seed 0 at that batch and its choice once more,
in --noise_scale_micro_batches micro-batches, measuring the gradient noise
scale B_simple (McCandlish et al. 2018) up to the target: without batch
norm that run starts as the trial's own, to float rounding (which training
then amplifies).
"""

import dataclasses
import math

from keras_lars.tools import train
from keras_lars.tools.batch_study.cells import cell_key
from keras_lars.tools.batch_study.study import CellSettings
from keras_lars.tools.batch_study.study import batch_examples
from keras_lars.tools.settings import ConfigError

FIRST_STEPS = (0, -1, 1)
MISSED_REACH = 2  # while every trial missed: k = best - 2 and best + 2 too
SEED_FALLBACKS = 2  # further points the seeds may run at when one missed at the choice
COLLAPSE_PATIENCE = 10  # a trial's evaluations at chance, after learning, that end it


@dataclasses.dataclass(frozen=True)
class Trial:
    """One run of the search or of the seeds, as the training tool's Config."""

    optimizer: str
    batch_size: int
    rate_step: int  # k of r_k = c * f^k
    seed: int
    config: train.Config
    key: str
    budget_step: int = 0  # j of the budget T(B) * 2^j
    # --search=quasi_random: the trial's searched settings, (name, value) pairs (then
    # rate_step is its point i)
    searched: tuple = ()

    @property
    def quasi(self):
        return bool(self.searched)

    @property
    def name(self):
        if self.quasi:
            point = f"q{self.rate_step}-s{self.seed}"
            return f"{self.optimizer}-b{self.batch_size}-{point}-{self.key[:10]}"
        noise = "-noise" if self.config.noise_scale else ""
        budget = f"-t{self.budget_step}" if self.budget_step else ""
        return (
            f"{self.optimizer}-b{self.batch_size}-k{self.rate_step}{budget}-s{self.seed}{noise}-"
            f"{self.key[:10]}"
        )

    @property
    def settings_row(self):
        """The trial's searched settings beside its rate, for its row (quasi_random)."""
        return {"trial": self.rate_step, **dict(self.searched)} if self.quasi else {}

    @property
    def label(self):
        rate = self.config.peak_learning_rate
        if self.quasi:
            c = self.config
            return (
                f"{self.optimizer} batch={self.batch_size} trial={self.rate_step} rate={rate:.4g} "
                f"momentum={c.momentum:.4g} budget={c.train_steps or f'{c.train_epochs} epochs'} "
                f"seed={self.seed}"
            )
        noise = f" noise scale in {self.config.gradient_accumulation_steps} micro-batches"
        budget = f" budget={self.config.train_steps}" if self.budget_step else ""
        return (
            f"{self.optimizer} batch={self.batch_size} rate={rate:.4g}{budget} seed={self.seed}"
            + (noise if self.config.noise_scale else "")
        )


def budget_steps(search, batch_size, num_train, budget_step=0):
    """T(B) of the module docstring; with `budget_step` j, ceil(T(B) * 2^j)."""
    budget = max(search.min_budget_steps, math.ceil(search.budget_epochs * num_train / batch_size))
    return math.ceil(budget * 2.0**budget_step)


def trial(
    study, optimizer, batch_size, centre, rate_step, seed, num_train, micro_batches=0, budget_step=0
):
    """The Trial at rate centre * f^rate_step and budget T(B) * 2^budget_step
    (module docstring); with `micro_batches` >= 2, the same trial in that
    many micro-batches measuring the gradient noise scale (the tool's
    --noise_scale)."""
    search = study.search
    budget = budget_steps(search, batch_size, num_train, budget_step)
    epoch = num_train // batch_size  # steps in an epoch (the tool drops the rest)
    rate = centre * search.rate_step**rate_step
    config = trial_config(
        study,
        optimizer,
        batch_size,
        rate,
        seed,
        budget,
        warmup_epochs=search.warmup_fraction * budget / epoch,  # the tool rounds to a step
        eval_every_steps=max(1, epoch // search.evaluations_per_epoch),
    )
    if micro_batches:
        config = dataclasses.replace(
            config, gradient_accumulation_steps=micro_batches, noise_scale=True
        )
    return stopping_trial(study, optimizer, batch_size, rate_step, seed, config, budget_step)


def trial_config(study, optimizer, batch_size, rate, seed, budget, **settings):
    """The training Config of a trial: the shared settings, the trial's
    CellSettings and `settings` (its warmup, evaluations, ...)."""
    cell = CellSettings(
        optimizer,
        batch_size,
        rate,
        "none",  # the trial's rate is its peak rate
        seed,
        model_dir=study.study_dir,
        train_steps=budget,
        gradient_accumulation_steps=study.micro_batches(batch_size),
    )
    return dataclasses.replace(study.shared, **dataclasses.asdict(cell), **settings)


def stopping_trial(
    study, optimizer, batch_size, rate_step, seed, config, budget_step=0, searched=()
):
    """The Trial of `config`, keyed by it, that stops once its outcome is decided."""
    key = cell_key(config)
    # A trial stops at its first non-finite loss, or once it collapsed to
    # chance (COLLAPSE_PATIENCE): its weights can no longer reach the target,
    # so the outcome (not reached, its best accuracy before) is that of
    # training on to the budget, which the key keeps naming.
    config = dataclasses.replace(
        config,
        model_dir=f"{study.study_dir}/trials/{optimizer}-{key}",
        stop_on_divergence=True,
        collapse_patience=COLLAPSE_PATIENCE,
    )
    return Trial(optimizer, batch_size, rate_step, seed, config, key, budget_step, searched)


def budget_warning(optimizer, batch_size, budget, fewest):
    """A warning line when `budget` (steps at `batch_size`) is below the
    fewest steps to the target the optimizer took at a smaller batch
    (`fewest`: (batch, steps) or None), else None: tuned well, a larger batch
    needs no more steps (Shallue et al. 2019), so there a miss may be the
    budget's, not the batch's."""
    if fewest is None or budget >= fewest[1]:
        return None
    return (
        f"warning: {optimizer} at batch {batch_size}: its budget of {budget} steps is below "
        f"the {fewest[1]} steps it took at batch {fewest[0]}; a miss here may be the "
        "budget's: raise --min_budget_steps"
    )


def rule_rate(study, optimizer, batch_size):
    """The optimizer's rate at `batch_size` by its scaling rule."""
    base, rule = study.rates[optimizer]
    return train.scaled_learning_rate(base, batch_size, rule)


def score(row):
    """Orders trials, best first: reached before missed; then fewer steps to
    the target, or for a miss a higher best accuracy."""
    if row["reached"]:
        return (0, row["steps"])
    return (1, -row["best_val_accuracy"])


def best_step(results):
    """The k of the best of `results` ({k: row}); the smaller |k| on a tie."""
    return min(results, key=lambda k: (score(results[k]), abs(k), k))


def next_step(results, max_steps):
    """The next k to try given `results` ({k: row} of the trials run), or
    None when the search is done (module docstring)."""
    for k in FIRST_STEPS:
        if k not in results and abs(k) <= max_steps:
            return k
    best = best_step(results)
    if best == max(results) and best < max_steps:
        return best + 1
    if best == min(results) and best > -max_steps:
        return best - 1
    if not any(r["reached"] for r in results.values()):
        # Among misses the best accuracy is a weak guide: look two steps either side.
        for k in (best - MISSED_REACH, best + MISSED_REACH):
            if abs(k) <= max_steps and k not in results:
                return k
    return None


def chosen_point(rows):
    """The (k, j) the search chose among its trials ({(k, j): row}): the
    best k at j = 0, then the best j at that k (module docstring); an
    untuned batch's one trial."""
    if len(rows) == 1:
        return next(iter(rows))
    k = best_step({k: r for (k, j), r in rows.items() if j == 0})
    return k, best_step({j: r for (rate, j), r in rows.items() if rate == k})


def seed_candidates(search):
    """The points (k, j) the seeds may run at, in order, from the seed-0
    search ({(k, j): row}): its choice, then, when that reached the target,
    up to SEED_FALLBACKS of its other points that reached it, best first."""
    first = chosen_point(search)
    if not search[first]["reached"]:
        return [first]
    others = [p for p, r in search.items() if r["reached"] and p != first]
    others.sort(key=lambda p: (score(search[p]), abs(p[1]), abs(p[0]), p))
    return [first, *others[:SEED_FALLBACKS]]


def seeded_point(candidates, runs):
    """The batch's choice among `candidates` (seed_candidates) given `runs`
    ({(k, j): rows of every seed run there}): the first whose seeds all
    reached the target, among the first and those the seeds ran at after it;
    when none did, the one with the fewest misses, the earlier on a tie."""
    tried = [p for i, p in enumerate(candidates) if i == 0 or len(runs.get(p, ())) > 1]
    for point in tried:
        if all(r["reached"] for r in runs[point]):
            return point
    return min(tried, key=lambda p: (sum(not r["reached"] for r in runs[p]), tried.index(p)))


def untuned_batches(study, num_train):
    """The batch sizes (ints) trained without a search (--untuned_batch_sizes)."""
    return {batch_examples(b, num_train) for b in study.search.untuned_batch_sizes}


def seed_batches(study, batches, num_train):
    """The batch sizes (ints) that get the extra seeds."""
    chosen = study.search.seed_batch_sizes
    if not chosen:
        return list(batches)
    return sorted(batch_examples(b, num_train) for b in chosen)


def noise_scale_run(study, num_train):
    """(batch, micro-batches) of the noise-scale runs, or (None, 0); a
    ConfigError when the micro-batches do not divide the batch."""
    search = study.search
    if search.noise_scale_batch_size is None:
        return None, 0
    batch = batch_examples(search.noise_scale_batch_size, num_train)
    micro = search.noise_scale_micro_batches
    if batch % micro:
        raise ConfigError(
            f"--noise_scale_micro_batches={micro} does not divide the batch {batch} of "
            "--noise_scale_batch_size."
        )
    return batch, micro
