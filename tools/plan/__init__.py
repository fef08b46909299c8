"""Time-to-train planner: step time, scaling efficiency and time to train of
data-parallel training, from the model, the device, the cluster and the
all-reduce algorithm.

    keras-lars-plan                                    # ResNet-50 on 64 V100s
    keras-lars-plan --devices=1024 --global_batch_size=32768 --algorithm=torus2d
    keras-lars-plan --model=alexnet --global_batch_size=1024 --layers
    keras-lars-plan --records        # published ImageNet records: published vs predicted
    keras-lars-plan --devices=128 --batch_schedule=0:4096,30:8192,60:16384 \
        --image_size_schedule=0:128,40:192,80:224     # a phased plan: one row a phase
    keras-lars-plan --target_study=STUDY_DIR --from_run=RUN1,RUN2  # time to accuracy

(also `python -m keras_lars.tools.plan`; `--help` documents every input).
One step over p devices, b = B / p images each:

    step = (b + b_half) t_image / u + c_fixed + max(0, allreduce(n) - backward) + input stall

The modules, data flowing one way (cli -> config, report, records_table,
time_to_accuracy -> measured_step; config -> model_inputs -> phased_plan, step -> device,
cost_models; report -> pipeline_parallel, step; records and calibration are data):

    cost_models  the all-reduce alpha-beta models: ring, tree, halving_doubling,
                 hierarchical, torus2d (formulas and sources in their docstrings)
    device       the model's per-layer profile, its roofline, the device's speed,
                 the devices' published figures (DEVICES)
    calibration  published and measured per-device throughputs; u, b_half and
                 c_fixed fitted from them
    memory       what a device holds at its batch, and whether it fits
    phased_plan  a run in phases (--batch_schedule, --image_size_schedule): each
                 phase the plain plan of its batch, image size and epochs, summed
    step         one step, the whole run, the per-layer data- vs model-parallel
                 bytes, the records' predictions (one u, or each device's
                 calibration), ranges and leave-one-out
    pipeline_parallel  GPipe estimates: stages, micro-batches, bubble, memory
    collectives  the bytes a (batch, model) layout's collectives move a step, as
                 XLA compiles the training tool's JAX step
    hybrid       the per-layer data/model-parallel choice and its mesh (--layout_out)
    (tools/layout_file.py, beside both tools: the layout file --layout_out writes
                 and keras-lars-train --layout reads)
    hlo          the bytes of the collectives in a compiled program's HLO text
    hlo_bytes    the planned bytes against the tool's compiled step (a script)
    published    Record: a published run's inputs, their sources or assumed values,
                 the cluster and device model they make
    records      published ImageNet / ResNet-50 times with their hardware (a data table)
    target_curve steps to a target accuracy against the batch, S(B) = S_min + E_min / B,
                 from a study's fit.json, S_min and B_crit, or a noise scale
    measured_step  a step's device time from measured runs (--from_run) or a
                 study's own trials: the line fixed + per-image time
    time_to_accuracy  time to accuracy and device time over batch x devices: whose
                 model, whose step, the columns asked for, accumulation
    target_flags the time-to-accuracy settings (config.PlanSettings inherits them)
    config       PlanSettings: every flag declared once, checked on construction
    model_inputs what the settings mean to the models: device, profile, cluster,
                 run, phases (config.PlanSettings inherits them)
    report       the text reports: the plan, the phases, batch x devices, --layers
    records_table  the records against the predictions (--records, docs/planning.md)
    cli          the command line: flags first, then the report; `run` (the console script)

docs/planning.md has the equations, the records table and what could not be
verified. Importing this package has no side effects and imports none of
its modules: the names below load their module on first use.
"""

import importlib

_EXPORTS = {
    "calibration": (
        "HERE",
        "THROUGHPUTS",
        "Calibration",
        "Throughput",
        "calibrate",
        "fit_line",
        "update_seconds",
    ),
    "config": (
        "GRADIENT_DTYPES",
        "MODELS",
        "PlanSettings",
    ),
    "report": (
        "duration",
        "grid_text",
        "layers_text",
        "neighbourhood",
        "phased_text",
        "plan_text",
        "report_text",
    ),
    "cli": ("main",),
    "records_table": (
        "records_markdown",
        "records_text",
    ),
    "collectives": (
        "layout_bytes",
        "plan_layout",
    ),
    "cost_models": (
        "ALGORITHMS",
        "GB",
        "US",
        "Cluster",
        "allreduce_time",
        "halving_doubling_allreduce",
        "hierarchical_allreduce",
        "ring_allreduce",
        "torus2d_allreduce",
        "torus_shape",
        "tree_allreduce",
    ),
    "device": (
        "DEVICES",
        "DTYPE_BYTES",
        "TRAINING_FLOPS_FACTOR",
        "Device",
        "DeviceSpec",
        "LayerProfile",
        "ModelProfile",
        "custom_profile",
        "model_profile",
        "moved_elements",
        "profile_keras_model",
    ),
    "hybrid": (
        "HybridPlan",
        "hybrid_plan",
    ),
    "memory": (
        "RESERVE",
        "MemoryEstimate",
        "activation_elements",
        "largest_batch",
        "memory_estimate",
    ),
    "phased_plan": (
        "PhasedPlan",
        "PhasePlan",
        "PhaseSpan",
        "phase_spans",
    ),
    "pipeline_parallel": (
        "PipelinePlan",
        "bubble_fraction",
        "pipeline_candidates",
        "pipeline_plan",
        "split_stages",
    ),
    "published": ("INPUTS", "SCHEDULE_INPUTS", "PER_DEVICE", "Record"),
    "records": (
        "CALIBRATED_UTILIZATION",
        "CALIBRATION_RECORD",
        "RECORDS",
        "TOLERANCE",
        "record",
    ),
    "step": (
        "BACKWARD_FRACTION",
        "LayerChoice",
        "LeaveOneOut",
        "RecordRange",
        "Run",
        "StepTime",
        "choices",
        "exposed_communication",
        "fit_utilization",
        "layer_choices",
        "leave_one_out",
        "plan_run",
        "predict_record",
        "recipe_epochs",
        "record_phases",
        "record_range",
        "records_rows",
        "step_time",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF) + ["run"]


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)


def run(argv=None):
    """The keras-lars-plan entry point (cli.run)."""
    from keras_lars.tools.plan import cli

    cli.run(argv)
