"""One step of synchronous data parallelism, the whole run, and the
predictions of the published records.

Over p devices, b = B / p images each:

    compute    = b * t_image / (u * e(b))    (device.Device.compute_seconds)
    fixed      = c_fixed                     (device.Device.fixed_step_seconds)
    comm       = all-reduce time of n = (trainable parameters) * s_g bytes
    backward   = 2/3 * compute
    exposed    = max(0, comm - backward)  with overlap,  else comm
    input      = max(0, b / R - compute - fixed - exposed)   (R: input images/s)
    step       = compute + fixed + exposed + input
    scaling efficiency = (compute + fixed) / step   (one device at the same b: 1)
    steps      = floor(epochs * floor(N / B) + 1/2)

Per layer, data parallelism moves 2 P s_g bytes a step and model
parallelism 2 B I s_a (`LayerChoice`). A record's prediction is a range
over its assumed inputs (`record_range`), at one u or under each device's
own calibration (published.PER_DEVICE); `leave_one_out` predicts each
scored record over its range at the u fitted on the other scored ones.
"""

import dataclasses
import itertools
import math
import statistics

from keras_lars import BatchSchedule
from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.recipes import epochs_to_steps
from keras_lars.recipes import resnet50_lars_recipe
from keras_lars.tools.plan.cost_models import allreduce_time
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.device import TRAINING_FLOPS_FACTOR
from keras_lars.tools.plan.device import LayerProfile
from keras_lars.tools.plan.device import model_profile
from keras_lars.tools.plan.phased_plan import PhasedPlan
from keras_lars.tools.plan.phased_plan import PhasePlan
from keras_lars.tools.plan.phased_plan import phase_spans
from keras_lars.tools.plan.records import CALIBRATED_UTILIZATION
from keras_lars.tools.plan.records import RECORDS
from keras_lars.tools.plan.records import TOLERANCE

RECORD_IMAGE_SIZE = 224  # every record trains ResNet-50 at 224x224
# of the training compute: the backward pass is 2 of the 3 forward passes
BACKWARD_FRACTION = (TRAINING_FLOPS_FACTOR - 1) / TRAINING_FLOPS_FACTOR


def exposed_communication(communication, backward, overlap):
    """The part of the all-reduce that the step waits for: with overlap the
    gradients are reduced while the backward pass still runs (bucketed, as
    Horovod / DDP do), so up to `backward` seconds are hidden:
    max(0, communication - backward); without overlap all of it."""
    return max(0.0, communication - backward) if overlap else communication


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds of one step and its parts (see the module docstring)."""

    compute: float
    communication: float
    exposed_communication: float
    input: float
    fixed: float = 0.0

    @property
    def step(self):
        return self.compute + self.fixed + self.exposed_communication + self.input

    @property
    def efficiency(self):
        """Scaling efficiency: one device's step at the same per-device
        batch over this step."""
        return (self.compute + self.fixed) / self.step


def step_time(profile, global_batch, device, cluster, gradient_bytes=4, overlap=True):
    """The StepTime of one data-parallel step of `global_batch` images."""
    per_device = global_batch / cluster.devices
    compute = device.compute_seconds(profile, per_device)
    fixed = device.fixed_step_seconds
    communication = allreduce_time(profile.parameters * gradient_bytes, cluster)
    exposed = exposed_communication(communication, BACKWARD_FRACTION * compute, overlap)
    stall = 0.0
    if device.input_images_per_second:
        busy = compute + fixed + exposed
        stall = max(0.0, per_device / device.input_images_per_second - busy)
    return StepTime(compute, communication, exposed, stall, fixed)


def recipe_epochs(global_batch):
    """The epochs keras_lars.resnet50_lars_recipe gives the batch."""
    return float(resnet50_lars_recipe(global_batch).train_epochs)


@dataclasses.dataclass(frozen=True)
class Run:
    step: StepTime
    steps: int
    epochs: float

    @property
    def seconds(self):
        return self.steps * self.step.step


def plan_run(
    profile,
    global_batch,
    epochs,
    device,
    cluster,
    gradient_bytes=4,
    overlap=True,
    examples=IMAGENET_TRAIN_EXAMPLES,
):
    """Step time, steps and time to train `epochs` (0: the recipe's) of
    `examples` examples an epoch (drop remainder)."""
    epochs = epochs or recipe_epochs(global_batch)
    step = step_time(profile, global_batch, device, cluster, gradient_bytes, overlap)
    return Run(step, epochs_to_steps(epochs, examples, global_batch), epochs)


# --- data or model parallelism, layer by layer (Krizhevsky 2014) -------------------------
@dataclasses.dataclass(frozen=True)
class LayerChoice:
    """Bytes one step moves for a layer under each scheme, global batch B:

    data parallelism: the layer's gradient, reduce-scattered and
        all-gathered, 2 P s_g (P parameters, s_g bytes each);
    model parallelism (the layer split across devices, Krizhevsky 2014,
        "One weird trick", arXiv:1404.5997): every device needs the whole
        batch's input activations forward and sends their gradients back,
        2 B I s_a (I input elements per image, s_a bytes each).

    Model parallelism is cheaper below the break-even batch P s_g / (I s_a).
    """

    layer: LayerProfile
    global_batch: int
    gradient_bytes: int = 4
    activation_bytes: int = 4

    @property
    def data_parallel_bytes(self):
        return 2 * self.layer.parameters * self.gradient_bytes

    @property
    def model_parallel_bytes(self):
        return 2 * self.global_batch * self.layer.input_elements * self.activation_bytes

    @property
    def cheaper(self):
        return "model" if self.model_parallel_bytes < self.data_parallel_bytes else "data"

    @property
    def break_even_batch(self):
        return (
            self.layer.parameters
            * self.gradient_bytes
            / (self.layer.input_elements * self.activation_bytes)
        )


def layer_choices(profile, global_batch, gradient_bytes=4, activation_bytes=4):
    """A LayerChoice for every layer with parameters and FLOPs (conv, dense)."""
    return [
        LayerChoice(layer, global_batch, gradient_bytes, activation_bytes)
        for layer in profile.layers
        if layer.parameters and layer.forward_flops and layer.input_elements
    ]


# --- the published records ------------------------------------------------------------------
def predict_record(rec, utilization=CALIBRATED_UTILIZATION, **choice):
    """The Run this planner predicts for a record's hardware (ResNet-50),
    a phases.PhasedPlan where its batch grew (`record_phases`), with
    `choice` replacing some of its inputs (one of its assumed values);
    `utilization`: one u, or published.PER_DEVICE (None where the device has
    no published throughput)."""
    rec = dataclasses.replace(rec, **choice) if choice else rec
    device = rec.device_model(utilization)
    if device is None:
        return None
    runs = [
        plan_run(
            model_profile("resnet50"),
            span.global_batch,
            span.epochs,
            device,
            rec.cluster(),
            DTYPE_BYTES[rec.gradient_dtype],
            rec.overlap,
        )
        for span in record_phases(rec)
    ]
    if len(runs) == 1:
        return runs[0]
    return PhasedPlan(
        tuple(PhasePlan(span, run, None) for span, run in zip(record_phases(rec), runs))
    )


def record_phases(rec):
    """The phases.PhaseSpan of each phase of a record's run: all of it at
    `global_batch`, or, where its batch grew, `global_batch` to
    `switch_epoch` and `grown_batch` after (keras_lars.BatchSchedule's
    phases, as keras-lars-plan --batch_schedule plans them)."""
    text = f"0:{rec.global_batch}"
    if rec.grown_batch:
        text += f",{rec.switch_epoch:g}:{rec.grown_batch}"
    return phase_spans(BatchSchedule.parse(text), rec.epochs, RECORD_IMAGE_SIZE)


def fit_utilization(rec):
    """The utilization at which the prediction of `rec` equals its
    published time (bisection; the predicted time falls as utilization
    rises)."""
    low, high = 1e-4, 2.0
    for _ in range(60):
        middle = (low + high) / 2
        if predict_record(rec, middle).seconds > rec.published_seconds:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def choices(rec):
    """Every combination of the record's assumed values, as dicts."""
    names = sorted(rec.assumed)
    products = itertools.product(*(rec.assumed[name] for name in names))
    return [dict(zip(names, values)) for values in products]


@dataclasses.dataclass(frozen=True)
class RecordRange:
    """A record's prediction over its assumed inputs: the predicted seconds
    and the error (predicted / published - 1) at the nominal inputs, and
    the lowest and highest error over every combination."""

    record: object
    predicted: float
    error: float
    low: float
    high: float

    @property
    def within(self):
        """Inside +-TOLERANCE over the whole range."""
        return -TOLERANCE <= self.low and self.high <= TOLERANCE


def record_range(rec, utilization=CALIBRATED_UTILIZATION):
    """The RecordRange of `rec` (published_seconds may be assumed too);
    None if some combination has no device model (published.PER_DEVICE on a
    device without a published throughput)."""
    runs = [(choice, predict_record(rec, utilization, **choice)) for choice in choices(rec)]
    nominal = predict_record(rec, utilization)
    if nominal is None or any(run is None for _, run in runs):
        return None
    error = nominal.seconds / rec.published_seconds - 1
    errors = [
        run.seconds / choice.get("published_seconds", rec.published_seconds) - 1
        for choice, run in runs
    ]
    return RecordRange(rec, nominal.seconds, error, min(errors + [error]), max(errors + [error]))


def records_rows(utilization=CALIBRATED_UTILIZATION):
    """The RecordRange of every record (None: no device model, above)."""
    return [record_range(rec, utilization) for rec in RECORDS]


@dataclasses.dataclass(frozen=True)
class LeaveOneOut:
    """`record` (a scored one) left out: u fitted on the other scored
    records, and its RecordRange at that u (`ranged`: the error at the
    nominal inputs and over every combination of the assumed ones, as the
    verdict of the table judges a record)."""

    record: object
    utilization: float
    ranged: RecordRange

    @property
    def error(self):
        return self.ranged.error

    @property
    def within(self):
        """Inside +-TOLERANCE over the whole range, as the table's verdict."""
        return self.ranged.within


def geometric_median(utilizations):
    """exp(median(log u_j)): one u fitted on records whose fitted u are
    `utilizations`. Where a record's time goes as 1/u this is the u of the
    least absolute log errors, sum_j |log(predicted_j / published_j)|: a fit
    that the few far records (TPUs, Sony's V100s) do not drag."""
    return math.exp(statistics.median(math.log(u) for u in utilizations))


def leave_one_out(records=RECORDS):
    """For each scored record in turn: u fitted on the other scored records
    (`geometric_median` of their fitted u), the one left out predicted at
    it over its assumed inputs (record_range). The calibration and the rows
    that repeat it are not scored, so they neither fit nor count."""
    scored = [rec for rec in records if rec.scored]
    fitted = {rec.key: fit_utilization(rec) for rec in scored}
    results = []
    for rec in scored:
        u = geometric_median([value for key, value in fitted.items() if key != rec.key])
        results.append(LeaveOneOut(rec, u, record_range(rec, u)))
    return results
