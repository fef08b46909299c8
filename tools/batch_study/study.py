"""What a study is: its own settings, the training tool's settings that its
cells share, and those it sets per cell; `make_study` joins them.

The training tool's settings fall in two parts. Those set per cell are the
fields of `CellSettings` (so `PER_CELL` is derived from it, and they are not
the study's flags); all the others are shared by every cell and are the
study's flags, with `STUDY_DEFAULTS` in place of the tool's defaults. The
study's --base_learning_rates and --lr_scaling give each optimizer its own
value of the tool's --base_learning_rate and --lr_scaling, read and checked
as the tool reads and checks them.
"""

import dataclasses
import itertools
import math

from keras_lars.phases import checked_phases
from keras_lars.phases import schedule_phases
from keras_lars.tools import settings
from keras_lars.tools import train
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import between
from keras_lars.tools.settings import setting

DEFAULT_RATES = {"sgd": 0.1, "nesterov": 0.1, "lars": 2.5, "lamb": 0.01, "adam": 0.001}
DEFAULT_SCALING = {
    "sgd": "linear",
    "nesterov": "linear",
    "lars": "linear",
    "lamb": "sqrt",
    "adam": "sqrt",
}
DEFAULT_OPTIMIZERS = ("sgd", "nesterov", "lars", "lamb")
# The study's defaults for settings of the training tool.
STUDY_DEFAULTS = {"train_epochs": 10, "warmup_epochs": 2.0}
DIGITS_IMAGE_SIZE = 16
FULL = "full"  # a batch size: the whole training split
MODES = ("accuracy", "steps_to_target")
SEARCHES = ("grid", "quasi_random")
# --search=quasi_random's search space: setting -> (its default range, log scale, bounds' check).
RANGES = {
    "rate_range": (("0.1", "10"), True, lambda low, high: low > 0),
    "one_minus_momentum_range": (("0.01", "0.5"), True, lambda low, high: 0 < low and high <= 1),
    "warmup_fraction_range": (("0", "0.1"), False, lambda low, high: 0 <= low and high < 1),
    "budget_range": (("0.5", "2"), True, lambda low, high: low > 0),
}
RANGE_BOUNDS = {
    "rate_range": "> 0",
    "one_minus_momentum_range": "in (0, 1]",
    "warmup_fraction_range": "in [0, 1)",
    "budget_range": "> 0",
}
# The settings of one search (--search=grid, or quasi_random), refused with the other.
GRID_ONLY = (
    "warmup_fraction",
    "evaluations_per_epoch",
    "rate_step",
    "max_rate_steps",
    "max_budget_doublings",
    "untuned_batch_sizes",
    "noise_scale_batch_size",
)
QUASI_ONLY = (
    "trials",
    *RANGES,
    "search_seed",
    "eval_fraction",
    "target_examples_floor",
    "noise_batch_sizes",
    "noise_fractions",
    "noise_micro_batch_size",
    "noise_micro_batches",
    "noise_groups",
)


@dataclasses.dataclass(frozen=True)
class CellSettings:
    """The training tool's settings that the study sets per cell: the grid
    point, the cell's model dir, and what every cell must do. They replace
    the shared settings in each cell's Config, and are not the study's flags."""

    optimizer: str
    global_batch_size: int
    base_learning_rate: float
    lr_scaling: str
    seed: int
    model_dir: str
    recipe: str = "none"  # the study's rates, not a recipe's
    train_steps: int = 0  # the length is the epoch budget
    eval: bool = True  # every cell reports its test accuracy
    trust_ratio_log_every: int = 0
    stop_on_divergence: bool = False  # a cell that diverges is a result (chance accuracy)
    divergence_rollbacks: int = 0  # so no rollback either
    divergence_rate_factor: float = train.Config.divergence_rate_factor  # unused: no rollback
    batch_schedule: str = ""  # a batch-control cell's phases
    batch_coupling: str = train.Config.batch_coupling
    gradient_accumulation_steps: int = 1  # from --max_micro_batch_size


# The tool's --adaptive_batch settings: flags of the study, declared by the
# tool, for the adaptive arm of --mode=steps_to_target --search=quasi_random
# only (adaptive_arm.py); they stay out of the shared Config, whose cells train
# at a fixed batch (or the batch-control phases), and go into the arm's trials.
ADAPTIVE = tuple(f.name for f in dataclasses.fields(train.Config) if f.name.startswith("adaptive"))
PER_CELL = tuple(field.name for field in dataclasses.fields(CellSettings))


# --- optimizer=value pairs of a training tool's setting ----------------------------------
def _tool_setting(name):
    """The training tool's declaration of setting `name` (a dataclass field)."""
    (field,) = [f for f in settings.fields(train.Config) if f.name == name]
    return field


def _tool_value(name, text, noun):
    """(value, problem or None): `text` read as the training tool's setting
    `name` (its type) and checked as the tool checks it (finite, choices,
    check; the checks of these settings read no other setting)."""
    field = _tool_setting(name)
    kind = type(field.default)
    try:
        value = kind(text)
    except ValueError:
        return None, f"the {noun} must be a number"
    choices, check = field.metadata["choices"], field.metadata["check"]
    if kind is float and not math.isfinite(value):
        problem = "must be a finite number"
    elif choices and value not in choices:
        problem = f"must be one of {', '.join(choices)}"
    else:
        problem = check(value, None) if check else None
    return value, problem and f"the {noun} {problem}"


def per_optimizer(name, noun, defaults, help=None):
    """A study setting of optimizer=value pairs: each optimizer's own value of
    the training tool's setting `name` (`noun` in messages); optimizers not
    listed keep `defaults`. Its help, unless given, is the tool's."""
    if help is None:
        help = (
            f"optimizer={noun} pairs, the training tool's --{name} per optimizer; "
            f"optimizers not listed keep their default. {_tool_setting(name).metadata['help']}"
        )

    def check(entries, config):
        for entry in entries:
            optimizer, sep, text = entry.partition("=")
            if not sep or optimizer not in train.OPTIMIZERS:
                return (
                    f"expected optimizer=value pairs with optimizer one of "
                    f"{', '.join(train.OPTIMIZERS)}; got {entry!r}"
                )
            _, problem = _tool_value(name, text, noun)
            if problem:
                return f"{entry!r}: {problem}"
        return None

    return setting(tuple(f"{k}={v}" for k, v in defaults.items()), help, check=check)


def by_optimizer(entries, name, defaults):
    """{optimizer: value} of checked optimizer=value `entries` of the tool's
    setting `name`, over `defaults`."""
    found = dict(defaults)
    for entry in entries:
        optimizer, _, text = entry.partition("=")
        found[optimizer], _ = _tool_value(name, text, "value")
    return found


def batch_entry(text):
    """A checked --batch_sizes entry: an int, or FULL."""
    return FULL if text == FULL else int(text)


def batch_examples(batch, num_train):
    """A batch entry (an int or FULL) in examples, with `num_train` training examples."""
    return num_train if batch == FULL else batch


# --- the study's own settings ------------------------------------------------------------
def search_range(entries):
    """(low, high) floats of a checked --*_range entry."""
    low, high = map(float, entries)
    return low, high


def _range_problem(name):
    """The check of the --search=quasi_random range setting `name`."""
    bounds = RANGES[name][2]

    def check(entries, config):
        try:
            low, high = search_range(entries)
        except ValueError:
            return "expected two numbers, low,high"
        if not (math.isfinite(low) and math.isfinite(high)):
            return "expected two finite numbers, low,high"
        if low >= high:
            return "an empty range: give low < high"
        if not bounds(low, high):
            return f"both ends must be {RANGE_BOUNDS[name]}"
        return None

    return check


def _range_setting(name, help):
    default, log, _ = RANGES[name]
    scale = "log" if log else "linear"
    return setting(
        default,
        f"steps_to_target --search=quasi_random: {help} (low,high; searched on a {scale} scale).",
        check=_range_problem(name),
    )


def _batch_sizes_problem(entries, config):
    if not entries:
        return "name at least one batch size"
    for entry in entries:
        if entry != FULL and not (entry.isdigit() and int(entry) >= 1):
            return f"{entry!r} is neither a positive integer nor {FULL!r}"
    return None


def _control_schedule_problem(text, config):
    if not text:
        return None
    try:
        phases = checked_phases(schedule_phases(text))
    except ValueError as error:
        return str(error)
    if len(phases) < 2:
        return "a ramp needs two phases or more, e.g. 0:1024,3:4096"
    if any(b.global_batch_size <= a.global_batch_size for a, b in itertools.pairwise(phases)):
        return "each phase's batch must be larger than the one before (a ramp)"
    return None


def _targets_problem(entries):
    for entry in entries:
        try:
            value = float(entry)
        except ValueError:
            return f"{entry!r} is not a number"
        if not 0 < value <= 1:
            return f"{entry} is not an accuracy in (0, 1]"
    return None


def _fractions_problem(entries):
    if not entries:
        return "name at least one fraction"
    for entry in entries:
        try:
            value = float(entry)
        except ValueError:
            return f"{entry!r} is not a number"
        if not 0 <= value <= 1:
            return f"{entry} is not a fraction in [0, 1]"
    return None


def _optimizers_problem(names, config):
    if not names:
        return "name at least one optimizer"
    if len(set(names)) < len(names):
        return "an optimizer is listed twice"
    return None


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """The study's own settings (its other flags are the training tool's)."""

    optimizers: tuple = setting(
        DEFAULT_OPTIMIZERS,
        "Optimizers to compare.",
        choices=train.OPTIMIZERS,
        check=_optimizers_problem,
    )
    batch_sizes: tuple = setting(
        ("32", "128", "512", FULL),
        "Global batch sizes; 'full' is the whole training set (one step per epoch).",
        check=_batch_sizes_problem,
    )
    seeds: int = setting(
        3, "Seeds per (optimizer, batch): 0, 1, ..., seeds - 1.", check=at_least(1)
    )
    base_learning_rates: tuple = per_optimizer(
        "base_learning_rate",
        "rate",
        DEFAULT_RATES,
        "optimizer=rate pairs: peak rate per 256 examples, scaled by --lr_scaling; "
        "optimizers not listed keep their default.",
    )
    lr_scaling: tuple = per_optimizer("lr_scaling", "rule", DEFAULT_SCALING)
    control_schedule: str = setting(
        "",
        "Batch-control cells: a ramp of epoch:global batch phases (the training tool's "
        "--batch_schedule syntax, e.g. 0:1024,3:4096,6:16384). Each of --control_optimizers "
        "then adds, at the same epochs: fixed (the ramp's last batch throughout), ramp (its "
        "phases, the rate scaled with the batch by the optimizer's --lr_scaling rule) and "
        "grow (its phases, the first batch's rate held after warmup: Smith et al. 2018). "
        "Empty: none.",
        check=_control_schedule_problem,
    )
    control_optimizers: tuple = setting(
        (),
        "Optimizers that get the batch-control cells; empty: every one of --optimizers.",
        choices=train.OPTIMIZERS,
    )
    mode: str = setting(
        "accuracy",
        "accuracy: test accuracy after --train_epochs at each batch, one rate rule for all "
        "batches. steps_to_target: per optimizer and batch, a search over the peak rate and "
        "the schedule's length for the fewest steps to the training tool's "
        "--target_accuracy, then --seeds at the choice (Shallue et al. 2019).",
        choices=MODES,
    )
    search: str = setting(
        "grid",
        "steps_to_target: the search at each optimizer and batch. grid: the peak rate on a log "
        "grid around the rule's rate, walked from the batch before's choice, then the budget "
        "(momentum, warmup and decay shape fixed; the protocol of the committed Fashion-MNIST "
        "study). quasi_random: --trials points of a scrambled Halton sequence (scipy.stats.qmc; "
        "the same points at every optimizer and batch) over the peak rate, 1 - momentum (LAMB: "
        "1 - beta_1), the warmup fraction and the decay length (the budget), --*_range; then "
        "--seeds fresh seeds at the best trial's settings (Shallue et al. 2019, Nado et al. 2021).",
        choices=SEARCHES,
    )
    trials: int = setting(
        16,
        "steps_to_target --search=quasi_random: the search's trials per optimizer and batch, "
        "the first --trials points of one sequence (so a larger value reuses the stored ones).",
        check=at_least(2),
    )
    rate_range: tuple = _range_setting(
        "rate_range",
        "the peak rate, as factors of the optimizer's rule rate at the batch "
        "(--base_learning_rates scaled by --lr_scaling)",
    )
    one_minus_momentum_range: tuple = _range_setting(
        "one_minus_momentum_range", "1 - momentum (LAMB: 1 - beta_1; the tool's --momentum)"
    )
    warmup_fraction_range: tuple = _range_setting(
        "warmup_fraction_range", "the linear warmup, as a fraction of the trial's budget"
    )
    budget_range: tuple = _range_setting(
        "budget_range",
        "the decay length, the trial's budget of steps, as factors of T(B) (--budget_epochs, "
        "--min_budget_steps)",
    )
    search_seed: int = setting(
        0,
        "steps_to_target --search=quasi_random: the seed of the Halton sequence's scramble.",
        check=between(0, 2**31 - 1),
    )
    eval_fraction: float = setting(
        0.02,
        "steps_to_target --search=quasi_random: a trial at batch B evaluates every "
        "max(1, floor(eval_fraction * --target_examples_floor / B)) steps: at most this "
        "fraction of its steps to the target wherever it needs at least --target_examples_floor "
        "examples (steps_to_target.csv's eval_fraction_of_steps says where it did).",
        check=lambda value, config: None if 0 < value <= 1 else "must be in (0, 1]",
    )
    target_examples_floor: int = setting(
        0,
        "steps_to_target --search=quasi_random: a lower bound on the training examples any "
        "trial needs to the target (examples to a target grow with the batch); 0: one epoch.",
        check=at_least(0),
    )
    robustness_targets: tuple = setting(
        (),
        "steps_to_target: accuracies below --target_accuracy at which S_min and B_crit are "
        "fitted too (robustness.csv, beside the goal's), from the search trials' evaluations: "
        "at each, the first evaluation at which any trial reached it.",
        check=lambda entries, config: _targets_problem(entries),
    )
    noise_batch_sizes: tuple = setting(
        (),
        "steps_to_target --search=quasi_random: at these batches (of --batch_sizes) each "
        "optimizer's best trial trains once more, saving its weights at --noise_fractions of "
        "its steps to the goal, and the gradient noise scale B_simple is measured at each, at "
        "fixed weights on the training images (keras_lars.measure_noise_scale): "
        "noise_scales.csv. Empty: not measured.",
        check=lambda entries, config: _batch_sizes_problem(entries, config) if entries else None,
    )
    noise_fractions: tuple = setting(
        ("0", "0.25", "0.5", "0.75", "1"),
        "steps_to_target: the points of the run (fractions of the steps to the goal) where "
        "--noise_batch_sizes measures B_simple.",
        check=lambda entries, config: _fractions_problem(entries),
    )
    noise_micro_batch_size: int = setting(
        64,
        "steps_to_target: B_small of the noise scale at fixed weights (the big batch is "
        "--noise_micro_batches of them).",
        check=at_least(1),
    )
    noise_micro_batches: int = setting(
        8,
        "steps_to_target: B_big / B_small of the noise scale at fixed weights.",
        check=at_least(2),
    )
    noise_groups: int = setting(
        32,
        "steps_to_target: the noise scale's groups of --noise_micro_batches micro-batches at "
        "each point (the jackknife's samples: its 95% interval).",
        check=at_least(2),
    )
    budget_epochs: float = setting(
        10.0,
        "steps_to_target: a trial at batch B runs at most max(--min_budget_steps, "
        "ceil(budget_epochs * N / B)) steps, its warmup and decay fitted to that budget.",
        check=lambda value, config: None if value > 0 else "must be > 0",
    )
    min_budget_steps: int = setting(
        100, "steps_to_target: the fewest steps a trial's budget has.", check=at_least(1)
    )
    warmup_fraction: float = setting(
        0.05,
        "steps_to_target: linear warmup over this fraction of a trial's budget (then "
        "power-2 decay to --end_learning_rate at the budget's end).",
        check=lambda value, config: None if 0 <= value < 1 else "must be in [0, 1)",
    )
    evaluations_per_epoch: int = setting(
        4,
        "steps_to_target: evaluations an epoch (every floor(N / B / this) steps, at least "
        "every step); the resolution of the steps to the target.",
        check=at_least(1),
    )
    rate_step: float = setting(
        2.0,
        "steps_to_target: the factor between the rates of the search's log grid.",
        check=lambda value, config: None if value > 1 else "must be > 1",
    )
    max_rate_steps: int = setting(
        5,
        "steps_to_target: the search goes at most this many grid steps from its centre either way.",
        check=at_least(1),
    )
    max_budget_doublings: int = setting(
        1,
        "steps_to_target: after the rate search at a batch, its chosen rate is tried with "
        "the budget (and so the schedule's length) halved and doubled, on while that "
        "helps, at most this many times either way; 0: the budget T(B) only.",
        check=at_least(0),
    )
    seed_batch_sizes: tuple = setting(
        (),
        "steps_to_target: the batch sizes that get --seeds seeds at their chosen rate and budget "
        "(e.g. those around the knee); empty: every one of --batch_sizes.",
        check=lambda entries, config: _batch_sizes_problem(entries, config) if entries else None,
    )
    untuned_batch_sizes: tuple = setting(
        (),
        "steps_to_target: batch sizes trained without a search, for those too costly to "
        "tune: one trial (and its seeds) at the peak rate and schedule length chosen at the "
        "batch before, the rate not scaled; not run when that choice missed the target. Their "
        "rows say tuned=False and the fit leaves them out. Not the smallest of --batch_sizes. "
        "Empty: every batch is tuned.",
        check=lambda entries, config: _batch_sizes_problem(entries, config) if entries else None,
    )
    max_micro_batch_size: int = setting(
        0,
        "A cell (or trial) whose batch is larger trains in micro-batches of at most this "
        "many images, the fewest that divide its batch (the training tool's "
        "--gradient_accumulation_steps): the batch your devices hold. Batch norm then "
        "normalises each micro-batch by itself. 0: no limit.",
        check=at_least(0),
    )
    noise_scale_batch_size: str = setting(
        "",
        "steps_to_target: after the seeds, each optimizer trains once more at this batch "
        "(one of --batch_sizes) at its chosen rate and budget, in --noise_scale_micro_batches "
        "micro-batches, measuring the gradient noise scale (the tool's --noise_scale) up to "
        "the target, to set beside the fitted B_crit. Empty: not measured.",
        check=lambda value, config: _batch_sizes_problem((value,), config) if value else None,
    )
    noise_scale_micro_batches: int = setting(
        8,
        "steps_to_target: the micro-batches of the noise-scale run, and of every trial of the "
        "adaptive arm (--adaptive_batch), which measures B_simple from them (the tool's "
        "--gradient_accumulation_steps; without batch norm the run is the trial's).",
        check=at_least(2),
    )
    compare_study: str = setting(
        "",
        "steps_to_target --adaptive_batch: the directory of a fixed-batch quasi_random study "
        "of the same target and evaluation split (its fit.json and steps_to_target.json, read "
        "as untrusted) that comparison.csv sets the adaptive arm beside: the fixed batch of the "
        "adaptive steps and its examples. Empty: no comparison.",
    )
    study_dir: str = setting(
        "runs/batch_study",
        "Store, tables, plot and cell model dirs (a local directory).",
        check=lambda value, config: None if value else "must be a directory path",
    )

    def __post_init__(self):
        settings.check(self)


# --- the study ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Study:
    """A sweep: the training settings every cell shares, and the grid."""

    shared: train.Config  # its per-cell settings are overwritten by each cell
    optimizers: tuple
    batch_sizes: tuple  # ints and/or FULL
    seeds: int
    rates: dict  # optimizer -> (base rate per 256 examples, scaling rule)
    study_dir: str
    control_schedule: str = ""  # the batch-control ramp's phases, "" for none
    control_optimizers: tuple = ()
    search: object = None  # steps_to_target: its TargetSearch, else None
    max_micro_batch_size: int = 0  # 0: no limit

    def micro_batches(self, batch_size):
        """The fewest micro-batches k that divide `batch_size` into batches of
        at most --max_micro_batch_size (1 without a limit)."""
        limit = self.max_micro_batch_size
        if not limit:
            return 1
        return next(
            k for k in range(1, batch_size + 1) if not batch_size % k and batch_size <= k * limit
        )


@dataclasses.dataclass(frozen=True)
class TargetSearch:
    """The steps-to-target mode's settings (StudySettings' help)."""

    budget_epochs: float
    min_budget_steps: int
    warmup_fraction: float
    evaluations_per_epoch: int
    rate_step: float
    max_rate_steps: int
    max_budget_doublings: int
    seed_batch_sizes: tuple  # ints and/or FULL; empty: every batch
    noise_scale_batch_size: object = None  # an int, FULL or None
    noise_scale_micro_batches: int = 8
    untuned_batch_sizes: tuple = ()  # ints and/or FULL
    search: str = "grid"
    trials: int = 16  # quasi_random
    ranges: dict = dataclasses.field(default_factory=dict)  # quasi_random: name -> (low, high)
    search_seed: int = 0
    eval_fraction: float = 0.02
    target_examples_floor: int = 0  # 0: one epoch
    robustness_targets: tuple = ()  # floats below the goal
    noise_batch_sizes: tuple = ()  # quasi_random: ints and/or FULL
    noise_fractions: tuple = ()  # floats in [0, 1]
    noise_micro_batch_size: int = 64
    noise_micro_batches: int = 8
    noise_groups: int = 32
    adaptive: dict = dataclasses.field(default_factory=dict)  # the arm's ADAPTIVE settings; {}: off
    compare_study: str = ""

    def protocol(self, shared):
        """What makes a store's trials one study's (check_protocol): the
        search, its space, the split the goal is read on, and the adaptive
        arm's settings (a fixed-batch store has none)."""
        found = {"search": self.search}
        if self.search == "quasi_random":
            found.update({k: list(v) for k, v in self.ranges.items()}, search_seed=self.search_seed)
        found.update(self.adaptive)
        found["validation_examples"] = shared.validation_examples
        found["validation_seed"] = shared.validation_seed
        return found


def make_study(own, shared, given=()):
    """The Study of `own` (StudySettings) and `shared`: values of the
    training tool's settings but PER_CELL (STUDY_DEFAULTS where absent;
    image size 0 on digits: DIGITS_IMAGE_SIZE; on other data sets the
    tool's default, e.g. 28 on fashion_mnist). `given`: the names of the
    tool's settings given on the command line."""
    per_cell = sorted(set(shared) & set(PER_CELL))
    if per_cell:
        raise ConfigError(f"--{per_cell[0]} is set per cell by the study.")
    adaptive = {name: shared[name] for name in ADAPTIVE if name in shared}
    shared = {name: value for name, value in shared.items() if name not in ADAPTIVE}
    _adaptive_flags(own, adaptive, given)
    search = _target_search(own, shared, given)
    shared = {**STUDY_DEFAULTS, **shared}
    if not shared.get("image_size") and shared.get("dataset", train.Config.dataset) == "digits":
        shared["image_size"] = DIGITS_IMAGE_SIZE
    bases = by_optimizer(own.base_learning_rates, "base_learning_rate", DEFAULT_RATES)
    rules = by_optimizer(own.lr_scaling, "lr_scaling", DEFAULT_SCALING)
    batches = tuple(map(batch_entry, own.batch_sizes))
    base = train.Config(**shared)  # checks the shared settings (names the flag)
    if base.strategy == "multi_worker" or base.num_processes != 1:
        culprit = (
            "--strategy=multi_worker"
            if base.strategy == "multi_worker"
            else f"--num_processes={base.num_processes}"
        )
        raise ConfigError(
            f"{culprit}: the study trains its cells one after another in one process; "
            "give it the devices of one machine (--strategy=mirrored or --distribution)."
        )
    if search and adaptive.get("adaptive_batch", "off") != "off":
        search = dataclasses.replace(
            search, adaptive=_adaptive_arm(own, base, adaptive), compare_study=own.compare_study
        )
    strays = [name for name in own.control_optimizers if name not in own.optimizers]
    if strays:
        raise ConfigError(
            f"--control_optimizers={','.join(own.control_optimizers)}: {strays[0]} is not one "
            f"of --optimizers={','.join(own.optimizers)}."
        )
    return Study(
        base,
        own.optimizers,
        batches,
        own.seeds,
        {name: (bases[name], rules[name]) for name in own.optimizers},
        own.study_dir,
        own.control_schedule,
        (own.control_optimizers or own.optimizers) if own.control_schedule else (),
        search,
        own.max_micro_batch_size,
    )


# The tool's settings that a steps-to-target trial sets from its budget.
PER_TRIAL = ("train_epochs", "warmup_epochs", "eval_every_steps")


def _target_search(own, shared, given):
    """The TargetSearch of a steps-to-target study (None in accuracy mode);
    ConfigError for settings that do not fit the mode."""
    if own.mode != "steps_to_target":
        if shared.get("target_accuracy"):
            raise ConfigError(
                f"--target_accuracy={shared['target_accuracy']} needs --mode=steps_to_target "
                "(the accuracy mode trains every cell for --train_epochs)."
            )
        return None
    if not shared.get("target_accuracy"):
        raise ConfigError("--mode=steps_to_target needs --target_accuracy (in (0, 1]).")
    if own.control_schedule:
        raise ConfigError("--control_schedule belongs to --mode=accuracy.")
    per_trial = PER_TRIAL + (("momentum",) if own.search == "quasi_random" else ())
    fixed = sorted(set(given) & set(per_trial))
    if fixed and fixed[0] == "momentum":
        raise ConfigError(
            "--momentum: --search=quasi_random searches it per trial (--one_minus_momentum_range)."
        )
    if fixed:
        raise ConfigError(
            f"--{fixed[0]}: --mode=steps_to_target sets it per trial from the budget "
            "(--budget_epochs, --min_budget_steps, --warmup_fraction, --evaluations_per_epoch)."
        )
    noise = own.noise_scale_batch_size
    if noise and noise not in own.batch_sizes:
        raise ConfigError(
            f"--noise_scale_batch_size={noise}: not one of --batch_sizes="
            f"{','.join(own.batch_sizes)} (it runs at a batch's chosen rate)."
        )
    for flag in ("seed_batch_sizes", "untuned_batch_sizes", "noise_batch_sizes"):
        strays = [b for b in getattr(own, flag) if b not in own.batch_sizes]
        if strays:
            raise ConfigError(
                f"--{flag}={','.join(getattr(own, flag))}: {strays[0]} is not one of "
                f"--batch_sizes={','.join(own.batch_sizes)}."
            )
    smallest = min(own.batch_sizes, key=lambda b: batch_examples(batch_entry(b), math.inf))
    if smallest in own.untuned_batch_sizes:
        raise ConfigError(
            f"--untuned_batch_sizes={','.join(own.untuned_batch_sizes)}: {smallest} is the "
            "smallest of --batch_sizes; an untuned batch takes the choice of the batch before."
        )
    other = QUASI_ONLY if own.search == "grid" else GRID_ONLY
    defaults = StudySettings.__dataclass_fields__
    moved = [name for name in other if getattr(own, name) != defaults[name].default]
    if moved:
        raise ConfigError(
            f"--{moved[0]}: belongs to --search="
            f"{'quasi_random' if own.search == 'grid' else 'grid'}, not --search={own.search}."
        )
    goal = shared["target_accuracy"]
    high = [t for t in own.robustness_targets if float(t) >= goal]
    if high:
        raise ConfigError(
            f"--robustness_targets={','.join(own.robustness_targets)}: {high[0]} is not below "
            f"--target_accuracy={goal} (trials stop at the goal)."
        )
    return TargetSearch(
        own.budget_epochs,
        own.min_budget_steps,
        own.warmup_fraction,
        own.evaluations_per_epoch,
        own.rate_step,
        own.max_rate_steps,
        own.max_budget_doublings,
        tuple(map(batch_entry, own.seed_batch_sizes)),
        batch_entry(noise) if noise else None,
        own.noise_scale_micro_batches,
        tuple(map(batch_entry, own.untuned_batch_sizes)),
        own.search,
        own.trials,
        {name: search_range(getattr(own, name)) for name in RANGES},
        own.search_seed,
        own.eval_fraction,
        own.target_examples_floor,
        tuple(sorted(float(t) for t in own.robustness_targets)),
        tuple(map(batch_entry, own.noise_batch_sizes)),
        tuple(sorted({float(f) for f in own.noise_fractions})),
        own.noise_micro_batch_size,
        own.noise_micro_batches,
        own.noise_groups,
    )


def _adaptive_flags(own, adaptive, given):
    """ConfigError for the adaptive arm's flags out of place: any of them
    (or --compare_study) without --adaptive_batch, or the arm outside
    --mode=steps_to_target --search=quasi_random."""
    rule = adaptive.get("adaptive_batch", "off")
    if rule == "off":
        stray = sorted(set(given) & set(ADAPTIVE)) or (["compare_study"] * bool(own.compare_study))
        if stray:
            raise ConfigError(
                f"--{stray[0]}: belongs to the adaptive arm: give --adaptive_batch "
                "(with --mode=steps_to_target --search=quasi_random)."
            )
    elif own.mode != "steps_to_target" or own.search != "quasi_random":
        raise ConfigError(
            f"--adaptive_batch={rule}: the adaptive arm runs in --mode=steps_to_target "
            "--search=quasi_random (its trials search the fixed arm's space)."
        )


def _adaptive_arm(own, base, adaptive):
    """The adaptive arm's settings ({name: value} of ADAPTIVE), checked
    against every start batch (--batch_sizes) and the micro-batches its
    trials measure B_simple from (--noise_scale_micro_batches): as the
    tool checks them, with the study's flags named."""
    adaptive = {
        name: adaptive.get(name, train.Config.__dataclass_fields__[name].default)
        for name in ADAPTIVE
    }
    fixed = [name for name in ("noise_batch_sizes", "robustness_targets") if getattr(own, name)]
    if fixed:
        raise ConfigError(
            f"--{fixed[0]}: belongs to the fixed-batch arm, not --adaptive_batch (whose trials "
            "measure B_simple as they train and stop at the goal)."
        )
    listed = f"--batch_sizes={','.join(own.batch_sizes)}"
    if FULL in own.batch_sizes:
        raise ConfigError(f"{listed}: the adaptive arm starts at a number of images, not {FULL}.")
    starts, high = sorted(map(int, own.batch_sizes)), adaptive["adaptive_batch_max"]
    if not high:
        raise ConfigError(
            f"--adaptive_batch={adaptive['adaptive_batch']}: needs --adaptive_batch_max, the "
            "largest global batch to grow to."
        )
    if high < starts[-1]:
        raise ConfigError(
            f"--adaptive_batch_max={high} is below the start batch {starts[-1]} of {listed}."
        )
    low = adaptive["adaptive_batch_min"]
    if low > starts[0]:
        raise ConfigError(
            f"--adaptive_batch_min={low} is above the start batch {starts[0]} of {listed}."
        )
    k = own.noise_scale_micro_batches
    strays = [b for b in (*starts, high) if b % k]
    if strays:
        raise ConfigError(
            f"--noise_scale_micro_batches={k} does not divide {strays[0]} (of {listed} and "
            "--adaptive_batch_max): the adaptive arm's batches are made of that many micro-batches."
        )
    limit = own.max_micro_batch_size
    if limit and high // k > limit:
        raise ConfigError(
            f"--max_micro_batch_size={limit}: the adaptive arm's micro-batch reaches "
            f"{high // k} images at --adaptive_batch_max={high} in --noise_scale_micro_batches="
            f"{k}; raise --noise_scale_micro_batches."
        )
    for start in starts:  # the tool's checks (growth, target, min, ...), naming the flag
        dataclasses.replace(
            base, global_batch_size=start, gradient_accumulation_steps=k, **adaptive
        )
    return adaptive
