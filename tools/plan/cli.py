"""keras-lars-plan: the flags (`PlanSettings`), the text reports and the
entry point `run`."""

import dataclasses
import os
import sys

from absl import app
from absl import flags

from keras_lars import BatchSchedule
from keras_lars.batch_schedule import parse_phases
from keras_lars.layerwise import ALLREDUCE_DTYPES
from keras_lars.models import BUILDERS
from keras_lars.models import takes_any_image_size
from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.tools import settings
from keras_lars.tools import storage
from keras_lars.tools.plan import layout_file
from keras_lars.tools.plan.calibration import calibrate
from keras_lars.tools.plan.cost_models import ALGORITHMS
from keras_lars.tools.plan.cost_models import GB
from keras_lars.tools.plan.cost_models import US
from keras_lars.tools.plan.cost_models import Cluster
from keras_lars.tools.plan.device import DEVICES
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.device import Device
from keras_lars.tools.plan.device import custom_profile
from keras_lars.tools.plan.device import model_profile
from keras_lars.tools.plan.hybrid import hybrid_plan
from keras_lars.tools.plan.memory import largest_batch
from keras_lars.tools.plan.memory import memory_estimate
from keras_lars.tools.plan.phases import PhasedPlan
from keras_lars.tools.plan.phases import PhasePlan
from keras_lars.tools.plan.phases import phase_spans
from keras_lars.tools.plan.pipeline import pipeline_candidates
from keras_lars.tools.plan.records import CALIBRATED_UTILIZATION
from keras_lars.tools.plan.records import CALIBRATION_RECORD
from keras_lars.tools.plan.records import PER_DEVICE
from keras_lars.tools.plan.records import RECORDS
from keras_lars.tools.plan.records import TOLERANCE
from keras_lars.tools.plan.step import layer_choices
from keras_lars.tools.plan.step import leave_one_out
from keras_lars.tools.plan.step import plan_run
from keras_lars.tools.plan.step import records_rows
from keras_lars.tools.plan.target_flags import TargetSettings
from keras_lars.tools.plan.time_to_accuracy import report as time_to_accuracy_report
from keras_lars.tools.schedule_flags import SETS
from keras_lars.tools.schedule_flags import first_phase_value
from keras_lars.tools.schedule_flags import phases_problem
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import greater_than
from keras_lars.tools.settings import setting

MODELS = (*BUILDERS, "custom")  # the reference models, or totals given by flags
DEFAULT_DEVICE = "V100-SXM2-16GB"
DEFAULT_PER_DEVICE_BATCH = 128  # or the largest power of two that fits, if smaller
GRADIENT_DTYPES = tuple(dtype for dtype in ALLREDUCE_DTYPES if dtype)  # keras_lars's all-reduce
MAX_IMAGE_SIZE = 2**16  # far beyond it Keras's shape arithmetic (floats) is not exact


def _image_size_problem(value, config):
    if value > MAX_IMAGE_SIZE:
        return f"must be <= {MAX_IMAGE_SIZE}"
    return at_least(7)(value, config)


IMAGE_SIZE_CHECK = _image_size_problem


# --- settings ----------------------------------------------------------------------------
def _all(*checks):
    """The first problem of `checks` (each fn(value, config)), or None."""
    return lambda value, config: next(
        (problem for problem in (check(value, config) for check in checks) if problem), None
    )


def _required_for_custom(value, config):
    if config.model == "custom" and not value:
        return "is required (> 0) with --model=custom"
    return None


def _divides_devices(value, config):
    if config.devices % value:
        return f"must divide --devices ({config.devices})"
    return None


def _torus_x(value, config):
    if not value:
        return None
    if config.algorithm != "torus2d":
        return "is only used with --algorithm=torus2d"
    if config.devices % value:
        return f"must divide --devices ({config.devices})"
    if config.devices_per_node > 1 and value != config.devices_per_node:
        return "must be --devices_per_node (or 0) when nodes hold several devices"
    return None


def _batch(value, config):
    if value and value < config.devices:
        return f"must be >= --devices ({config.devices}): at least one image a device"
    if value and value % config.devices:
        return (
            f"must be divisible by --devices ({config.devices}): a device takes whole images, "
            f"not {value / config.devices:.3g}"
        )
    return None


def _schedule_problem(value, config, schedule_flag):
    """--batch_schedule / --image_size_schedule: --epochs given,
    schedule_flags.phases_problem before --epochs, image sizes >= 7 and, with
    image sizes, a resnet model (global pooling takes any size)."""
    if value and not config.epochs:
        return "needs --epochs > 0 (0: the recipe's epochs, which are for one batch)"
    problem = phases_problem(value, config, schedule_flag, "epochs", IMAGE_SIZE_CHECK)
    resizing = value and schedule_flag == "image_size_schedule"
    if (
        not problem
        and resizing
        and not (config.model in BUILDERS and takes_any_image_size(config.model))
    ):
        return f"needs a resnet --model (global pooling takes any size), not {config.model}"
    return problem


def _one_batch(value, config):
    if value and any(getattr(config, name) for name in SETS):
        return "plans one batch and image size: not with --batch_schedule / --image_size_schedule"
    return None


def _from_device(value, config):
    return None if value >= 0 else "must be >= 0 (0: --device's)"


@dataclasses.dataclass(frozen=True)
class PlanSettings(TargetSettings):
    """The inputs of keras-lars-plan (defaults: ResNet-50, 64 V100s in nodes
    of 8, mixed precision, 128 images a device, 90 epochs); the time-to-accuracy
    ones: target_flags.TargetSettings."""

    model: str = setting(
        "resnet50",
        "Network: a keras_lars.models name (parameters, FLOPs and activations counted on "
        "its Keras definition) or custom (give --parameters and --forward_gflops).",
        choices=MODELS,
    )
    image_size: int = setting(224, "Training image side.", check=IMAGE_SIZE_CHECK)
    parameters: int = setting(
        0,
        "Trainable parameters of a custom model.",
        check=_all(at_least(0), _required_for_custom),
    )
    forward_gflops: float = setting(
        0.0,
        "Forward GFLOPs per image of a custom model (multiply-add = 2).",
        check=_all(at_least(0.0), _required_for_custom),
    )
    devices: int = setting(64, "Devices (data-parallel replicas).", check=at_least(1))
    devices_per_node: int = setting(
        8,
        "Devices per node (they share the node's network link).",
        check=_all(at_least(1), _divides_devices),
    )
    device: str = setting(
        DEFAULT_DEVICE,
        "The device: its peaks, memory bandwidth and memory (tools/plan/device.py, each "
        "with its source).",
        choices=tuple(DEVICES),
    )
    images_per_second: float = setting(
        0.0,
        "Measured training images/s of one device; 0: --peak_tflops x --utilization.",
        check=at_least(0.0),
    )
    peak_tflops: float = setting(
        0.0,
        "Peak TFLOP/s of one device at the arithmetic the run uses; 0: --device's at "
        "--activation_dtype.",
        check=_from_device,
    )
    memory_bandwidth: float = setting(
        0.0,
        "Device memory GB/s for the per-layer roofline; 0: --device's.",
        check=_from_device,
    )
    device_memory_gb: float = setting(
        0.0, "Memory of one device in GB; 0: --device's.", check=_from_device
    )
    utilization: float = setting(
        0.0,
        "Fraction of the roofline a device achieves; 0: fitted on --device's published "
        f"throughputs (tools/plan/calibration.py), else {CALIBRATED_UTILIZATION} (fitted "
        f"on {CALIBRATION_RECORD}).",
        check=lambda value, config: None if 0 <= value <= 2 else "must be in [0, 2] (0: fitted)",
    )
    fixed_step_ms: float = setting(
        -1.0,
        "Milliseconds every step pays whatever its batch; -1: the calibration's (the "
        "optimizer update's memory time).",
        check=at_least(-1.0),
    )
    half_batch: float = setting(
        -1.0,
        "Images a device at which it runs at half its speed; -1: the calibration's.",
        check=at_least(-1.0),
    )
    activation_dtype: str = setting(
        "float16", "Bytes of activations in device memory.", choices=tuple(DTYPE_BYTES)
    )
    input_images_per_second: float = setting(
        0.0,
        "Input-pipeline images/s per device; 0: never the bottleneck.",
        check=at_least(0.0),
    )
    intra_node_bandwidth: float = setting(
        50.0, "GB/s between two devices of a node.", check=greater_than(0.0)
    )
    intra_node_latency_us: float = setting(
        5.0, "Microseconds per message inside a node.", check=at_least(0.0)
    )
    inter_node_bandwidth: float = setting(
        12.5, "GB/s of one node's network link (100 Gb/s = 12.5).", check=greater_than(0.0)
    )
    inter_node_latency_us: float = setting(
        5.0, "Microseconds per message between nodes.", check=at_least(0.0)
    )
    algorithm: str = setting(
        "hierarchical", "All-reduce algorithm (see the module docstring).", choices=ALGORITHMS
    )
    torus_x: int = setting(
        0,
        "Width of the 2D-torus grid; 0: devices per node, or the squarest grid.",
        check=_torus_x,
    )
    gradient_dtype: str = setting(
        "float32", "Bytes per gradient element in the all-reduce.", choices=GRADIENT_DTYPES
    )
    overlap: bool = setting(True, "All-reduce overlaps the backward pass.")
    global_batch_size: int = setting(
        0,
        f"Images per step over all devices; 0: {DEFAULT_PER_DEVICE_BATCH} a device (fewer if "
        "they do not fit its memory).",
        check=_batch,
    )
    epochs: float = setting(
        90.0,
        "Epochs to train (90: the budget of the published records); 0: "
        "keras_lars.resnet50_lars_recipe's for the batch (56, 64 or 92).",
        check=at_least(0.0),
    )
    examples: int = setting(
        IMAGENET_TRAIN_EXAMPLES, "Training examples in one epoch.", check=at_least(1)
    )
    batch_schedule: str = setting(
        "",
        "The global batch by epoch, as keras-lars-train's: phases epoch:global batch, e.g. "
        "0:4096,30:8192 (the first at epoch 0, all before --epochs, each batch a multiple of "
        "--devices); each phase is planned at its batch and the times summed "
        "(tools/plan/phases.py). Empty: the constant --global_batch_size.",
        check=lambda value, config: _schedule_problem(value, config, "batch_schedule"),
    )
    image_size_schedule: str = setting(
        "",
        "Progressive resizing, as keras-lars-train's: phases epoch:image side, e.g. "
        "0:128,40:192,80:224 (resnet models); each phase's compute and activations at its "
        "size. Empty: the constant --image_size.",
        check=lambda value, config: _schedule_problem(value, config, "image_size_schedule"),
    )
    layers: bool = setting(
        False,
        "Print the per-layer data- vs model-parallel report and the pipeline estimate.",
        check=_one_batch,
    )
    records: bool = setting(False, "Print the published records against the predictions.")
    layout_out: str = setting(
        "",
        "Write the hybrid layout (the layers cheaper model-parallel split over a (batch, "
        "model) mesh, the rest data-parallel; tools/plan/hybrid.py) to this JSON file, for "
        "keras-lars-train --backend=jax --distribution=model_parallel --layout.",
        check=_one_batch,
    )

    def __post_init__(self):
        defaults = type(self).__dataclass_fields__
        for schedule, flag in SETS.items():  # at its default, the first phase's value
            value = getattr(self, flag)
            value = first_phase_value(getattr(self, schedule), value, defaults[flag].default)
            object.__setattr__(self, flag, value)
        settings.check(self)
        if not self.global_batch_size and not self.default_per_device_batch():
            raise ConfigError(
                f"--device={self.device}: not one image of --model={self.model} fits its "
                f"{self.capacity() / 1e9:.1f} GB (--device_memory_gb)."
            )
        if self.schedule_flags():
            self._check_phases()
            return
        if self.global_batch_size > self.examples:
            raise ConfigError(
                f"--global_batch_size={self.global_batch_size}: must be <= --examples "
                f"({self.examples})."
            )

    def memory_warnings(self):
        """One `warning:` line for the batch, or each phase, that the memory
        estimate puts above a device: the estimate keeps every layer's output
        (an upper bound: it puts NVIDIA's 208 ResNet-50 images on a 16 GB
        V100, its own calibration, at 16.7 GB), so it warns and plans on."""
        if self.schedule_flags():
            flags_given = self.schedule_flags()
            found = [
                (f"{flags_given}: phase {number} ({span_text(span)})", span.global_batch, span)
                for number, span in enumerate(self.phase_spans(), 1)
            ]
        elif self.global_batch_size:
            found = [(f"--global_batch_size={self.global_batch_size}", self.batch, None)]
        else:
            return []
        lines = []
        for name, batch, span in found:
            memory = self.memory(batch, image_size=span.image_size if span else None)
            if memory.verdict == "does not fit":
                lines.append(
                    f"warning: {name}: {_does_not_fit(memory, batch // self.devices)}; the "
                    "estimate keeps every layer's output (an upper bound), so the plan goes on: "
                    "lower the batch or raise --devices if the run does not fit."
                )
        return lines

    def _check_phases(self):
        """A ConfigError naming the schedule flags and the phase whose batch
        --examples do not hold or --devices do not divide (memory: a warning,
        memory_warnings)."""
        flags = self.schedule_flags()
        try:
            self.schedule().steps_per_epoch(self.examples)
        except ValueError as error:
            raise ConfigError(f"{flags}: {error}") from None
        for number, span in enumerate(self.phase_spans(), 1):
            phase = f"{flags}: phase {number} ({span_text(span)})"
            if span.global_batch % self.devices:
                raise ConfigError(
                    f"{phase}: the global batch is not divisible by --devices ({self.devices})."
                )

    # --- the device and its calibration
    def spec(self):
        return DEVICES[self.device]

    def capacity(self):
        return self.device_memory_gb * GB if self.device_memory_gb else self.spec().memory_bytes

    def calibration(self):
        """calibration.calibrate for --device at --activation_dtype (None:
        no published throughput)."""
        return calibrate(self.spec(), self.activation_dtype, model_profile("resnet50"))

    def device_settings(self):
        """(utilization, half batch, fixed seconds, where they come from)."""
        calibrated = self.calibration()
        if calibrated:
            source = (
                f"fitted on {len(calibrated.points)} published ResNet-50 throughput"
                f"{'s' if len(calibrated.points) > 1 else ''} of a {self.device} in "
                f"{self.activation_dtype}"
            )
            values = calibrated.utilization, calibrated.half_batch, calibrated.fixed_step_seconds
        else:
            source = (
                f"no published throughput of a {self.device} in {self.activation_dtype}: "
                f"{CALIBRATED_UTILIZATION}, fitted on {CALIBRATION_RECORD}'s FP32 P100s"
            )
            values = CALIBRATED_UTILIZATION, 0.0, 0.0
        utilization = self.utilization or values[0]
        half = values[1] if self.half_batch < 0 else self.half_batch
        fixed = values[2] if self.fixed_step_ms < 0 else self.fixed_step_ms / 1e3
        if self.utilization:
            source = "given"
        return utilization, half, fixed, source

    def profile(self, image_size=None):
        if self.model == "custom":
            return custom_profile(self.parameters, self.forward_gflops * 1e9)
        return model_profile(self.model, image_size or self.image_size)

    def device_model(self):
        utilization, half, fixed, _ = self.device_settings()
        spec = self.spec()
        peak = self.peak_tflops * 1e12 or spec.peak(self.activation_dtype)
        return Device(
            peak_flops=peak,
            utilization=utilization,
            memory_bandwidth=self.memory_bandwidth * GB or spec.memory_bandwidth,
            activation_bytes=DTYPE_BYTES[self.activation_dtype],
            images_per_second=self.images_per_second,
            input_images_per_second=self.input_images_per_second,
            half_batch=0.0 if self.images_per_second else half,
            fixed_step_seconds=0.0 if self.images_per_second else fixed,
        )

    # --- the batch and memory
    def default_per_device_batch(self):
        """DEFAULT_PER_DEVICE_BATCH, or the largest power of two that fits."""
        fits = largest_batch(self.profile(), DTYPE_BYTES[self.activation_dtype], self.capacity())
        per_device = DEFAULT_PER_DEVICE_BATCH
        while per_device > fits:
            per_device //= 2
        return per_device

    @property
    def batch(self):
        """--global_batch_size, or its default."""
        return self.global_batch_size or self.devices * self.default_per_device_batch()

    def memory(self, global_batch=None, devices=None, image_size=None):
        """memory.MemoryEstimate of one device."""
        per_device = (global_batch or self.batch) / (devices or self.devices)
        return memory_estimate(
            self.profile(image_size),
            per_device,
            DTYPE_BYTES[self.activation_dtype],
            self.capacity(),
        )

    def cluster(self, devices=None):
        devices = devices or self.devices
        return Cluster(
            devices,
            min(self.devices_per_node, devices),
            self.intra_node_bandwidth * GB,
            self.intra_node_latency_us * US,
            self.inter_node_bandwidth * GB,
            self.inter_node_latency_us * US,
            self.algorithm,
            self.torus_x if devices == self.devices else 0,
        )

    def run(self, global_batch=None, devices=None):
        return plan_run(
            self.profile(),
            global_batch or self.batch,
            self.epochs,
            self.device_model(),
            self.cluster(devices),
            DTYPE_BYTES[self.gradient_dtype],
            self.overlap,
            self.examples,
        )

    # --- the schedule
    def schedule_flags(self):
        """The schedule flags given, as they read ('' if none)."""
        given = [name for name in SETS if getattr(self, name)]
        return " ".join(f"--{name}={getattr(self, name)}" for name in given)

    def schedule(self):
        """keras_lars.BatchSchedule of --batch_schedule and
        --image_size_schedule (None: neither)."""
        if not self.schedule_flags():
            return None
        return BatchSchedule.parse(
            self.batch_schedule or f"0:{self.batch}", self.image_size_schedule or None
        )

    def phase_spans(self):
        return phase_spans(self.schedule(), self.epochs, self.image_size)

    def phase_settings(self, span):
        """The plain settings of one phase: its batch, image size and epochs."""
        return dataclasses.replace(
            self,
            global_batch_size=span.global_batch,
            image_size=span.image_size,
            epochs=float(span.epochs),
            batch_schedule="",
            image_size_schedule="",
        )

    def phased_plan(self):
        """phases.PhasedPlan: each phase the plain plan of its settings."""
        plans = []
        for span in self.phase_spans():
            options = self.phase_settings(span)
            plans.append(PhasePlan(span, options.run(), options.memory()))
        return PhasedPlan(tuple(plans))


def _does_not_fit(memory, per_device):
    return (
        f"{per_device:g} images a device need {memory.total / 1e9:.1f} GB by the memory "
        f"estimate, more than the {memory.capacity / 1e9:.1f} GB of --device_memory_gb / --device"
    )


# --- output ---------------------------------------------------------------------------------
def duration(seconds):
    """'250 ms', '4.2 s', '42 s', '12.5 min', '3.2 h' or '4.1 d'."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _ms(seconds):
    return f"{seconds * 1e3:9.1f} ms"


def assumptions_text(options):
    """The output's first lines: what the defaults assume, and the flag that
    changes each."""
    spec = options.spec()
    utilization, half, fixed, source = options.device_settings()
    peak = options.peak_tflops or spec.peak(options.activation_dtype) / 1e12
    bandwidth = options.memory_bandwidth or spec.memory_bandwidth / GB
    if options.images_per_second:
        speed = f"{options.images_per_second:g} images/s measured (--images_per_second)"
    else:
        speed = (
            f"utilization {utilization:.3g} of the roofline, {source} (--utilization); "
            f"{fixed * 1e3:.2g} ms fixed a step (--fixed_step_ms), half speed at "
            f"{half:,.1f} images (--half_batch)"
        )
    epochs = f"{options.epochs:g}" if options.epochs else "keras_lars.resnet50_lars_recipe's"
    return "\n".join(
        [
            "assumes",
            f"  device        {options.device}: {peak:g} TFLOP/s in {options.activation_dtype}, "
            f"{bandwidth:g} GB/s, {options.capacity() / 1e9:.1f} GB (--device, "
            "--activation_dtype)",
            f"  speed         {speed}",
            f"  epochs        {epochs} (--epochs)",
            f"  all-reduce    {options.algorithm}, "
            f"{'overlapping' if options.overlap else 'after'} the backward pass (--overlap)",
            *_batch_assumptions(options),
        ]
    )


def _batch_assumptions(options):
    """The batch line (and under a schedule, the image size line)."""
    source = "--global_batch_size" if options.global_batch_size else "the default"
    if not options.schedule_flags():
        per_device = options.batch / options.devices
        return [
            f"  batch         {options.batch:,} = {options.devices} x {per_device:g} ({source})"
        ]
    batches, sizes = [options.batch], [options.image_size]
    if options.batch_schedule:
        batches, source = [value for _, value in parse_phases(options.batch_schedule)], None
    if options.image_size_schedule:
        sizes = [value for _, value in parse_phases(options.image_size_schedule)]
    per_device = " -> ".join(f"{batch // options.devices}" for batch in batches)
    return [
        f"  batch         {' -> '.join(f'{batch:,}' for batch in batches)} = "
        f"{options.devices} x {per_device} ({source or '--batch_schedule'})",
        f"  image size    {' -> '.join(map(str, sizes))} "
        f"({'--image_size_schedule' if options.image_size_schedule else '--image_size'})",
    ]


def memory_text(memory):
    """One line: the bytes a device holds and the verdict."""
    parts = ", ".join(
        f"{name} {getattr(memory, name) / 1e9:.1f}"
        for name in ("weights", "gradients", "slots", "activations")
    )
    return (
        f"memory    {memory.total / 1e9:.1f} GB of {memory.capacity / 1e9:.1f} GB a device: "
        f"{memory.verdict} ({parts} GB)"
    )


def model_text(options, image_size=None):
    """One line: parameters, gradient bytes, forward FLOPs (at `image_size`:
    said so)."""
    profile = options.profile(image_size)
    gradient_bytes = profile.parameters * DTYPE_BYTES[options.gradient_dtype]
    return (
        f"model     {profile.name}: {profile.parameters:,} parameters "
        f"({gradient_bytes / 1e6:.1f} MB of {options.gradient_dtype} gradients), "
        f"{profile.forward_flops / 1e9:.2f} GFLOPs forward per image"
        + (f" at {image_size}" if image_size else "")
    )


def cluster_text(options):
    cluster = options.cluster()
    return (
        f"cluster   {options.devices} devices = {cluster.nodes} "
        f"node{'s' if cluster.nodes > 1 else ''} x {cluster.devices_per_node}, "
        f"{options.algorithm} all-reduce, overlap {'on' if options.overlap else 'off'}"
    )


def plan_text(options):
    """The report of one plan: assumptions, model, memory, step split,
    efficiency, time to train."""
    run = options.run()
    step = run.step
    per_device = options.batch / options.devices
    lines = [
        assumptions_text(options),
        model_text(options),
        cluster_text(options),
        memory_text(options.memory()),
        f"step      batch {options.batch:,} ({per_device:g} a device)",
        f"  compute               {_ms(step.compute)}",
        f"  fixed                 {_ms(step.fixed)}",
        f"  communication         {_ms(step.communication)}  "
        f"(exposed {step.exposed_communication * 1e3:.1f} ms)",
        f"  input stall           {_ms(step.input)}",
        f"  step                  {_ms(step.step)}",
        f"scaling efficiency      {step.efficiency:9.1%}  (one device at {per_device:g} "
        "images: 100%)",
        f"steps                   {run.steps:9,}  ({run.epochs:g} epochs of "
        f"{options.examples:,} examples)",
        f"time to train           {duration(run.seconds):>9}",
    ]
    return "\n".join(lines)


def span_text(span):
    """'epochs 30-60: global batch 8,192, image size 224'."""
    return (
        f"epochs {span.first_epoch}-{span.end_epoch:g}: global batch {span.global_batch:,}, "
        f"image size {span.image_size}"
    )


PHASE_HEADER = (
    f"{'phase':<6}{'epochs':>8}{'batch':>9}{'a device':>10}{'image':>7}{'steps':>8}"
    f"{'compute ms':>12}{'exposed ms':>12}{'step ms':>9}{'efficiency':>12}{'time':>11}  memory"
)


def phased_text(options):
    """The report of a run in phases (tools/plan/phases.py): assumptions,
    model, cluster, the all-reduce, one row a phase, the total."""
    plan = options.phased_plan()
    first = plan.phases[0].run.step
    sized = options.image_size if options.image_size_schedule else None
    lines = [
        assumptions_text(options),
        model_text(options, sized),
        cluster_text(options),
        f"all-reduce {first.communication * 1e3:.1f} ms a step in every phase (the same "
        "gradients); exposed ms: what the backward pass does not hide",
        PHASE_HEADER,
    ]
    for number, phase in enumerate(plan.phases, 1):
        span, step, memory = phase.span, phase.run.step, phase.memory
        lines.append(
            f"{number:>5} {f'{span.first_epoch}-{span.end_epoch:g}':>8}{span.global_batch:>9,}"
            f"{span.global_batch // options.devices:>10,}{span.image_size:>7}"
            f"{phase.run.steps:>8,}{step.compute * 1e3:>12.1f}"
            f"{step.exposed_communication * 1e3:>12.1f}{step.step * 1e3:>9.1f}"
            f"{step.efficiency:>12.1%}{duration(phase.run.seconds):>11}  "
            f"{memory.total / 1e9:.1f} GB {memory.verdict}"
        )
    lines += [
        f"{'total':<6}{f'0-{options.epochs:g}':>8}{'':>26}{plan.steps:>8,}{'':>45}"
        f"{duration(plan.seconds):>11}",
        f"time to train           {duration(plan.seconds):>9}  (the sum of the "
        f"{len(plan.phases)} phases)",
    ]
    return "\n".join(lines)


def report_text(options):
    """What keras-lars-plan prints (before --layout_out's lines): under a
    schedule the phased plan, else the plan, the batch x devices table and,
    with --layers, the per-layer report and the pipeline estimate."""
    if options.schedule_flags():
        return phased_text(options)
    parts = [plan_text(options), grid_text(options)]
    if options.layers:
        parts.append(layers_text(options))
    return "\n\n".join(parts)


def neighbourhood(value, factors=(0.25, 0.5, 1, 2, 4)):
    """`value` times each factor, rounded, at least 1."""
    return [max(1, round(value * f)) for f in factors]


def grid_text(options):
    """Time to train for batch x devices around the given point (epochs:
    --epochs, else the recipe's for each batch; '-' where a device would
    get less than one image, the devices do not divide the batch or do not
    fill whole nodes, 'mem'
    where a device's images do not fit its memory)."""
    batches = neighbourhood(options.batch)
    devices = neighbourhood(options.devices)
    epochs = f", {options.epochs:g} epochs" if options.epochs else ", the recipe's epochs"
    lines = [f"time to train, global batch (rows) x devices (columns){epochs}:"]
    lines.append(f"{'':>9}" + "".join(f"{d:>11,}" for d in devices))
    for batch in batches:
        cells = []
        for count in devices:
            nodes_ok = count % min(options.devices_per_node, count) == 0
            if batch < count or batch % count or batch > options.examples or not nodes_ok:
                cells.append(f"{'-':>11}")
            elif options.memory(batch, count).verdict == "does not fit":
                cells.append(f"{'mem':>11}")
            else:
                cells.append(f"{duration(options.run(batch, count).seconds):>11}")
        lines.append(f"{batch:>9,}" + "".join(cells))
    return "\n".join(lines)


def layers_text(options):
    """The per-layer report (bytes a step under data vs model parallelism)
    and the pipeline estimate."""
    profile = options.profile()
    choices = layer_choices(
        profile,
        options.batch,
        DTYPE_BYTES[options.gradient_dtype],
        DTYPE_BYTES[options.activation_dtype],
    )
    lines = [
        f"per layer, batch {options.batch:,}: data parallel = gradient "
        "all-reduce 2 P s_g; model parallel = activations in and their gradients back "
        "2 B I s_a (Krizhevsky 2014)",
        f"{'layer':<28}{'parameters':>12}{'data MB':>10}{'model MB':>11}"
        f"{'cheaper':>9}{'break-even batch':>18}",
    ]
    for c in choices:
        lines.append(
            f"{c.layer.name:<28}{c.layer.parameters:>12,}{c.data_parallel_bytes / 1e6:>10.1f}"
            f"{c.model_parallel_bytes / 1e6:>11.1f}{c.cheaper:>9}{c.break_even_batch:>18,.0f}"
        )
    return "\n".join(lines) + "\n\n" + pipeline_text(options)


def pipeline_text(options):
    """GPipe estimates against the data-parallel step, and the verdict."""
    data_parallel = options.run().step
    fits = options.memory().verdict != "does not fit"
    plans = pipeline_candidates(
        options.profile(),
        options.batch,
        options.device_model(),
        options.cluster(),
        {
            "gradient_bytes": DTYPE_BYTES[options.gradient_dtype],
            "overlap": options.overlap,
            "capacity": options.capacity(),
        },
    )
    lines = [
        "pipeline (GPipe, Huang et al. 2019): p stages x d replicas, m micro-batches, "
        "bubble (p-1)/(m+p-1)",
        f"{'stages':>7}{'replicas':>9}{'micro':>7}{'bubble':>8}{'step ms':>10}"
        f"{'memory GB':>11}  verdict",
        f"{'1':>7}{options.devices:>9}{'-':>7}{'-':>8}{data_parallel.step * 1e3:>10.1f}"
        f"{options.memory().total / 1e9:>11.1f}  data parallel, "
        f"{options.memory().verdict}",
    ]
    best = None
    for plan in plans:
        verdict = plan.memory.verdict
        lines.append(
            f"{plan.stages:>7}{plan.replicas:>9}{plan.micro_batches:>7}{plan.bubble:>8.1%}"
            f"{plan.step * 1e3:>10.1f}{plan.memory.total / 1e9:>11.1f}  {verdict}"
        )
        if verdict != "does not fit" and (best is None or plan.step < best.step):
            best = plan
    if best and (not fits or best.step < data_parallel.step):
        why = "data parallelism does not fit" if not fits else "faster"
        lines.append(
            f"a pipeline would beat data parallelism: {best.stages} stages x "
            f"{best.micro_batches} micro-batches ({why}: {best.step * 1e3:.1f} ms a step)"
        )
    else:
        lines.append(
            "data parallelism is the better layout here: no pipeline that fits is faster "
            f"than its {data_parallel.step * 1e3:.1f} ms a step"
        )
    return "\n".join(lines)


def _percent(fraction):
    return f"{round(fraction, 2) + 0.0:+.0%}"  # + 0.0: no "-0%"


def _range_text(row):
    if row is None:
        return "-"
    if round(row.low, 2) == round(row.high, 2):
        return _percent(row.error)
    return f"{_percent(row.low)} .. {_percent(row.high)}"


def _inputs_text(rec):
    """The record's varied inputs (several values: the range) and the other
    inputs it assumes (one value, no source)."""
    varied = sorted(name for name, values in rec.assumed.items() if len(set(values)) > 1)
    fixed = sorted(set(rec.assumed) - rec.sourced_fields() - set(varied))
    parts = [f"varied: {', '.join(varied)}" if varied else ""]
    parts.append(f"assumed: {', '.join(fixed)}" if fixed else "")
    return "; ".join(part for part in parts if part) or "all published"


def _verdict(rec, row):
    if not rec.scored:
        return "not scored"
    if row is None:
        return "no throughput"
    return "within" if row.within else "MISS"


def _batch_text(rec, arrow="->"):
    """'34,816', or '34,816->69,632' where the batch grew (at its switch_epoch)."""
    grown = f"{arrow}{rec.grown_batch:,}" if rec.grown_batch else ""
    return f"{rec.global_batch:,}{grown}"


def _per_device_u(rec):
    """The record's device's calibrated u at its activations ('-': none)."""
    device = rec.device_model(PER_DEVICE)
    return f"{device.utilization:.3f}" if device else "-"


def leave_one_out_lines(results):
    """The leave-one-out summary: each record predicted at the u fitted on
    the others."""
    us = sorted(result.utilization for result in results)
    errors = sorted(abs(result.error) for result in results)
    return [
        f"leave-one-out: each of the {len(results)} records predicted at the u fitted on the "
        f"other {len(results) - 1} (the geometric median of their fit u: {us[0]:.2f} .. "
        f"{us[-1]:.2f}): {sum(result.within for result in results)} within +-{TOLERANCE:.0%} "
        f"(median |error| {errors[len(errors) // 2]:.0%})",
    ]


def _both_models():
    """The records' rows under one u and under PER_DEVICE, and leave-one-out."""
    return records_rows(), records_rows(PER_DEVICE), leave_one_out()


def records_text():
    """The records table; `one u`: predicted and error at the fitted u;
    `per device`: each device's calibrated u and the error under it; `fit
    u`: the utilization that would reproduce the published time; `LOO`: the
    record's error at the u fitted on all the others (step.leave_one_out)."""
    rows, calibrated, loo = _both_models()
    lines = [
        f"ResNet-50 / ImageNet: published vs predicted from the records' hardware, (a) at one "
        f"u = {CALIBRATED_UTILIZATION} fitted on {CALIBRATION_RECORD}, (b) per device: u, b_half "
        f"and c_fixed fitted on the device's published throughputs (nothing on the records); "
        f"within: the whole range over the assumed inputs inside +-{TOLERANCE:.0%}",
        f"{'record':<22}{'hardware':<22}{'batch':>15}{'epochs':>7}{'published':>11}"
        f"{'(a) predicted':>14}{'error (range)':>17}{'(b) u':>7}{'predicted':>11}"
        f"{'error (range)':>17}{'fit u':>7}{'LOO':>7}  verdict (a) / (b)",
    ]
    for row, other, result in zip(rows, calibrated, loo):
        rec = row.record
        predicted = duration(other.predicted) if other else "-"
        lines.append(
            f"{rec.key:<22}{f'{rec.devices} {rec.device}':<22}{_batch_text(rec):>15}"
            f"{rec.epochs:>7g}{duration(rec.published_seconds):>11}"
            f"{duration(row.predicted):>14}{_range_text(row):>17}{_per_device_u(rec):>7}"
            f"{predicted:>11}{_range_text(other):>17}"
            f"{result.fitted:>7.3f}{_percent(result.error):>7}  "
            f"{_verdict(rec, row)} / {_verdict(rec, other)}"
        )
    lines += [score_line(rows), score_line(calibrated, PER_DEVICE)]
    lines += leave_one_out_lines(loo)
    lines.append("sources, assumed inputs and the misses: docs/planning.md")
    return "\n".join(lines)


def score_line(rows, utilization=CALIBRATED_UTILIZATION, records=RECORDS):
    """How many scored records are within the tolerance over their range,
    `rows` (records_rows at `utilization`) aligned with `records`; under
    PER_DEVICE, of those whose device has a published throughput."""
    scored = [(rec, row) for rec, row in zip(records, rows) if rec.scored]
    predicted = [row for _, row in scored if row]
    within = sum(row.within for row in predicted)
    if utilization == PER_DEVICE:
        missing = sorted({rec.device for rec, row in scored if row is None})
        return (
            f"(b) per device: {within} of {len(predicted)} scored records within "
            f"+-{TOLERANCE:.0%} over their whole range ({len(scored) - len(predicted)} "
            f"more not predicted: no published throughput of a {', '.join(missing)} at "
            "their activations)"
        )
    return (
        f"(a) one u: {within} of {len(scored)} scored records within +-{TOLERANCE:.0%} over "
        f"their whole range ({len(rows) - len(scored)} not scored: the calibration and rows "
        "that repeat it)"
    )


def records_markdown():
    """The records table as Markdown, with both scores and the leave-one-out
    summary (docs/generate.py writes it into docs/planning.md)."""
    rows, calibrated, loo = _both_models()
    lines = [
        "| record | source | hardware | batch | epochs | published | inputs | (a) predicted "
        "| (a) error (range) | (a) | (b) u | (b) predicted | (b) error (range) | (b) | fit u "
        "| LOO |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, other, result in zip(rows, calibrated, loo):
        rec = row.record
        verdicts = []
        for ranged in (row, other):
            verdict = _verdict(rec, ranged)
            if verdict == "MISS":
                verdict = "**miss**"
            elif rec.note and not rec.scored:
                verdict = f"not scored: {rec.note.split(':')[0]}"
            verdicts.append(verdict)
        lines.append(
            f"| `{rec.key}` | {rec.paper} | {rec.devices} {rec.device} | "
            f"{_batch_text(rec, ' → ')} | {rec.epochs:g} | {duration(rec.published_seconds)} | "
            f"{_inputs_text(rec)} | {duration(row.predicted)} | {_range_text(row)} | "
            f"{verdicts[0]} | {_per_device_u(rec)} | "
            f"{duration(other.predicted) if other else '-'} | {_range_text(other)} | "
            f"{verdicts[1]} | {result.fitted:.3f} | {_percent(result.error)} |"
        )
    lines += ["", score_line(rows) + ".", "", score_line(calibrated, PER_DEVICE) + ".", ""]
    lines += [line + "." for line in leave_one_out_lines(loo)]
    return "\n".join(lines) + "\n"


def main(argv):
    """report_text (and --layout_out's file and lines); with --records, the
    records table only."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    options = settings.options_from_flags(PlanSettings)
    if options.records:
        print(records_text())
        return
    try:  # --target_study, --target_s_min or --target_noise_scale: time to accuracy instead
        accuracy = time_to_accuracy_report(options, duration)
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


def layout_out_text(options):
    """Writes --layout_out's file; its lines: the mesh, the split layers,
    bytes and step against pure data parallelism."""
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
    folder = os.path.dirname(path) or "."
    special = storage.special_file(path)
    if special:
        raise ConfigError(f"--layout_out={path}: it is {special}, not a file.")
    if not os.path.isdir(folder):
        raise ConfigError(f"--layout_out={path}: no folder {folder}.")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--layout_out={path}: cannot write in {folder}.")


def parse_flags(argv, flag_values=flags.FLAGS):
    """absl's parse, but a value absl refuses (a --model or --device not in
    its choices, a number that is not one) ends the program in one line
    `error: flag --name=value: why.`, as the settings' checks do, not in
    absl's FATAL and the usage of every flag."""
    try:
        return flag_values(argv)
    except flags.Error as error:
        sys.exit(f"error: {str(error).rstrip('.')}.")


def run(argv=None):
    """The keras-lars-plan entry point."""
    settings.define_flags(PlanSettings)
    app.run(main, argv, flags_parser=parse_flags)
