"""The test tiers (CONTRIBUTING.md, "Tests"), which tests/conftest.py's hooks call.

`pytest -m "not slow"` is what a developer runs between edits. `slow` is never
written on a test by hand: collection (classify below) sets it on

- every test that starts a process: one marked `subprocess` or `multiworker`,
  or one that reaches a process-starting call (process_starters(): the
  subprocess and multiprocessing modules, os's fork/exec/spawn/system, and
  the library functions in _LIBRARY_STARTERS) from its own code or its
  fixtures', directly or through the functions and classes of tests/ they
  use (read from their bytecode). Such a test also gets `subprocess`.
- every test that reaches a whole training run in this process the same way
  (_LIBRARY_TRAINING: the tool's train_and_evaluate, the batch study), other
  than through train_data.short_run (two steps of a small model).

A guard (guarded below) checks the split on every test not marked slow,
whatever `-m` says: a process start fails the test (the call raises, and the
test fails even if something caught that), and so does training more than
FAST_WORK parameter-steps through Model.fit and train_on_batch. The failure
says what to do, so a misclassified test cannot hide. `pytest --collect-only
-q -m slow` lists the slow tests; the reason of each is in its
user_properties (junitxml).

Collection also marks the modules and tests that CI's oldest-pair stage
leaves out (VERSION_INDEPENDENT, NEWEST_ONLY_IN_CI), and puts each test in its
xdist unit of work, in the order the units go out (SEVERAL_PROCESSES,
LONGEST_MODULES). Importing it loads no Keras: xdist's controller uses its
tables and runs no test; the library functions it reads load on first use,
after tests/conftest.py's setup (the backend, the logical devices).
"""

import builtins
import dis
import functools
import importlib
import importlib.metadata
import inspect
import multiprocessing
import multiprocessing.process
import os
import subprocess
import sys
import types

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

# The training a fast test may do in this process, through Model.fit and
# train_on_batch: optimizer steps times the model's parameters, summed. A
# tiny model may take many steps; ResNet-18 (11.2M parameters) about 20.
FAST_WORK = 250_000_000

# Library functions that start processes (module, name). The subprocess and
# multiprocessing modules and os's process functions are found wherever a
# test reaches them; library code is not read, so its starters are listed.
_LIBRARY_STARTERS = (
    ("keras_lars.tools.benchmark_allreduce", "measure"),
    ("keras_lars.tools.benchmark_optimizers", "measure_jax"),
    ("keras_lars.tools.benchmark_optimizers", "main"),
    ("keras_lars.tools.plan.hlo_bytes", "compile_cases"),
    ("keras_lars.tools.train.process_start", "bounded_start"),  # its watchdog process
    ("keras_lars.tools.train.runtime_jax", "start_processes"),  # through bounded_start
)
# Library functions that train a whole run (or several) in this process.
_LIBRARY_TRAINING = (
    ("keras_lars.tools.train", "train_and_evaluate"),
    ("keras_lars.tools.train.cli", "main"),  # tests/train_tool.py's run_main
    ("keras_lars.tools.batch_study", "run_study"),
    ("keras_lars.tools.batch_study", "run_cell"),
    ("keras_lars.tools.batch_study", "run_target_study"),
    ("keras_lars.tools.benchmark_plan", "benchmark"),  # a calibration run, then runs to a target
)
# tests/ helpers that train a run cut to a few steps (the guard checks that):
# a test that reaches _LIBRARY_TRAINING through them only stays fast.
_SHORT_TRAINING = (("tests.train_data", "short_run"),)
_OS_STARTERS = (
    *("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp"),
    *("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe"),
    *("spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe"),
)


def _library(pairs):
    found = []
    for module, name in pairs:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError) as error:
            raise ImportError(
                f"tests/tiers.py lists {module}.{name}, which is gone ({error}): "
                "update the list, or the test tiers go wrong"
            ) from None
    return found


# The library's starters and training functions load with the tools (Keras,
# TensorFlow): in the processes that collect or run tests, on first use, not
# in xdist's controller, which runs none (tests/conftest.py).
@functools.cache
def process_starters():
    """The objects whose reach makes a test start a process."""
    found = [subprocess, multiprocessing]
    found += [getattr(os, name) for name in _OS_STARTERS if hasattr(os, name)]
    return found + _library(_LIBRARY_STARTERS)


_LOADS = ("LOAD_GLOBAL", "LOAD_NAME")
_ATTRIBUTES = ("LOAD_ATTR", "LOAD_METHOD")


def _in_tests(obj):
    """Whether `obj` (a function or class) is defined in tests/."""
    if isinstance(obj, type):
        path = getattr(sys.modules.get(obj.__module__), "__file__", None) or ""
    else:
        path = getattr(getattr(obj, "__code__", None), "co_filename", "")
    return os.path.abspath(path).startswith(TESTS + os.sep)


def _codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


@functools.cache
def _referenced(function):
    """_references(function), read once for both reaches (_reaches)."""
    return tuple(_references(function))


def _references(function):
    """The objects that `function`'s code (nested functions included) names:
    globals, their attributes (`module.name`) and modules it imports."""
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None:
        return
    namespace = function.__globals__
    for part in _codes(code):
        current, importing, imported = None, None, {}  # imported: local name -> its object
        for instruction in dis.get_instructions(part):
            if instruction.opname in _LOADS:
                name = instruction.argval
                current = namespace.get(name, getattr(builtins, name, None))
            elif instruction.opname.startswith("LOAD_FAST"):
                current = imported.get(instruction.argval)
            elif instruction.opname == "IMPORT_FROM" and importing is not None:
                # `from package import module, name` in a function
                name = f"{importing.__name__}.{instruction.argval}"
                current = sys.modules.get(name) or getattr(importing, instruction.argval, None)
            elif instruction.opname == "STORE_FAST" and current is not None:
                imported[instruction.argval] = current
                current = None
                continue
            elif instruction.opname in _ATTRIBUTES and isinstance(
                current, (types.ModuleType, type)
            ):
                try:  # a module's or class's attribute: `subprocess.run`, `train.main`
                    current = getattr(current, instruction.argval, None)
                except Exception:  # a lazy attribute that does not load: not a target
                    current = None
            elif instruction.opname in _ATTRIBUTES:
                current = None  # an instance's attribute: not followed
            elif instruction.opname == "IMPORT_NAME":
                current = importing = sys.modules.get(instruction.argval)
            else:
                current = None
                continue
            if current is not None:
                yield current


class _Reach:
    """Whether code reaches one of `targets`, reading tests/ functions and
    classes on the way (memoized) but not `opaque` ones."""

    def __init__(self, targets, opaque=()):
        self.targets = {id(target) for target in targets}
        self.opaque = {id(helper) for helper in opaque}
        self.known = {}

    def find(self, obj):
        """The names on a path from `obj` to a target, or None."""
        key = id(obj)
        if key not in self.known:
            self.known[key] = None  # a cycle adds nothing
            self.known[key] = self._search(obj)
        return self.known[key]

    def _search(self, obj):
        if isinstance(obj, type):
            children = []
            for member in vars(obj).values():
                member = member.fget if isinstance(member, property) else member
                children.append(getattr(member, "__func__", member))
        else:
            children = []
            for reference in _referenced(obj):
                if id(reference) in self.targets:
                    return [_name(obj), _name(reference)]
                children.append(reference)
        for child in children:
            readable = inspect.isfunction(child) or isinstance(child, type)
            if readable and id(child) not in self.opaque and _in_tests(child):
                path = self.find(child)
                if path:
                    return [_name(obj), *path]
        return None


def _name(obj):
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))


def _fixture_functions(item):
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(info, "names_closure", ()):
        for definition in info.name2fixturedefs.get(name, ()):
            if _in_tests(definition.func):
                yield definition.func


def _why_slow(item):
    """Why `item` is slow ("starts a process: ..."), or None."""
    for marker in ("subprocess", "multiworker"):
        if item.get_closest_marker(marker):
            return f"marked {marker}"
    function = getattr(item, "function", None)
    sources = ([function] if function else []) + list(_fixture_functions(item))
    processes, training = _reaches()
    for reach, what in ((processes, "starts a process"), (training, "trains a run")):
        for source in sources:
            path = reach.find(source)
            if path:
                return f"{what}: {' -> '.join(path)}"
    measured = SLOW_IN_PROCESS.get(f"{os.path.basename(str(item.fspath))}::{item.name}")
    if measured:
        return f"takes long in this process (SLOW_IN_PROCESS): {measured}"
    return None


# In-process tests that start no process and train no whole run, yet take the
# longest of the fast tier on 2 cores: a training run traced again and again
# (train_data.short_run several times, or a phased run's three shapes), or
# steps of MirroredStrategy on two logical CPUs. Collection marks them slow,
# which took 106 of the fast tier's 270 s of CPU (CONTRIBUTING, "Tests"); the
# whole suite and CI run them as before. A parametrized test keeps a case in
# the fast tier (test_tiers checks), and so does each claim named in the
# reasons. Times: the test's seconds in the fast tier of 2026-12-05 (`-n 2`,
# the machine loaded about 4x); of 1,406 s in all.
_SHORT_RUNS = "train_data.short_run {} times in one test (the default ResNet-20 traced each time)"
SLOW_IN_PROCESS = {
    "test_train_adaptive.py::test_a_decision_changes_the_batch_and_a_rerun_from_its_checkpoint_"
    "decides_alike": f"32 s alone (2026-12-07): {_SHORT_RUNS.format(2)}, each rebuilt at the "
    "decided batch; the adaptive flags' refusals stay fast in the same module",
    "test_resume_mismatch.py::test_the_training_tool_resumes_from_the_checkpoint_before_another_"
    "runs_weights": f"87 s: {_SHORT_RUNS.format(3)}; the fallback from another run's weights "
    "file stays fast in test_another_runs_weights_file_falls_back_to_the_checkpoint_before",
    "test_batch_schedule_tool.py::test_a_phased_run_feeds_each_batch_and_size_and_follows_the_"
    "closed_form": "61 s: a short run in three phases, each traced anew",
    "test_bad_input.py::test_a_resumed_run_reports_its_own_throughput_not_the_checkpoints": (
        f"53 s: {_SHORT_RUNS.format(2)}, of 3 epochs"
    ),
    "test_bad_input.py::test_a_resumable_change_without_config_json_resumes_and_writes_it_again": (
        "46 s: its module's short run, and a second run resuming it; the record refuses other "
        "settings in the fast test_a_deleted_config_json_still_refuses_other_settings_naming_them"
    ),
    "test_bad_input.py::test_a_checkpoint_without_the_record_resumes_as_before_saying_so": (
        "20 s: a second run resuming its module's short run"
    ),
    "test_compat.py::test_synchronized_batch_norm_trains_on_two_replicas_as_on_one": "47 s: "
    "fits on two replicas and on one; the synchronized statistics stay fast in "
    "test_synchronized_batch_norm_variance_is_two_pass and "
    "test_batch_norm_statistics_are_the_mean_of_the_replicas",
    "test_compat.py::test_iterations_count_the_steps_run_at_the_end_of_unknown_cardinality"
    "[mirrored-4]": "19 s: three fits under MirroredStrategy; [mirrored-1] stays fast",
    "test_models.py::test_lars_steps_lower_the_loss": "40 s: 5 epochs of ResNet-18 and AlexNet-BN",
    "test_models.py::test_mixed_bfloat16_train_step": "30 s: ResNet-18 traced, stepped in bfloat16",
    "test_callbacks.py::test_callback_under_mirrored_strategy": "33 s: two fits under "
    "MirroredStrategy; the callback's schedule stays fast on one device",
    "test_mirrored_steps.py::test_clipping_applies_to_the_all_reduced_gradient"
    "[LAMB global_clipnorm]": "34 s: MirroredStrategy steps; [LARS clipnorm] stays fast",
    "test_mirrored_steps.py::test_clipping_applies_to_the_all_reduced_gradient"
    "[LAMB clipvalue]": "30 s: MirroredStrategy steps; [LARS clipnorm] stays fast",
    "test_mirrored_steps.py::test_steps_per_execution_under_mirrored_strategy[4]": (
        "32 s: MirroredStrategy steps; [3] stays fast"
    ),
    "test_xla_readiness.py::test_train_step_compiles_with_xla_and_has_no_host_ops[LAMB]": (
        "23 s: an XLA compilation; [LARS] stays fast"
    ),
    "test_optimizer_integration.py::test_keras_file_resume_continues_exactly[lamb]": (
        "18 s: [lars] stays fast"
    ),
}


# The smoke tier, `pytest -m smoke`: what a contributor runs before every
# commit, in about a minute on 2 cores (CONTRIBUTING, "Tests"). The fast tests
# of these modules, one room each, checked against independent references:
SMOKE = {
    "test_lars.py": "LARS against numpy from the paper's equations, every option",
    "test_lamb.py": "LAMB against numpy from the paper's equations",
    "test_schedules.py": "the warmup + polynomial-decay schedule's closed form",
    "test_settings.py": "the tools' settings declarations, flags and config.json",
    "test_plan.py": "the planner's arithmetic",
    "test_timing.py": "the durations report",
}


# Tests over tests/timing.py's 20 seconds of worker time (README's test
# command, 2 processes), each with its reason: the run's summary names a
# longer test that is not here, and fails the run past timing's generous cap.
# Keys are `module.py::test[parameters]`, where `*` matches any text.
# Worker seconds (README's test command, quiet, 2026-12-07, tests/durations.md) in
# brackets; a module fixture's time is its first test's.
_JAX_RUNS = "JAX tool processes on 8 simulated devices"
_RESUMES = "the tool killed or signalled, rerun, and compared with an uninterrupted run"
LONG_TESTS = {
    "test_train_jax.py::test_every_distribution_steps_as_one_device[data_parallel_8]": (
        f"{_JAX_RUNS}: the `runs` fixture, five runs of ResNet-20, each compiled, and two of "
        "the simple CNN, one on 2 processes (398 s at load 9-14 on 2026-12-07, 435 s with "
        "ResNet-18 the same way; 131 s quiet with ResNet-18, 201 s with seven)"
    ),
    "test_train_jax.py::test_a_sigterm_then_a_killed_process_and_the_reruns_end_as_the_"
    "uninterrupted_run": f"{_JAX_RUNS}: three 2-process runs of the simple CNN, {_RESUMES} "
    "(139 s before 2026-12-07, of ResNet-18)",
    "test_plan_hlo.py::test_the_planned_bytes_are_the_compiled_steps_within_2_percent"
    "[alexnet:data_parallel:8:1:224:256]": "the `compiled` fixture: the tool's JAX step of "
    "AlexNet, ResNet-50 and ResNet-20 and the planned AlexNet layout compiled on 8 simulated "
    "devices (192 s on 8 and 64 before 2026-12-07)",
    "test_plan_layout.py::test_the_planned_layout_steps_as_one_device": (
        "JAX tool runs of a planned layout against one device (46 s)"
    ),
    "test_train_adaptive.py::test_on_jax_it_decides_by_the_rule_and_a_stopped_run_resumes_"
    "alike": "one JAX process of the simple CNN, --adaptive_batch's run and the same run "
    "stopped at its rebuild and rerun; the step at each batch compiled (38 s at load 7, "
    "2026-12-07, of which 19 s the process's CPU)",
    "test_train_cluster.py::test_a_sigterm_then_a_killed_worker_and_the_reruns_end_as_the_"
    "uninterrupted_run": f"four 2-worker TensorFlow runs of the simple CNN, {_RESUMES} (100 s "
    "with AlexNet)",
    "test_train_adaptive.py::test_killed_at_a_decision_and_stopped_by_sigterm_at_its_rebuild_"
    "it_resumes_alike": f"a tool process killed at its first --adaptive_batch decision, then "
    f"two reruns in this process, {_RESUMES} (22 s; 29 s on the oldest pair)",
    "test_train_cluster.py::test_an_adaptive_batch_on_two_workers_decides_and_trains_as_one_"
    "device": "--adaptive_batch on 2 real TensorFlow workers against one device with 2 "
    "micro-batches (20 s; 27 s on the oldest pair)",
    "test_callbacks.py::test_callback_on_the_jax_backend": (
        "a JAX process fitting with the callbacks (8 s; 24 s on the oldest pair, jax 0.5.3)"
    ),
    "test_elastic_resume.py::test_two_workers_with_a_batch_change_equal_one_process": (
        "the `runs` fixture: 2-worker and 1-process runs of ResNet-20, with and without "
        "--sync_batch_norm, at once (198 s at load 9 to 14, 2026-12-07, where ResNet-18's "
        "took 355 s)"
    ),
    "test_elastic_resume.py::test_a_synced_run_resumes_exactly_on_the_other_layout"
    "[2_workers_to_1]": "the `reruns` fixture: each run of ResNet-20 resumed or refused on the "
    "other worker count, at once (101 s at load 9 to 14, 2026-12-07, where ResNet-18's took "
    "164 s)",
    "test_launchers.py::test_slurm_tasks_become_workers_at_ports_of_the_job": (
        "the `tf_runs` fixture: 2-worker runs of ResNet-20 through SLURM's and a chief's "
        "environment, and in bfloat16 all-reduce (273 s at load 9 to 14, 2026-12-07, where "
        "ResNet-18's took 287 s: at 16 px the two cost about the same compute)"
    ),
    "test_launchers.py::test_jax_slurm_processes_step_as_one_device": (
        "2 JAX processes through SLURM's environment against one, the simple CNN (54 s with "
        "ResNet-18)"
    ),
    "test_distribute.py::test_two_workers_match_single_process_on_the_global_batches": (
        "the `two_worker_training` fixture: MultiWorkerMirroredStrategy in 2 processes, then "
        "each workaround's symptom (23 s without those; they were a test of 14 s)"
    ),
    "test_distribute.py::test_killed_worker_restarts_from_backup_and_ends_like_uninterrupted_"
    "run": f"2 worker processes, {_RESUMES} (22 s)",
    "test_train_runs.py::test_bad_input_is_one_line_naming_the_flag_or_file": (
        "two console-script processes refused beside the `finished_run` fixture's run (22 s)"
    ),
    "test_train_loop.py::test_divergence_rollback_lowers_the_rate_and_a_resume_keeps_it": (
        "the tool's main trains the simple CNN on every digit until it diverges, rolls back "
        "and resumes (28 s)"
    ),
    "test_train_loop.py::test_a_failed_checkpoint_write_is_one_line_and_leaves_no_file": (
        "a tool process under a file-size limit (23 s)"
    ),
    "test_train_runs.py::test_each_model_family_trains_on_generated_tfrecords": (
        "every model family through the tool's main on records, ResNet-20 to its accuracy "
        "(64 s when each ran in its own process)"
    ),
    "test_train_resume.py::test_sighup_then_a_kill_and_the_reruns_end_as_an_uninterrupted_"
    "run": f"{_RESUMES}: four AlexNet-BN runs in two --batch_schedule phases (was four "
    "tests, 46, 37, 58 and 10 s)",
    "test_train_accumulation.py::test_a_stop_inside_an_epoch_resumes_at_an_update_and_ends_as_"
    "the_uninterrupted_run": f"{_RESUMES}, with micro-batches (42 s at 6 epochs of 16x16)",
    "test_train_accumulation.py::test_on_the_jax_backend_too": (
        "the tool on JAX with micro-batches, in its own process (24 s)"
    ),
    "test_train_flags.py::test_two_replicas_train_and_evaluate_padded_batches": (
        "a tool run on two replicas, AlexNet-BN on records (28 s at 32x32, now 16x16)"
    ),
    "test_signals.py::test_sigterm_to_the_study_stops_its_running_cell_naming_it_and_a_rerun_"
    "resumes_it": "the study in three processes, signalled twice and rerun (45 s with ResNet-18)",
    "test_batch_study.py::test_tiny_sweep_writes_tables_and_plot_and_reuses_finished_cells": (
        "the `sweep` fixture: a tiny study's six cells (grid and batch control), each a "
        "training run (were 37 s and 35 s in two studies)"
    ),
    "test_batch_study_target.py::test_a_tiny_target_study_end_to_end_and_its_resume": (
        "a tiny steps-to-target study, its eight trials training runs, then its resume (68 s "
        "with seventeen)"
    ),
    "test_batch_study_quasi.py::test_a_tiny_quasi_random_study_trains_end_to_end": (
        "a tiny quasi-random study with its noise measurement (19 s)"
    ),
    # Over 20 s on the oldest pair only (`nox -s oldest_ci`, 2026-12-07; newest in brackets):
    "test_flags_first.py::test_the_backend_read_without_keras_is_keras_s": (
        "a script's process per environment (60 s; 14 s)"
    ),
    "test_batch_schedule.py::test_fit_uses_the_closed_form_rate_at_every_step[*]": (
        "fits step by step, its first case tracing slowly on TensorFlow 2.17 (58 s; under 5 s)"
    ),
    "test_mirrored_steps.py::test_each_mirrored_strategy_workaround_is_needed": (
        "a child process without each workaround (38 s; 14 s)"
    ),
    "test_jax_distribution.py::test_distributed_training_equals_one_device[data_parallel_8-*]": (
        "the `results` fixture: JAX processes on 8 simulated devices (30 s; 13 s)"
    ),
    "test_quiet.py::test_a_program_shows_our_lines_only_unless_the_user_set_the_log_level": (
        "programs started at each log level (29 s; 14 s)"
    ),
    "test_cluster_resolution.py::test_the_tool_outside_srun_says_what_is_missing_and_writes_"
    "nothing": "the `bad_starts` fixture: a tool process per bad start, eight at once (were "
    "28 s and 21 s in two tests; 17 s and 9 s)",
    "test_benchmark_allreduce.py::test_two_real_workers_measure_every_size_form_and_dtype": (
        "the all-reduce benchmark in 2 worker processes (25 s; 12 s)"
    ),
    "test_noise_scale.py::test_replicas_of_two_workers_match_brute_force": (
        "2 worker processes against a per-example computation (23 s; 17 s)"
    ),
    "test_golden.py::test_jax_matches_upstream[*]": (
        "the `jax_trajectories` fixture: the upstream cases replayed on JAX (23 s; 7 s)"
    ),
    "test_train_runs.py::test_default_run_writes_checkpoints_logs_and_summary": (
        "the quick start's job cut to 2 epochs, in a process (27 s; 17 s)"
    ),
    "test_batch_schedule_tool.py::test_a_phased_run_feeds_each_batch_and_size_and_follows_the_"
    "closed_form": "a phased run through the tool, each phase traced anew (49 s; 14 s)",
    "test_bad_input.py::test_a_non_finite_gradient_entry_stays_in_its_place_as_in_float32"
    "[float16]": "a float16 run through the tool, slow to trace on TensorFlow 2.17 (33 s; "
    "under 5 s)",
    # Over 20 s on the oldest pair on a slower 2-core machine (oldest_ci, quiet, late 2026-12-07;
    # newest in brackets, the same machine):
    "test_train_jax.py::test_a_batch_schedule_runs_on_jax_at_the_closed_form_rate": (
        "a phased JAX tool process, each phase's step compiled (22 s; 18 s)"
    ),
    "test_flags_first.py::test_a_held_library_loads_on_its_first_public_name": (
        "a script's process (22 s; 6 s)"
    ),
    "test_flags_first.py::test_the_import_lines_are_read": "a script's process (21 s; 7 s)",
    "test_fashion_mnist.py::test_the_tool_refuses_a_bad_file_in_one_line": (
        "tool processes refusing bad files (21 s; 6 s)"
    ),
    "test_accumulation.py::test_accumulation_on_jax_steps_as_the_whole_batch": (
        "a JAX process stepping micro-batches and the whole batch (21 s; 8 s)"
    ),
}


# Modules that exercise no version-dependent path: no TensorFlow/Keras/JAX
# behaviour that differs between the supported pairs, no compat workaround, no
# JAX road, multi-worker or preemption code of their own. They carry the
# `version_independent` marker; CI's oldest-pair stage leaves them out (noxfile's
# `oldest_ci`: -m "not version_independent") to keep CI within 45 minutes,
# while `nox -s matrix` runs them on every pair. Why each is independent:
VERSION_INDEPENDENT = {
    "test_rendezvous.py": "the hello protocol is sockets and JSON before TensorFlow or JAX "
    "start; the real multi-worker runs of test_launchers, test_train_cluster and "
    "test_elastic_resume cross it on every pair",
    "test_disagreeing_processes.py": "the settings the hello carries and their comparison "
    "(Python), before TensorFlow or JAX start (split from test_rendezvous); the real "
    "multi-worker runs of test_launchers, test_train_cluster and test_elastic_resume cross "
    "it on every pair",
    "test_worker_start.py": "the hello protocol's foreign listeners and the tool's bound on "
    "its start (sockets, signals and a watchdog; split from test_rendezvous); the real "
    "multi-worker runs of test_launchers, test_train_cluster and test_elastic_resume start "
    "TensorFlow's and JAX's workers on every pair",
    "test_batch_study.py": "the study's cells, store, tables and plots over the training "
    "tool, whose paths the test_train_* modules and test_batch_schedule_tool run on every pair",
    "test_batch_study_target.py": "the steps-to-target search, fit and tables over the "
    "training tool, whose --target_accuracy path test_train_target runs on every pair",
    "test_plan.py": "the planner's arithmetic (Python and numpy)",
    "test_plan_device.py": "the planner's device model and memory arithmetic",
    "test_plan_pipeline.py": "the planner's pipeline arithmetic",
    "test_plan_records.py": "the planner's records and their sources",
    "test_plan_schedule.py": "the planner's phased-plan arithmetic",
    "test_plan_untrusted.py": "the planner's reading of untrusted files (Python's json and os)",
    "test_docs.py": "the docs' links, examples and generated pages",
    "test_site.py": "the API reference's pages against __all__ (source read, not run)",
    "test_import_graph.py": "the import graph of the sources, read, not imported",
    "test_doc_examples.py": "README's and the guides' examples, checked once; each "
    "behaviour they show has its own test on every pair",
    "test_tiers.py": "the test tiers' own machinery",
    "test_timing.py": "the durations report's arithmetic (tests/timing.py, Python)",
}


# Tests that CI's oldest-pair stage also leaves out (marker `newest_only_in_ci`)
# because CI, with both suites, ran past 50 minutes (and past 90 on 2026-12-02):
# single-process runs whose version-dependent parts other tests run there. None
# is a compat, JAX, multi-worker or preemption test (test_tiers checks the names);
# `nox -s matrix` runs them on every pair.
_SETTINGS_RECORD = (
    "the record of a run's settings in its checkpoints' JSON (the tool's own bookkeeping, "
    "one short run shared by three tests); the oldest pair resumes checkpoints in "
    "test_train_resume's kill and SIGTERM reruns and refuses other settings in "
    "test_train_checkpoints' leftovers test"
)
_LAUNCHES = (
    "one of test_train_loop's tests (divergence, its rollbacks, throughput: runs of the "
    "tool's main in this process; a failed checkpoint write and --help: processes), the "
    "tool's bookkeeping over Keras's fit and weights files, whose version-dependent parts the "
    "oldest pair runs in test_train_resume's SIGTERM and kill reruns (checkpoints written, "
    "read and resumed) and test_callbacks (Keras's callbacks); ~250 s of the oldest stage on "
    "2026-12-04, as six processes"
)
NEWEST_ONLY_IN_CI = {
    "test_train_loop.py::test_divergence_stops_with_one_error_line_and_checkpoints_nothing": (
        _LAUNCHES
    ),
    "test_train_loop.py::test_divergence_rollback_lowers_the_rate_and_a_resume_keeps_it": _LAUNCHES,
    "test_train_loop.py::test_divergence_after_the_last_rollback_is_an_error": _LAUNCHES,
    "test_train_loop.py::test_a_failed_checkpoint_write_is_one_line_and_leaves_no_file": _LAUNCHES,
    "test_train_loop.py::test_images_per_second_with_one_execution_per_epoch": _LAUNCHES,
    "test_train_loop.py::test_help_lists_every_setting": _LAUNCHES,
    "test_bad_input.py::test_a_deleted_config_json_still_refuses_other_settings_naming_them": (
        _SETTINGS_RECORD
    ),
    "test_bad_input.py::test_a_resumable_change_without_config_json_resumes_and_writes_it_again": (
        _SETTINGS_RECORD
    ),
    "test_bad_input.py::test_a_checkpoint_without_the_record_resumes_as_before_saying_so": (
        _SETTINGS_RECORD
    ),
    "test_bad_input.py::test_a_resumed_run_reports_its_own_throughput_not_the_checkpoints": "the "
    "throughput bookkeeping of a resumed run (Python over the epochs' history); resuming runs "
    "on the oldest pair in test_train_resume's kill and SIGTERM reruns",
    "test_train_runs.py::test_default_run_writes_checkpoints_logs_and_summary": "the quick "
    "start's job cut to 2 of its 15 epochs (the wheel stage runs it again from the built "
    "wheel); the oldest pair trains the same code in test_train_checkpoints' short run",
    "test_train_runs.py::test_bad_input_is_one_line_naming_the_flag_or_file": "two tool "
    "starts (absl's parser, the TPU cluster's start) into the quick start's finished run; the "
    "oldest pair checks every other case's exit status and line through the tool's main in "
    "this process (test_each_bad_input_is_an_error_naming_the_flag_or_file), and real tool "
    "processes' one error line in test_fashion_mnist, test_cluster_resolution and "
    "test_elastic_resume",
    "test_train_runs.py::test_each_model_family_trains_on_generated_tfrecords": "every model "
    "builds on the oldest pair in test_models, and AlexNet-BN trains on records there in "
    "test_train_flags' two-replica run",
}


# With `-n 2 --dist loadgroup` (README's test command, noxfile's suite sessions)
# each module is one unit of work, as with loadfile, but for the tests that run
# several TensorFlow/JAX processes at once: the tests marked `multiworker`, and
# those of SEVERAL_PROCESSES (every test of a module named with None, else the
# tests that use one of the fixtures named), form one unit, "several_processes",
# so that two of them never run side by side. Side by side on 2 cores, 4 to 6
# processes passed their per-child limits (CI, 2026-12-02: the bfloat16 and
# elastic-resume runs). That unit is the longest of both CI stages, so it goes
# first, then the modules of LONGEST_MODULES, then the others, so that short
# units fill in at the end: collection puts the tests in that order, and xdist
# hands out the units in it (unordered_units turns off xdist's reordering of
# units by their number of tests, which queued the unit seventh and test_train
# third from last, leaving one worker idle for its ~15 minutes).
SEVERAL_PROCESSES = {
    "test_train_jax.py": {"runs"},  # 2-process runs, two at a time
    "test_elastic_resume.py": None,
    "test_launchers.py": None,
    "test_cluster_resolution.py": None,
}


# Test time outside the several-process unit, 2026-12-03 (s, `-n 2`): test_train
# 1,388 (since split: test_train_runs, _loop and _resume hold most of it, the
# tool's processes), test_batch_study 763, test_bad_input 460,
# test_batch_schedule_tool 306, test_plan_hlo 216, test_signals 171; the next,
# test_train_jax, 134.
LONGEST_MODULES = (
    "test_train_runs.py",
    "test_train_loop.py",
    "test_train_resume.py",
    "test_batch_study.py",
    "test_bad_input.py",
    "test_batch_schedule_tool.py",
    "test_plan_hlo.py",
    "test_signals.py",
)


def _order(item):
    """Where `item`'s unit of work goes in the queue (see SEVERAL_PROCESSES)."""
    unit = _work_unit(item)
    if unit == "several_processes":
        return -1
    return LONGEST_MODULES.index(unit) if unit in LONGEST_MODULES else len(LONGEST_MODULES)


def _work_unit(item):
    """The xdist group of `item` (see SEVERAL_PROCESSES)."""
    module = os.path.basename(str(item.fspath))
    several = item.get_closest_marker("multiworker") is not None
    if module in SEVERAL_PROCESSES:
        fixtures = SEVERAL_PROCESSES[module]
        several = several or fixtures is None or bool(fixtures & set(item.fixturenames))
    return "several_processes" if several else module


def unordered_units(config):
    """Under xdist's --dist loadgroup/loadscope, the units go out in collection
    order (see SEVERAL_PROCESSES)."""
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


def classify(items, requires_jax):
    """Marks `items` (pytest_collection_modifyitems's) with their tier, CI
    stage and xdist unit, and sorts them into the units' order. `requires_jax`:
    the skipif mark of the tests that need jax (on the JAX road)."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_work_unit(item)))
        smoke = SMOKE.get(os.path.basename(str(item.fspath)))
        independent = VERSION_INDEPENDENT.get(os.path.basename(str(item.fspath)))
        if independent:
            item.add_marker(pytest.mark.version_independent)
            item.user_properties.append(("version_independent", independent))
        newest_only = NEWEST_ONLY_IN_CI.get(f"{os.path.basename(str(item.fspath))}::{item.name}")
        if newest_only:
            item.add_marker(pytest.mark.newest_only_in_ci)
            item.user_properties.append(("newest_only_in_ci", newest_only))
        if _on_jax_road(item, requires_jax):  # noxfile.py's JAX road column reads it
            item.user_properties.append(("jax_road", "runs Keras's JAX backend"))
        why = _why_slow(item)
        if why:
            item.add_marker(pytest.mark.slow)
            item.user_properties.append(("slow", why))
            if why.startswith("starts a process") and not item.get_closest_marker("subprocess"):
                item.add_marker(pytest.mark.subprocess)
        elif smoke:
            item.add_marker(pytest.mark.smoke)
    items.sort(key=_order)  # stable: each unit's tests keep their order


def ungrouped(node_ids):
    """None where every node id ends in its xdist group (`id@group`, as
    xdist's loadgroup writes it; every test here has one), else one line.
    pytest 9.2 builds node ids from a structured id that xdist 3.8's
    loadgroup does not write (it sets the old `_nodeid`): no suffix, every
    test its own unit, and the several-process tests ran side by side
    (pytest-xdist#1386; setup.cfg's test extra keeps pytest below 9.2)."""
    for node_id in node_ids:
        if node_id.rfind("@") <= node_id.rfind("]"):  # xdist's own reading
            return (
                f"--dist loadgroup: {node_id} carries no @group: pytest-xdist "
                f"{importlib.metadata.version('pytest-xdist')} does not group tests on "
                f"pytest {pytest.__version__} (pytest-xdist#1386): install pytest<9.2"
            )
    return None


def _on_jax_road(item, requires_jax):
    """Whether `item` runs Keras's JAX backend: it needs jax (requires_jax) or
    its id names jax (the benchmarks' and JAX tests' cases)."""
    needs_jax = any(mark.kwargs == requires_jax.kwargs for mark in item.iter_markers("skipif"))
    return needs_jax or "jax" in item.nodeid.lower()


_INHERITED = object()


class ProcessInFastTest(RuntimeError):
    """Raised by a process-starting call in a test not marked slow."""


class _Guard:
    """While installed: starting a process raises ProcessInFastTest, and the
    training through Model.fit and train_on_batch is counted."""

    def __init__(self, item):
        self.item = item
        self.started = []
        self.steps = self.work = 0
        self.undo = []

    def _patch(self, owner, name, replacement):
        self.undo.append((owner, name, vars(owner).get(name, _INHERITED)))
        setattr(owner, name, replacement)

    def _refuse(self, what):
        def refuse(*args, **kwargs):
            self.started.append(what)
            raise ProcessInFastTest(self.problems()[0])

        return refuse

    def _count(self, model, steps):
        if steps > 0:
            self.steps += steps
            self.work += steps * _parameters(model)

    def install(self):
        self._patch(subprocess.Popen, "_execute_child", self._refuse("subprocess.Popen"))
        self._patch(multiprocessing.process.BaseProcess, "start", self._refuse("multiprocessing"))
        for name in _OS_STARTERS:
            if hasattr(os, name):
                self._patch(os, name, self._refuse(f"os.{name}"))
        import keras

        fit, train_on_batch = keras.Model.fit, keras.Model.train_on_batch
        count = self._count

        def counted_fit(model, *args, **kwargs):
            before = _iterations(model)
            try:
                return fit(model, *args, **kwargs)
            finally:
                count(model, _iterations(model) - before)

        def counted_train_on_batch(model, *args, **kwargs):
            try:
                return train_on_batch(model, *args, **kwargs)
            finally:
                count(model, 1)

        self._patch(keras.Model, "fit", counted_fit)
        self._patch(keras.Model, "train_on_batch", counted_train_on_batch)

    def uninstall(self):
        while self.undo:
            owner, name, value = self.undo.pop()
            if value is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, value)

    def problems(self):
        found = []
        node = self.item.nodeid
        if self.started:
            found.append(
                f"{node} starts a process ({self.started[0]}) but is not marked slow: it must be "
                "marked slow. tests/tiers.py marks a test slow when its code, its fixtures or "
                "the tests/ helpers they use reach a process-starting call: add the library "
                "function that started it to _LIBRARY_STARTERS there."
            )
        if self.work > FAST_WORK:
            found.append(
                f"{node} trains {self.steps} steps, {self.work:.2g} parameter-steps "
                f"(> FAST_WORK={FAST_WORK:.2g}), but is not marked slow: it must be marked slow "
                "(add the library function that trains to _LIBRARY_TRAINING in "
                "tests/tiers.py) or train fewer steps."
            )
        return found


@functools.cache
def _reaches():
    """(what starts a process, what trains a whole run), as _Reach. The guard
    is not test code: a test that checks it does not start a process."""
    training = _Reach(_library(_LIBRARY_TRAINING), opaque=_library(_SHORT_TRAINING))
    return _Reach(process_starters(), opaque=[_Guard]), training


def _iterations(model):
    import keras

    try:
        return int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    except Exception:  # not compiled, or not readable here: nothing counted
        return 0


def _parameters(model):
    try:
        return model.count_params()
    except Exception:  # not built
        return 0


_GUARD = pytest.StashKey()


def guarded(item):
    """Runs a test phase under the guard unless the test is slow."""
    if item.get_closest_marker("slow"):
        return (yield)
    guard = item.stash.setdefault(_GUARD, _Guard(item))
    guard.install()
    try:
        result = yield
    except Exception:
        if not guard.problems():
            raise
        result = None  # replaced by the guard's failure, which says why
    finally:
        guard.uninstall()
    problems = guard.problems()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    return result
