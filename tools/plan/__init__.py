"""Time-to-train planner: step time, scaling efficiency and time to train of
data-parallel training, from the model, the device, the cluster and the
all-reduce algorithm.

    keras-lars-plan                                    # ResNet-50 on 64 V100s
    keras-lars-plan --devices=1024 --global_batch_size=32768 --algorithm=torus2d
    keras-lars-plan --model=alexnet --global_batch_size=1024 --layers
    keras-lars-plan --records        # published ImageNet records: published vs predicted
    keras-lars-plan --devices=128 --batch_schedule=0:4096,30:8192,60:16384 \
        --image_size_schedule=0:128,40:192,80:224     # a phased plan: one row a phase
    keras-lars-plan --target_study=STUDY_DIR --from_run=MODEL_DIR  # time to accuracy

(also `python -m keras_lars.tools.plan`; `--help` documents every input).
One step over p devices, b = B / p images each:

    step = (b + b_half) t_image / u + c_fixed + max(0, allreduce(n) - backward) + input stall

The modules, data flowing one way (cli -> time_to_accuracy, phases, pipeline
-> step -> device, cost_models; records and calibration are data):

    cost_models  the all-reduce alpha-beta models: ring, tree, halving_doubling,
                 hierarchical, torus2d (formulas and sources in their docstrings)
    device       the model's per-layer profile, its roofline, the device's speed,
                 the devices' published figures (DEVICES)
    calibration  published and measured per-device throughputs; u, b_half and
                 c_fixed fitted from them
    memory       what a device holds at its batch, and whether it fits
    phases       a run in phases (--batch_schedule, --image_size_schedule): each
                 phase the plain plan of its batch, image size and epochs, summed
    step         one step, the whole run, the per-layer data- vs model-parallel
                 bytes, the records' predictions (one u, or each device's
                 calibration), ranges and leave-one-out
    pipeline     GPipe estimates: stages, micro-batches, bubble, memory
    collectives  the bytes a (batch, model) layout's collectives move a step, as
                 XLA compiles the training tool's JAX step
    hybrid       the per-layer data/model-parallel choice and its mesh (--layout_out)
    layout_file  the layout file: written by --layout_out, read by keras-lars-train
    hlo          the bytes of the collectives in a compiled program's HLO text
    hlo_bytes    the planned bytes against the tool's compiled step (a script)
    records      published ImageNet / ResNet-50 times with their hardware (data)
    target_curve steps to a target accuracy against the batch, S(B) = S_min + E_min / B,
                 from a study's fit.json, S_min and B_crit, or a noise scale
    time_to_accuracy  a measured run's throughput scaling the step; time to
                 accuracy and device time over batch x devices, with accumulation
    target_flags the time-to-accuracy settings (cli.PlanSettings inherits them)
    cli          the flags, the text reports, `run` (the console script)

docs/planning.md has the equations, the records table and what could not be
verified. Importing this package has no side effects.
"""

from keras_lars.tools.plan.calibration import HERE
from keras_lars.tools.plan.calibration import THROUGHPUTS
from keras_lars.tools.plan.calibration import Calibration
from keras_lars.tools.plan.calibration import Throughput
from keras_lars.tools.plan.calibration import calibrate
from keras_lars.tools.plan.calibration import fit_line
from keras_lars.tools.plan.calibration import update_seconds
from keras_lars.tools.plan.cli import GRADIENT_DTYPES
from keras_lars.tools.plan.cli import MODELS
from keras_lars.tools.plan.cli import PlanSettings
from keras_lars.tools.plan.cli import duration
from keras_lars.tools.plan.cli import grid_text
from keras_lars.tools.plan.cli import layers_text
from keras_lars.tools.plan.cli import main
from keras_lars.tools.plan.cli import neighbourhood
from keras_lars.tools.plan.cli import phased_text
from keras_lars.tools.plan.cli import plan_text
from keras_lars.tools.plan.cli import records_markdown
from keras_lars.tools.plan.cli import records_text
from keras_lars.tools.plan.cli import report_text
from keras_lars.tools.plan.cli import run
from keras_lars.tools.plan.collectives import layout_bytes
from keras_lars.tools.plan.collectives import plan_layout
from keras_lars.tools.plan.cost_models import ALGORITHMS
from keras_lars.tools.plan.cost_models import GB
from keras_lars.tools.plan.cost_models import US
from keras_lars.tools.plan.cost_models import Cluster
from keras_lars.tools.plan.cost_models import allreduce_time
from keras_lars.tools.plan.cost_models import halving_doubling_allreduce
from keras_lars.tools.plan.cost_models import hierarchical_allreduce
from keras_lars.tools.plan.cost_models import ring_allreduce
from keras_lars.tools.plan.cost_models import torus2d_allreduce
from keras_lars.tools.plan.cost_models import torus_shape
from keras_lars.tools.plan.cost_models import tree_allreduce
from keras_lars.tools.plan.device import DEVICES
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.device import TRAINING_FLOPS_FACTOR
from keras_lars.tools.plan.device import Device
from keras_lars.tools.plan.device import DeviceSpec
from keras_lars.tools.plan.device import LayerProfile
from keras_lars.tools.plan.device import ModelProfile
from keras_lars.tools.plan.device import custom_profile
from keras_lars.tools.plan.device import model_profile
from keras_lars.tools.plan.device import moved_elements
from keras_lars.tools.plan.device import profile_keras_model
from keras_lars.tools.plan.hybrid import HybridPlan
from keras_lars.tools.plan.hybrid import hybrid_plan
from keras_lars.tools.plan.memory import RESERVE
from keras_lars.tools.plan.memory import MemoryEstimate
from keras_lars.tools.plan.memory import activation_elements
from keras_lars.tools.plan.memory import largest_batch
from keras_lars.tools.plan.memory import memory_estimate
from keras_lars.tools.plan.phases import PhasedPlan
from keras_lars.tools.plan.phases import PhasePlan
from keras_lars.tools.plan.phases import PhaseSpan
from keras_lars.tools.plan.phases import phase_spans
from keras_lars.tools.plan.pipeline import PipelinePlan
from keras_lars.tools.plan.pipeline import bubble_fraction
from keras_lars.tools.plan.pipeline import pipeline_candidates
from keras_lars.tools.plan.pipeline import pipeline_plan
from keras_lars.tools.plan.pipeline import split_stages
from keras_lars.tools.plan.records import CALIBRATED_UTILIZATION
from keras_lars.tools.plan.records import CALIBRATION_RECORD
from keras_lars.tools.plan.records import INPUTS
from keras_lars.tools.plan.records import PER_DEVICE
from keras_lars.tools.plan.records import RECORDS
from keras_lars.tools.plan.records import SCHEDULE_INPUTS
from keras_lars.tools.plan.records import TOLERANCE
from keras_lars.tools.plan.records import Record
from keras_lars.tools.plan.records import record
from keras_lars.tools.plan.step import BACKWARD_FRACTION
from keras_lars.tools.plan.step import LayerChoice
from keras_lars.tools.plan.step import LeaveOneOut
from keras_lars.tools.plan.step import RecordRange
from keras_lars.tools.plan.step import Run
from keras_lars.tools.plan.step import StepTime
from keras_lars.tools.plan.step import choices
from keras_lars.tools.plan.step import exposed_communication
from keras_lars.tools.plan.step import fit_utilization
from keras_lars.tools.plan.step import layer_choices
from keras_lars.tools.plan.step import leave_one_out
from keras_lars.tools.plan.step import plan_run
from keras_lars.tools.plan.step import predict_record
from keras_lars.tools.plan.step import recipe_epochs
from keras_lars.tools.plan.step import record_phases
from keras_lars.tools.plan.step import record_range
from keras_lars.tools.plan.step import records_rows
from keras_lars.tools.plan.step import step_time

__all__ = [
    "ALGORITHMS",
    "BACKWARD_FRACTION",
    "CALIBRATED_UTILIZATION",
    "CALIBRATION_RECORD",
    "DEVICES",
    "DTYPE_BYTES",
    "GB",
    "GRADIENT_DTYPES",
    "HERE",
    "INPUTS",
    "MODELS",
    "PER_DEVICE",
    "RECORDS",
    "RESERVE",
    "SCHEDULE_INPUTS",
    "THROUGHPUTS",
    "TOLERANCE",
    "TRAINING_FLOPS_FACTOR",
    "US",
    "Calibration",
    "Cluster",
    "Device",
    "HybridPlan",
    "DeviceSpec",
    "LayerChoice",
    "LayerProfile",
    "LeaveOneOut",
    "MemoryEstimate",
    "ModelProfile",
    "PhasePlan",
    "PhaseSpan",
    "PhasedPlan",
    "PipelinePlan",
    "PlanSettings",
    "Record",
    "RecordRange",
    "Run",
    "StepTime",
    "Throughput",
    "activation_elements",
    "allreduce_time",
    "bubble_fraction",
    "calibrate",
    "choices",
    "custom_profile",
    "duration",
    "exposed_communication",
    "fit_line",
    "fit_utilization",
    "grid_text",
    "halving_doubling_allreduce",
    "hybrid_plan",
    "hierarchical_allreduce",
    "largest_batch",
    "layout_bytes",
    "layer_choices",
    "layers_text",
    "leave_one_out",
    "main",
    "memory_estimate",
    "model_profile",
    "moved_elements",
    "neighbourhood",
    "phase_spans",
    "phased_text",
    "pipeline_candidates",
    "pipeline_plan",
    "plan_layout",
    "plan_run",
    "plan_text",
    "predict_record",
    "profile_keras_model",
    "recipe_epochs",
    "record",
    "record_phases",
    "record_range",
    "records_markdown",
    "records_rows",
    "records_text",
    "report_text",
    "ring_allreduce",
    "run",
    "split_stages",
    "step_time",
    "torus2d_allreduce",
    "torus_shape",
    "tree_allreduce",
    "update_seconds",
]
