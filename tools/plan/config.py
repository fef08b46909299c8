"""keras-lars-plan's settings: `PlanSettings`, one declaration per flag
(name, type, default, help, check; tools/settings.py derives the flags and
docs/flags.md from it), checked on construction. What they mean to the
models (the device, the profile, the cluster, the run, the phases): its base
model_inputs.ModelInputs; the time-to-accuracy settings: its base
target_flags.TargetSettings; the schedule flags' shared rules:
tools/schedule_flags.py."""

import dataclasses

from keras_lars.models import NAMES
from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.tools import settings
from keras_lars.tools.plan.cost_models import ALGORITHMS
from keras_lars.tools.plan.device import DEVICES
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.model_inputs import DEFAULT_PER_DEVICE_BATCH
from keras_lars.tools.plan.model_inputs import ModelInputs
from keras_lars.tools.plan.phased_plan import span_text
from keras_lars.tools.plan.records import CALIBRATED_UTILIZATION
from keras_lars.tools.plan.records import CALIBRATION_RECORD
from keras_lars.tools.plan.target_flags import TargetSettings
from keras_lars.tools.schedule_flags import SETS
from keras_lars.tools.schedule_flags import schedule_settings
from keras_lars.tools.schedule_flags import take_first_phases
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import greater_than
from keras_lars.tools.settings import setting
from keras_lars.validation import ALLREDUCE_DTYPES

MODELS = (*NAMES, "custom")  # the reference models, or totals given by flags
DEFAULT_DEVICE = "V100-SXM2-16GB"
GRADIENT_DTYPES = tuple(dtype for dtype in ALLREDUCE_DTYPES if dtype)  # keras_lars's all-reduce
MAX_IMAGE_SIZE = 2**16  # far beyond it Keras's shape arithmetic (floats) is not exact


def _image_size_problem(value, config):
    if value > MAX_IMAGE_SIZE:
        return f"must be <= {MAX_IMAGE_SIZE}"
    return at_least(7)(value, config)


IMAGE_SIZE_CHECK = _image_size_problem


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


def _epochs_given(config):
    if config.epochs:
        return None
    return "needs --epochs > 0 (0: the recipe's epochs, which are for one batch)"


_BATCH_SCHEDULE, _IMAGE_SIZE_SCHEDULE = schedule_settings(
    epochs_flag="epochs",
    batch_phase="each batch a multiple of --devices, each phase planned at its batch and the "
    "times summed (tools/plan/phased_plan.py)",
    size_phase="each phase's compute and activations at its size",
    size_problem=IMAGE_SIZE_CHECK,
    counting_problem=_epochs_given,
)


def _one_batch(value, config):
    if value and any(getattr(config, name) for name in SETS):
        return "plans one batch and image size: not with --batch_schedule / --image_size_schedule"
    return None


def _from_device(value, config):
    return None if value >= 0 else "must be >= 0 (0: --device's)"


@dataclasses.dataclass(frozen=True)
class PlanSettings(TargetSettings, ModelInputs):
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
    batch_schedule: str = _BATCH_SCHEDULE
    image_size_schedule: str = _IMAGE_SIZE_SCHEDULE
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
        take_first_phases(self)
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


def _does_not_fit(memory, per_device):
    return (
        f"{per_device:g} images a device need {memory.total / 1e9:.1f} GB by the memory "
        f"estimate, more than the {memory.capacity / 1e9:.1f} GB of --device_memory_gb / --device"
    )
