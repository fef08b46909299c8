"""Published ImageNet / ResNet-50 training times, with the hardware figures
of their papers (data).

Every `Record` names where each figure was verified and which ones are
assumptions; `miss` explains a prediction outside `TOLERANCE`. One constant
is fitted on one record: `CALIBRATED_UTILIZATION` (the default --utilization)
on `CALIBRATION_RECORD`; every other record is a prediction
(step.records_rows). docs/planning.md holds the table and the sources.
"""

import dataclasses

from keras_lars.tools.plan.cost_models import GB
from keras_lars.tools.plan.cost_models import US
from keras_lars.tools.plan.cost_models import Cluster
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.device import Device


@dataclasses.dataclass(frozen=True)
class Record:
    """A published ImageNet / ResNet-50 training time and the hardware figures
    its paper gives (SI units). `verified`: where each figure was checked;
    `unverified`: figures taken as assumptions; `miss`: why the prediction
    is off, when it is."""

    key: str
    paper: str
    devices: int
    devices_per_node: int
    device: str
    peak_flops: float
    memory_bandwidth: float
    activation_dtype: str
    intra_bandwidth: float
    inter_bandwidth: float
    algorithm: str
    gradient_dtype: str
    global_batch: int
    epochs: float
    published_seconds: float
    verified: str
    unverified: str
    miss: str = ""
    intra_latency: float = 5 * US  # assumed for every record, not from the papers
    inter_latency: float = 5 * US
    overlap: bool = False  # where the paper does not say (the conservative reading)

    def cluster(self):
        """The record's devices and links (latencies: the assumed 5 us)."""
        return Cluster(
            self.devices,
            self.devices_per_node,
            self.intra_bandwidth,
            self.intra_latency,
            self.inter_bandwidth,
            self.inter_latency,
            self.algorithm,
        )

    def device_model(self, utilization):
        """The record's device at `utilization` of its roofline."""
        return Device(
            peak_flops=self.peak_flops,
            utilization=utilization,
            memory_bandwidth=self.memory_bandwidth,
            activation_bytes=DTYPE_BYTES[self.activation_dtype],
        )


RECORDS = (
    Record(
        key="goyal2017",
        paper="Goyal et al. 2017, arXiv:1706.02677",
        devices=256,
        devices_per_node=8,
        device="P100",
        peak_flops=10.6e12,
        memory_bandwidth=732 * GB,
        activation_dtype="float32",
        intra_bandwidth=20 * GB,
        inter_bandwidth=50e9 / 8,
        algorithm="hierarchical",
        gradient_dtype="float32",
        global_batch=8192,
        epochs=90,
        published_seconds=3600,
        overlap=True,
        verified="From the paper's full text (arXiv:1706.02677v2): 256 GPUs, 32 servers x "
        "8 P100 joined by NVLink (sec. 4.1 p.5, sec. 4.3 p.6, footnote 2); 50 Gbit Ethernet "
        "(sec. 4.3 p.6); batch 8k = 32 x 256 (sec. 5.2 p.7); 90 epochs (sec. 5.1 p.6); one "
        "hour (abstract, sec. 5); FP32 gradients, 100 MB a step (sec. 4.3); the all-reduce "
        "overlaps backprop (sec. 4 p.5, Fig. 8). P100 SXM2 10.6 TFLOP/s FP32, 732 GB/s, "
        "NVLink 20 GB/s (Big Basin OCP slides; Dell EMC P100 blog).",
        unverified="The hour's precision ('one hour'); the P100 peaks and NVLink bandwidth "
        "(not in the paper); the all-reduce is modelled as a hierarchical ring, while the "
        "paper reduces and broadcasts inside a server and runs recursive halving/doubling "
        "between servers (sec. 4.1): the same bandwidth term, 10 latency terms instead of 62.",
    ),
    Record(
        key="goyal2017_8gpu",
        paper="Goyal et al. 2017, arXiv:1706.02677 (baseline)",
        devices=8,
        devices_per_node=8,
        device="P100",
        peak_flops=10.6e12,
        memory_bandwidth=732 * GB,
        activation_dtype="float32",
        intra_bandwidth=20 * GB,
        inter_bandwidth=50e9 / 8,
        algorithm="hierarchical",
        gradient_dtype="float32",
        global_batch=256,
        epochs=90,
        published_seconds=29 * 3600,
        overlap=True,
        verified="29 hours on 8 P100 (sec. 1 p.1); 8 GPUs in one server at batch 256 = 8 x "
        "32 (sec. 5.1 p.7); 90 epochs (sec. 5.1); the all-reduce overlaps backprop (sec. 4).",
        unverified="The 29 hours stand in a sentence on the original ResNet-50 recipe; Fig. "
        "7 gives the baseline as 'over 16 minutes' an epoch (about 24 h for 90 epochs); "
        "NVLink 20 GB/s.",
    ),
    Record(
        key="akiba2017",
        paper="Akiba et al. 2017, arXiv:1711.04325",
        devices=1024,
        devices_per_node=8,
        device="P100",
        peak_flops=10.6e12,
        memory_bandwidth=732 * GB,
        activation_dtype="float32",
        intra_bandwidth=10 * GB,
        inter_bandwidth=2 * 56e9 / 8,
        algorithm="ring",
        gradient_dtype="float32",
        global_batch=32768,
        epochs=90,
        published_seconds=15 * 60,
        verified="1024 P100, 90 epochs, batch 32k, 15 minutes (abstract); MN-1: 128 nodes "
        "x 8 P100, two FDR InfiniBand links (56 Gbps x 2) per node, ring all-reduce (PFN "
        "blog 'MN-1: a GPU cluster behind 15-min ImageNet', 2017).",
        unverified="P100 SXM2 peaks (as Goyal); intra-node link 10 GB/s; FP32 gradients "
        "(the paper may reduce in FP16).",
    ),
    Record(
        key="you2018",
        paper="You et al. 2018 (ICPP), arXiv:1709.05011",
        devices=2048,
        devices_per_node=1,
        device="Xeon Phi 7250",
        peak_flops=68 * 1.4e9 * 2 * 16 * 2,
        memory_bandwidth=450 * GB,
        activation_dtype="float32",
        intra_bandwidth=12.5 * GB,
        inter_bandwidth=100e9 / 8,
        algorithm="ring",
        gradient_dtype="float32",
        global_batch=32768,
        epochs=90,
        published_seconds=20 * 60,
        verified="2048 Xeon Phi 7250, 90 epochs, 20 minutes, LARS (abstract); KNL 7250: 68 "
        "cores at 1.4 GHz, two 512-bit vector units a core (Cornell Virtual Workshop, "
        "Stampede2), FMA: 6.09 TFLOP/s FP32; MCDRAM above 450 GB/s (JLab Xeon Phi page).",
        unverified="batch 32K for the 20-minute run; Stampede2's Omni-Path 100 Gb/s as the "
        "network; the all-reduce algorithm (ring assumed).",
    ),
    Record(
        key="jia2018",
        paper="Jia et al. 2018, arXiv:1807.11205",
        devices=2048,
        devices_per_node=8,
        device="P40",
        peak_flops=11.76e12,
        memory_bandwidth=346 * GB,
        activation_dtype="float16",
        intra_bandwidth=12 * GB,
        inter_bandwidth=100e9 / 8,
        algorithm="hierarchical",
        gradient_dtype="float16",
        global_batch=65536,
        epochs=90,
        published_seconds=6.6 * 60,
        verified="2048 P40, 90 epochs, 6.6 minutes, batch up to 64k, mixed precision "
        "(abstract; batch 64K in Mikami et al.'s table); 100 Gbit Ethernet (Mikami et al.'s "
        "table); hierarchical ring all-reduce (cited as Tencent 2018 in Huang et al. "
        "2024, Gloo+); P40: 11.76 TFLOP/s FP32, 1/64-rate FP16, 346 GB/s, PCIe 3.0 x16 "
        "(spec pages).",
        unverified="8 GPUs per node; FP16 all-reduce and FP16 activations with FP32 "
        "arithmetic (the P40's FP16 math is slow).",
    ),
    Record(
        key="mikami2018",
        paper="Mikami et al. 2018 (v1), arXiv:1811.05233",
        devices=2176,
        devices_per_node=4,
        device="V100",
        peak_flops=125e12,
        memory_bandwidth=900 * GB,
        activation_dtype="float16",
        intra_bandwidth=50 * GB,
        inter_bandwidth=2 * 100e9 / 8,
        algorithm="torus2d",
        gradient_dtype="float16",
        global_batch=69632,
        epochs=90,
        published_seconds=224,
        verified="224 seconds, 2D-torus all-reduce, ABCI (abstract v1); 2176 V100, batch "
        "34K->68K, InfiniBand EDR x2 (the paper's tables via NVIDIA's news post); 'up to 2176 "
        "GPUs', batch and GPU count adjusted during training (Sony announcement, ITmedia "
        "2018-11-13); V100 125 tensor TFLOP/s (NVIDIA), 900 GB/s HBM2.",
        unverified="90 epochs; 4 GPUs per node (ABCI); the precision; the batch schedule "
        "(68K = 69632 used throughout).",
        miss="Predicted too fast: the batch (34K->68K) and the number of GPUs (up to "
        "2176) grew during the run, which one fixed 2176-GPU, 68K plan cannot follow; the "
        "published time implies ~240 images/s a V100, 40% of the utilization of the "
        "calibration, where Yamazaki et al. reach 845 on the same machine.",
    ),
    Record(
        key="ying2018",
        paper="Ying et al. 2018, arXiv:1811.06992",
        devices=1024,
        devices_per_node=1,
        device="TPU v3",
        peak_flops=123e12,
        memory_bandwidth=900 * GB,
        activation_dtype="bfloat16",
        intra_bandwidth=340e12 / 1024,
        inter_bandwidth=340e12 / 1024,
        algorithm="torus2d",
        gradient_dtype="float32",
        global_batch=32768,
        epochs=90,
        published_seconds=2.2 * 60,
        verified="1024 TPU v3 chips, 2.2 minutes, >1.05M images/s, 2-D torus all-reduce "
        "(abstract); 123 TFLOP/s bf16 and 900 GB/s a chip, 340 TB/s all-reduce bandwidth "
        "a pod (Google Cloud TPU v3 documentation).",
        unverified="batch 32K and 90 epochs (1.05M images/s x 2.2 min = 108 epochs, so "
        "the time includes more than training steps); FP32 gradient sums; whether the "
        "all-reduce overlapped the backward pass (off assumed).",
        miss="Predicted too slow: the published 2.2 minutes need a utilization of 0.58, "
        "where the FP32 P100s of the calibration reach 0.42: bfloat16 on the TPU's matrix "
        "units runs ResNet-50 nearer its peak, which one global constant cannot carry. "
        "With the all-reduce overlapped (not known) it is +34%, still a miss.",
    ),
    Record(
        key="yamazaki2019",
        paper="Yamazaki et al. 2019, arXiv:1903.12650",
        devices=2048,
        devices_per_node=4,
        device="V100",
        peak_flops=125e12,
        memory_bandwidth=900 * GB,
        activation_dtype="float16",
        intra_bandwidth=50 * GB,
        inter_bandwidth=2 * 100e9 / 8,
        algorithm="hierarchical",
        gradient_dtype="float16",
        global_batch=81920,
        epochs=90,
        published_seconds=74.7,
        overlap=True,
        verified="2048 GPUs on ABCI, 74.7 s, >1.73M images/s (abstract); V100, batch "
        "81,920, Tensor Cores / mixed precision, MXNet, LARS (NVIDIA blog on the paper); "
        "ABCI InfiniBand EDR x2 (Mikami et al.'s table).",
        unverified="90 epochs (1.73M images/s x 74.7 s = 101 epochs); 4 GPUs per node and "
        "the overlap of all-reduce with the backward pass (both from 机器之心's Chinese "
        "translation of the paper, not its English text); the all-reduce algorithm "
        "(hierarchical assumed); FP16 gradients.",
    ),
)
CALIBRATION_RECORD = "goyal2017"
CALIBRATED_UTILIZATION = 0.417  # fit_utilization(record(CALIBRATION_RECORD)), 3 digits
TOLERANCE = 0.30


def record(key):
    """The record named `key`."""
    return next(r for r in RECORDS if r.key == key)
