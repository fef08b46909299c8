"""The steps-to-target mode's quasi-random search (--search=quasi_random):
tuning as Shallue et al. (2019) and Nado et al. (2021) tune, the same budget
of trials for every optimizer at every batch.

At each optimizer and batch B, trial i (i = 0 .. --trials - 1) takes point
u_i in [0, 1)^4 of a scrambled Halton sequence (scipy.stats.qmc.Halton,
seeded by --search_seed; the same points everywhere, so the comparison is
matched) and maps it onto the search space (--*_range, low to high):

    peak rate     r = rule(B) * exp(lerp(log low, log high, u_i0))   (rule: the optimizer's
                  --base_learning_rates scaled by --lr_scaling to B)
    1 - momentum  exp(lerp(log low, log high, u_i1))   (LAMB: 1 - beta_1)
    warmup        lerp(low, high, u_i2) of the budget, linear
    budget        ceil(T(B) * exp(lerp(log low, log high, u_i3))) steps: the decay length
                  (power-2 decay to --end_learning_rate at its end)

with T(B) = max(--min_budget_steps, ceil(--budget_epochs * N / B)). The
first n points of the sequence are a quasi-random design themselves, so the
result with half the trials is the first half's. A trial evaluates every

    max(1, floor(--eval_fraction * F / B)) steps,  F = --target_examples_floor (0: N),

at most that fraction of its steps to the target wherever it needs at least
F examples (examples to a target grow with the batch: McCandlish et al.
2018). The trial with the fewest steps to the goal (of those that missed it,
the highest accuracy; the earlier point on a tie) is the best: its steps are
Shallue's statistic, the first evaluation at which any trial reached the
goal. Seeds 1 .. --seeds then train at its settings: a fresh measure, not
selected, beside it.
"""

import dataclasses
import math

from keras_lars.tools.batch_study.study import RANGES
from keras_lars.tools.batch_study.target_search import budget_steps
from keras_lars.tools.batch_study.target_search import rule_rate
from keras_lars.tools.batch_study.target_search import score
from keras_lars.tools.batch_study.target_search import stopping_trial
from keras_lars.tools.batch_study.target_search import trial_config
from keras_lars.tools.settings import ConfigError

DIMENSIONS = tuple(RANGES)  # rate, 1 - momentum, warmup fraction, budget


def points(search):
    """The first --trials points of the scrambled Halton sequence, (trials, 4)."""
    from scipy.stats import qmc

    return qmc.Halton(d=len(DIMENSIONS), scramble=True, seed=search.search_seed).random(
        search.trials
    )


def along(search, name, u):
    """The value at u in [0, 1) of range `name` (its scale: RANGES)."""
    low, high = search.ranges[name]
    if RANGES[name][1]:
        return math.exp(math.log(low) + float(u) * (math.log(high) - math.log(low)))
    return low + float(u) * (high - low)


def eval_interval(search, batch_size, num_train):
    """The evaluation interval at `batch_size` (module docstring)."""
    floor = search.target_examples_floor or num_train
    return max(1, math.floor(search.eval_fraction * floor / batch_size))


def point_values(search, index, point=None):
    """(rate factor, 1 - momentum, warmup fraction, budget factor) of trial
    `index`'s point u (`point`, default points()[index]) in the search space."""
    u = points(search)[index] if point is None else point
    return tuple(along(search, name, value) for name, value in zip(DIMENSIONS, u))


def quasi_trial(study, optimizer, batch_size, index, seed, num_train, point=None):
    """Trial `index` of the search at (optimizer, batch) with `seed`
    (module docstring); `point`: its u (default: points()[index])."""
    search = study.search
    values = point_values(search, index, point)
    budget = math.ceil(budget_steps(search, batch_size, num_train) * values[3])
    return point_trial(
        study,
        optimizer,
        batch_size,
        index,
        seed,
        values,
        budget,
        warmup_epochs=values[2] * budget / (num_train // batch_size),  # the tool rounds to a step
        eval_every_steps=eval_interval(search, batch_size, num_train),
    )


def point_trial(study, optimizer, batch_size, index, seed, values, steps, **settings):
    """Trial `index` at (optimizer, batch) with `seed` at the point of
    `values` (point_values'): the rule's peak rate times the point's rate
    factor, its momentum, `steps` (0: the length is `settings`' epochs) and
    `settings` (the warmup, the evaluation interval, ...) over the trial's."""
    rate, one_minus_momentum, warmup, _ = values
    peak = rule_rate(study, optimizer, batch_size) * rate
    config = trial_config(study, optimizer, batch_size, peak, seed, steps)
    config = dataclasses.replace(config, momentum=1.0 - one_minus_momentum, **settings)
    searched = (("momentum", config.momentum), ("warmup_fraction", warmup))
    return stopping_trial(study, optimizer, batch_size, index, seed, config, searched=searched)


def check_space(study, batches):
    """ConfigError naming --rate_range when its low end puts an optimizer's
    peak rate at one of `batches` below --end_learning_rate (the schedule
    would rise to its end)."""
    low, end = study.search.ranges["rate_range"][0], study.shared.end_learning_rate
    for optimizer in study.optimizers:
        for batch in batches:
            peak = rule_rate(study, optimizer, batch) * low
            if peak < end:
                shown = ",".join(f"{v:g}" for v in study.search.ranges["rate_range"])
                raise ConfigError(
                    f"--rate_range={shown}: its low end gives {optimizer} at batch {batch} the "
                    f"peak rate {peak:.4g}, below --end_learning_rate={end:g}; raise the range "
                    "or the optimizer's --base_learning_rates, or lower --end_learning_rate."
                )


def best_trial(rows):
    """The index of the best of `rows` ({index: row}); the earlier on a tie."""
    return min(rows, key=lambda i: (score(rows[i]), i))


def shallue_steps(rows):
    """The fewest steps to the goal among `rows` (the first evaluation at
    which any trial reached it), or None when none did."""
    return min((r["steps"] for r in rows if r["reached"]), default=None)
