"""keras-lars-plan: the flags (`PlanSettings`), the text reports and the
entry point `run`."""

import dataclasses

from absl import app

from keras_lars.layerwise import ALLREDUCE_DTYPES
from keras_lars.models import BUILDERS
from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.tools import settings
from keras_lars.tools.plan.cost_models import ALGORITHMS
from keras_lars.tools.plan.cost_models import GB
from keras_lars.tools.plan.cost_models import US
from keras_lars.tools.plan.cost_models import Cluster
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.device import Device
from keras_lars.tools.plan.device import custom_profile
from keras_lars.tools.plan.device import model_profile
from keras_lars.tools.plan.records import CALIBRATED_UTILIZATION
from keras_lars.tools.plan.records import CALIBRATION_RECORD
from keras_lars.tools.plan.records import RECORDS
from keras_lars.tools.plan.records import TOLERANCE
from keras_lars.tools.plan.step import fit_utilization
from keras_lars.tools.plan.step import layer_choices
from keras_lars.tools.plan.step import plan_run
from keras_lars.tools.plan.step import records_rows
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import greater_than
from keras_lars.tools.settings import setting

MODELS = (*BUILDERS, "custom")  # the reference models, or totals given by flags
GRADIENT_DTYPES = tuple(dtype for dtype in ALLREDUCE_DTYPES if dtype)  # keras_lars's all-reduce


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
    if value < config.devices:
        return f"must be >= --devices ({config.devices}): at least one image a device"
    return None


def _device_speed(value, config):
    if not value and not config.images_per_second:
        return "must be > 0 unless --images_per_second is given"
    return None


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """The inputs of keras-lars-plan (defaults: ResNet-50, 64 V100-class
    devices in nodes of 8, mixed precision)."""

    model: str = setting(
        "resnet50",
        "Network: a keras_lars.models name (parameters, FLOPs and activations counted on "
        "its Keras definition) or custom (give --parameters and --forward_gflops).",
        choices=MODELS,
    )
    image_size: int = setting(224, "Training image side.", check=at_least(7))
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
    images_per_second: float = setting(
        0.0,
        "Measured training images/s of one device; 0: --peak_tflops x --utilization.",
        check=at_least(0.0),
    )
    peak_tflops: float = setting(
        125.0,
        "Peak TFLOP/s of one device at the arithmetic the run uses.",
        check=_device_speed,
    )
    memory_bandwidth: float = setting(
        900.0,
        "Device memory GB/s for the per-layer roofline; 0: FLOPs only.",
        check=at_least(0.0),
    )
    utilization: float = setting(
        CALIBRATED_UTILIZATION,
        f"Fraction of the roofline a device achieves (default: fitted on {CALIBRATION_RECORD}).",
        check=lambda value, config: None if 0 < value <= 1 else "must be in (0, 1]",
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
    global_batch_size: int = setting(8192, "Images per step over all devices.", check=_batch)
    epochs: float = setting(
        0.0,
        "Epochs to train; 0: keras_lars.resnet50_lars_recipe's for the batch.",
        check=at_least(0.0),
    )
    examples: int = setting(
        IMAGENET_TRAIN_EXAMPLES, "Training examples in one epoch.", check=at_least(1)
    )
    layers: bool = setting(False, "Print the per-layer data- vs model-parallel report.")
    records: bool = setting(False, "Print the published records against the predictions.")

    def __post_init__(self):
        settings.check(self)
        if self.global_batch_size > self.examples:
            raise ConfigError(
                f"--global_batch_size={self.global_batch_size}: must be <= --examples "
                f"({self.examples})."
            )

    def profile(self):
        if self.model == "custom":
            return custom_profile(self.parameters, self.forward_gflops * 1e9)
        return model_profile(self.model, self.image_size)

    def device(self):
        return Device(
            peak_flops=self.peak_tflops * 1e12,
            utilization=self.utilization,
            memory_bandwidth=self.memory_bandwidth * GB,
            activation_bytes=DTYPE_BYTES[self.activation_dtype],
            images_per_second=self.images_per_second,
            input_images_per_second=self.input_images_per_second,
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
            global_batch or self.global_batch_size,
            self.epochs,
            self.device(),
            self.cluster(devices),
            DTYPE_BYTES[self.gradient_dtype],
            self.overlap,
            self.examples,
        )


# --- output ---------------------------------------------------------------------------------
def duration(seconds):
    """'42 s', '12.5 min', '3.2 h' or '4.1 d'."""
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _ms(seconds):
    return f"{seconds * 1e3:9.1f} ms"


def plan_text(options):
    """The report of one plan: model, step split, efficiency, time to train."""
    profile, run = options.profile(), options.run()
    step, cluster = run.step, options.cluster()
    gradient_bytes = profile.parameters * DTYPE_BYTES[options.gradient_dtype]
    per_device = options.global_batch_size / options.devices
    if options.images_per_second:
        speed = f"{options.images_per_second:g} images/s measured"
    else:
        speed = (
            f"{options.peak_tflops:g} TFLOP/s peak, {options.memory_bandwidth:g} GB/s, "
            f"utilization {options.utilization:g}"
        )
    lines = [
        f"model     {profile.name}: {profile.parameters:,} parameters "
        f"({gradient_bytes / 1e6:.1f} MB of {options.gradient_dtype} gradients), "
        f"{profile.forward_flops / 1e9:.2f} GFLOPs forward per image",
        f"device    {speed}",
        f"cluster   {options.devices} devices = {cluster.nodes} "
        f"node{'s' if cluster.nodes > 1 else ''} x {cluster.devices_per_node}, "
        f"{options.algorithm} all-reduce, "
        f"overlap {'on' if options.overlap else 'off'}",
        f"step      batch {options.global_batch_size:,} ({per_device:g} a device)",
        f"  compute               {_ms(step.compute)}",
        f"  communication         {_ms(step.communication)}  "
        f"(exposed {step.exposed_communication * 1e3:.1f} ms)",
        f"  input stall           {_ms(step.input)}",
        f"  step                  {_ms(step.step)}",
        f"scaling efficiency      {step.efficiency:9.1%}",
        f"steps                   {run.steps:9,}  ({run.epochs:g} epochs of "
        f"{options.examples:,} examples)",
        f"time to train           {duration(run.seconds):>9}",
    ]
    return "\n".join(lines)


def neighbourhood(value, factors=(0.25, 0.5, 1, 2, 4)):
    """`value` times each factor, rounded, at least 1."""
    return [max(1, round(value * f)) for f in factors]


def grid_text(options):
    """Time to train for batch x devices around the given point (epochs:
    --epochs, else the recipe's for each batch; '-' where a device would
    get less than one image or the devices do not fill whole nodes)."""
    batches = neighbourhood(options.global_batch_size)
    devices = neighbourhood(options.devices)
    epochs = "" if options.epochs else ", the recipe's epochs for each batch"
    lines = [f"time to train, global batch (rows) x devices (columns){epochs}:"]
    lines.append(f"{'':>9}" + "".join(f"{d:>11,}" for d in devices))
    for batch in batches:
        cells = []
        for count in devices:
            nodes_ok = count % min(options.devices_per_node, count) == 0
            if batch < count or batch > options.examples or not nodes_ok:
                cells.append(f"{'-':>11}")
                continue
            cells.append(f"{duration(options.run(batch, count).seconds):>11}")
        lines.append(f"{batch:>9,}" + "".join(cells))
    return "\n".join(lines)


def layers_text(options):
    """The per-layer report: bytes a step under data vs model parallelism."""
    profile = options.profile()
    choices = layer_choices(
        profile,
        options.global_batch_size,
        DTYPE_BYTES[options.gradient_dtype],
        DTYPE_BYTES[options.activation_dtype],
    )
    lines = [
        f"per layer, batch {options.global_batch_size:,}: data parallel = gradient "
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
    return "\n".join(lines)


def records_text():
    """The records table; `fit u`: the utilization that would reproduce the
    published time (the calibration's is the constant itself)."""
    lines = [
        f"ResNet-50 / ImageNet: published vs predicted from the papers' hardware "
        f"(utilization {CALIBRATED_UTILIZATION} fitted on {CALIBRATION_RECORD}; "
        f"tolerance +-{TOLERANCE:.0%})",
        f"{'record':<16}{'hardware':<20}{'batch':>8}{'published':>11}{'predicted':>11}"
        f"{'error':>7}{'fit u':>7}  note",
    ]
    for rec, predicted, error in records_rows():
        if rec.key == CALIBRATION_RECORD:
            note = "calibration"
        elif abs(error) <= TOLERANCE:
            note = "ok"
        else:
            note = "MISS: " + rec.miss
        lines.append(
            f"{rec.key:<16}{f'{rec.devices} {rec.device}':<20}{rec.global_batch:>8,}"
            f"{duration(rec.published_seconds):>11}{duration(predicted):>11}"
            f"{error:>+7.0%}{fit_utilization(rec):>7.3f}  {note}"
        )
    epochs = " or ".join(sorted({f"{rec.epochs:g}" for rec in RECORDS}))
    lines.append(f"{epochs} epochs each; sources and unverified figures: docs/planning.md")
    return "\n".join(lines)


def records_markdown():
    """The records table as Markdown (docs/planning.md holds it; a test
    checks that the page is current)."""
    lines = [
        "| record | paper | hardware | batch | published | predicted | error | fit u |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rec, predicted, error in records_rows():
        error_text = "calibration" if rec.key == CALIBRATION_RECORD else f"{error:+.0%}"
        if rec.key != CALIBRATION_RECORD and abs(error) > TOLERANCE:
            error_text = f"**{error:+.0%} (miss)**"
        lines.append(
            f"| `{rec.key}` | {rec.paper} | {rec.devices} {rec.device} | "
            f"{rec.global_batch:,} | {duration(rec.published_seconds)} | "
            f"{duration(predicted)} | {error_text} | {fit_utilization(rec):.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv):
    """The plan report and the batch x devices table (with --layers, the
    per-layer report); with --records, the records table only."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    options = settings.options_from_flags(PlanSettings)
    if options.records:
        print(records_text())
        return
    print(plan_text(options))
    print()
    print(grid_text(options))
    if options.layers:
        print()
        print(layers_text(options))


def run(argv=None):
    """The keras-lars-plan entry point."""
    settings.define_flags(PlanSettings)
    app.run(main, argv)
