"""A published training run as the planner reads it: `Record`, its inputs
(SI units), each with where it is published (`sources`) or, with no public
source, its plausible values (`assumed`), and the cluster and device model
they make. The runs themselves, a data table: records.py.

A record is predicted under two device models: (a) one utilization for
every device (records.CALIBRATED_UTILIZATION); (b) `PER_DEVICE`, each
device's calibration on its published throughputs (calibration.py),
nothing fitted on a record."""

import dataclasses

from keras_lars.tools.plan.cost_models import US
from keras_lars.tools.plan.cost_models import Cluster
from keras_lars.tools.plan.device import DEVICES
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.device import Device
from keras_lars.tools.plan.device import model_profile

# every input of a record: each is in `sources` or in `assumed`
INPUTS = (
    "device",
    "devices",
    "devices_per_node",
    "intra_bandwidth",
    "inter_bandwidth",
    "algorithm",
    "activation_dtype",
    "gradient_dtype",
    "global_batch",
    "epochs",
    "published_seconds",
    "overlap",
)
# the inputs of a record whose batch grew during the run (grown_batch > 0)
SCHEDULE_INPUTS = ("grown_batch", "switch_epoch")
PER_DEVICE = "per-device"  # Record.device_model: the device's calibration, not one u
LATENCY = 5 * US  # every link of every record: assumed, no record publishes it


@dataclasses.dataclass(frozen=True)
class Record:
    """A published training time and its hardware (SI units). `sources`:
    field name(s) -> where published; `assumed`: field -> plausible values
    (with a source too: the published values); `global_batch` grows to
    `grown_batch` at `switch_epoch` where the run's batch grew;
    `miss`: why the prediction is off, when it is; `scored`: False for a row
    that cannot test the model (`note` says why)."""

    key: str
    paper: str
    device: str
    devices: int
    devices_per_node: int
    intra_bandwidth: float
    inter_bandwidth: float
    algorithm: str
    activation_dtype: str
    gradient_dtype: str
    global_batch: int
    epochs: float
    published_seconds: float
    overlap: bool
    sources: dict
    grown_batch: int = 0  # the batch from switch_epoch on; 0: global_batch all run
    switch_epoch: int = 0
    assumed: dict = dataclasses.field(default_factory=dict)
    miss: str = ""
    scored: bool = True
    note: str = ""

    def sourced_fields(self):
        return {name.strip() for key in self.sources for name in key.split(",")}

    def cluster(self):
        """The record's devices and links (latencies: LATENCY)."""
        return Cluster(
            self.devices,
            self.devices_per_node,
            self.intra_bandwidth,
            LATENCY,
            self.inter_bandwidth,
            LATENCY,
            self.algorithm,
        )

    def device_model(self, utilization):
        """The record's device at `utilization` of its roofline; at
        PER_DEVICE, its own calibration on the device's published throughputs
        at the record's activations (u, b_half, c_fixed of
        calibration.calibrate; nothing fitted on a record), None where the
        device has none."""
        spec = DEVICES[self.device]
        half, fixed = 0.0, 0.0
        if utilization == PER_DEVICE:
            from keras_lars.tools.plan.calibration import calibrate

            fitted = calibrate(spec, self.activation_dtype, model_profile("resnet50"))
            if fitted is None:
                return None
            utilization, half = fitted.utilization, fitted.half_batch
            fixed = fitted.fixed_step_seconds
        return Device(
            peak_flops=spec.peak(self.activation_dtype),
            utilization=utilization,
            memory_bandwidth=spec.memory_bandwidth,
            activation_bytes=DTYPE_BYTES[self.activation_dtype],
            half_batch=half,
            fixed_step_seconds=fixed,
        )
