"""keras-lars-plan's command line: the flags (config.PlanSettings's), then
the report (report.py), the records table (records_table.py), time to
accuracy (time_to_accuracy.py, with an adaptive run: adaptive_plan.py) or
--layout_out's file; `run` is the console script. The flags are parsed and
checked before the planner's models are imported and before Keras loads: a
bad flag or value is one line."""

import os
import sys

from absl import app
from absl import flags

from keras_lars import _quiet
from keras_lars.tools import settings
from keras_lars.tools.plan.config import PlanSettings
from keras_lars.tools.settings import ConfigError


def main(argv):
    """run_options on the parsed flags."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    run_options(settings.options_from_flags(PlanSettings), _given())


def run_options(options, given=frozenset()):
    """report_text (and --layout_out's file and lines); with --records, the
    records table only. `given`: the flags on the command line."""
    _quiet.release()  # the flags are good: Keras, TensorFlow, JAX load now
    if options.records:
        from keras_lars.tools.plan.records_table import records_text

        print(records_text())
        return
    from keras_lars.tools.plan import adaptive_plan
    from keras_lars.tools.plan import time_to_accuracy
    from keras_lars.tools.plan.report import duration
    from keras_lars.tools.plan.report import report_text

    # --target_study, --target_s_min or --target_noise_scale: time to accuracy instead
    # (with --adaptive_batch: and an adaptive run's)
    accuracy_report = (
        adaptive_plan.report if options.adaptive_batch != "off" else time_to_accuracy.report
    )
    try:
        accuracy = accuracy_report(options, duration, given)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    if accuracy:
        print(accuracy)
        return
    for line in options.memory_warnings():
        print(line, file=sys.stderr)
    layout_lines = None
    if options.layout_out:  # before the report: a layout that cannot be made is one line
        try:
            layout_lines = layout_out_text(options)
        except ConfigError as error:
            sys.exit(f"error: {error}")
    print(report_text(options))
    if layout_lines:
        print()
        print(layout_lines)


def _given():
    """The names of the flags on the command line (none where the flags were
    not parsed: main called with settings made in code)."""
    try:
        return frozenset(settings.from_flags(PlanSettings)[1] if flags.FLAGS.is_parsed() else ())
    except (KeyError, AttributeError):  # parsed by another program, without the planner's flags
        return frozenset()


def layout_out_text(options):
    """Writes --layout_out's file; its lines: the mesh, the split layers,
    bytes and step against pure data parallelism."""
    from keras_lars.models import BUILDERS
    from keras_lars.tools import layout_file
    from keras_lars.tools.plan.cost_models import GB
    from keras_lars.tools.plan.hybrid import hybrid_plan

    if options.model not in BUILDERS:
        raise ConfigError(f"--layout_out needs a keras_lars.models --model, not {options.model}.")
    _check_writable(options.layout_out)
    plan = hybrid_plan(
        options.model,
        options.image_size,
        options.profile(),
        options.batch,
        options.devices,
        options.device_model(),
        options.run().step.communication,
        options.overlap,
    )
    if plan is None:
        raise ConfigError(
            f"--layout_out={options.layout_out}: no layer of --model={options.model} moves "
            f"fewer bytes model-parallel at batch {options.batch:,} on {options.devices} devices "
            "(or no model axis divides them); nothing written."
        )
    try:
        layout_file.write(options.layout_out, plan.mesh, plan.layouts)
    except OSError as error:
        raise ConfigError(
            f"--layout_out={options.layout_out}: cannot write it: {error.strerror or error}."
        ) from None
    split = ", ".join(p.split("/")[0] for p in plan.layouts if not p.endswith("/output"))
    return "\n".join(
        [
            f"hybrid layout -> {options.layout_out}: mesh batch {plan.mesh[0]} x model "
            f"{plan.mesh[1]}; model-parallel: {split}; the rest data-parallel",
            f"  bytes a device sends a step  {plan.bytes / 1e6:10.1f} MB  (data parallel "
            f"{plan.data_parallel_bytes / 1e6:.1f} MB)",
            f"  step, bytes at {plan.bandwidth / GB:.3g} GB/s     {plan.seconds * 1e3:7.1f} ms  "
            f"(data parallel {plan.data_parallel_seconds * 1e3:.1f} ms: the plan's step)",
        ]
    )


def _check_writable(path):
    """ConfigError naming --layout_out if `path` cannot be written (checked
    before the plan is computed)."""
    from keras_lars.tools import storage

    folder = os.path.dirname(path) or "."
    special = storage.special_file(path)
    if special:
        raise ConfigError(f"--layout_out={path}: it is {special}, not a file.")
    if not os.path.isdir(folder):
        raise ConfigError(f"--layout_out={path}: no folder {folder}.")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--layout_out={path}: cannot write in {folder}.")


def run(argv=None):
    """The keras-lars-plan entry point."""
    settings.define_flags(PlanSettings)
    app.run(main, argv, flags_parser=settings.parse_flags)
