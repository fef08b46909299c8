"""All-reduce cost models (alpha-beta) and the cluster they run on.

alpha: seconds per message, beta: seconds per byte, n: bytes reduced, p:
participants. Each algorithm is one pure function with its formula and
source; `allreduce_time` prices a `Cluster`'s algorithm on its links.
"""

import dataclasses
import math

GB = 1e9  # bandwidths (flags and records) are in GB/s: 10^9 bytes per second
US = 1e-6  # latencies (flags and records) are in microseconds
ALGORITHMS = ("ring", "hierarchical", "torus2d", "tree", "halving_doubling")


def ring_allreduce(n, p, alpha, beta):
    """Ring all-reduce (reduce-scatter then all-gather around a ring):

        T = 2 (p - 1) alpha + 2 (p - 1) / p * n beta

    p - 1 steps of each phase, every step moving n / p bytes to a neighbour.
    Bandwidth-optimal, latency linear in p. Thakur, Rabenseifner & Gropp
    2005, "Optimization of Collective Communication Operations in MPICH",
    IJHPCA 19(1). p = 1 costs nothing.
    """
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


def tree_allreduce(n, p, alpha, beta):
    """Binomial-tree reduce to a root, then binomial-tree broadcast:

        T = 2 ceil(log2 p) (alpha + n beta)

    Each of the ceil(log2 p) rounds of either tree sends the whole n bytes
    (Thakur, Rabenseifner & Gropp 2005: binomial broadcast ceil(log2 p)
    (alpha + n beta)). Few messages, but every byte crosses 2 log2 p links:
    good for small n only.
    """
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * (alpha + n * beta)


def halving_doubling_allreduce(n, p, alpha, beta):
    """Rabenseifner's all-reduce: reduce-scatter by recursive halving, then
    all-gather by recursive doubling:

        T = 2 ceil(log2 p) alpha + 2 (p - 1) / p * n beta

    (Thakur, Rabenseifner & Gropp 2005; exact for p a power of two, the
    non-power-of-two fix-up steps are not counted). Ring bandwidth with
    logarithmic latency; the inter-server algorithm of Goyal et al. 2017.
    """
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha + 2 * (p - 1) / p * n * beta


def hierarchical_allreduce(n, nodes, per_node, alpha_intra, beta_intra, alpha_inter, beta_node):
    """Hierarchical ring all-reduce over `nodes` nodes of `per_node` devices:
    reduce-scatter inside each node (ring of g = per_node), ring all-reduce
    of each device's n / g shard across the m = nodes nodes (the g shards
    travel at once and share the node's network link, beta_node seconds per
    byte of the whole node), all-gather inside each node:

        T = 2 (g - 1) alpha_intra + 2 (g - 1) / g * n beta_intra
          + 2 (m - 1) alpha_inter + 2 (m - 1) / m * (n / g) * g beta_node

    The node link carries 2 (m - 1) / m n bytes however many devices the
    node has. The hierarchical all-reduce of Jia et al. 2018
    (arXiv:1807.11205), here with NCCL-style reduce-scatter / all-gather
    inside the node.
    """
    g, m = per_node, nodes
    intra = ring_allreduce(n, g, alpha_intra, beta_intra)
    inter = 2 * (m - 1) * alpha_inter + 2 * (m - 1) / m * n * beta_node if m > 1 else 0.0
    return intra + inter


def torus2d_allreduce(n, x, y, alpha_x, beta_x, alpha_y, beta_y):
    """2D-torus all-reduce over an x-by-y grid (Mikami et al. 2018,
    arXiv:1811.05233; Ying et al. 2018, arXiv:1811.06992): reduce-scatter
    along the x ("horizontal") rings, all-reduce of the n / x shards along
    the y ("vertical") rings, all-gather along the x rings:

        T = 2 (x - 1) alpha_x + 2 (x - 1) / x * n beta_x
          + 2 (y - 1) alpha_y + 2 (y - 1) / y * (n / x) beta_y

    2 (x - 1) + 2 (y - 1) messages instead of the flat ring's 2 (xy - 1).
    beta_y is per byte of one vertical ring; when the x rings of one node
    share its network link, pass x times the node's seconds per byte (then
    this equals `hierarchical_allreduce` with x = devices per node).
    """
    horizontal = ring_allreduce(n, x, alpha_x, beta_x)
    vertical = 2 * (y - 1) * alpha_y + 2 * (y - 1) / y * (n / x) * beta_y if y > 1 else 0.0
    return horizontal + vertical


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Devices, their grouping into nodes, and the links (SI units).

    intra_bandwidth: bytes/s between two devices of a node (one direction);
    inter_bandwidth: bytes/s of one node's network link, shared by its
    devices; latencies in seconds per message.
    """

    devices: int
    devices_per_node: int
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float
    algorithm: str = "hierarchical"
    torus_x: int = 0  # 0: devices_per_node when > 1, else the squarest grid

    @property
    def nodes(self):
        return self.devices // self.devices_per_node


def torus_shape(devices, devices_per_node, torus_x=0):
    """(x, y) of the 2D-torus grid: `torus_x` if given, else x = devices
    per node (rows are nodes) or, with one device per node, the largest
    divisor of `devices` not above its square root."""
    if torus_x:
        return torus_x, devices // torus_x
    if devices_per_node > 1:
        return devices_per_node, devices // devices_per_node
    x = max(d for d in range(1, math.isqrt(devices) + 1) if devices % d == 0)
    return x, devices // x


def allreduce_time(n, cluster):
    """Seconds to all-reduce n bytes over `cluster` with its algorithm.

    Flat algorithms (ring, tree, halving_doubling) on one node use the
    intra-node link. Across nodes every message pays the inter-node
    latency and the slower of the two links: the ring has one flow per node
    on the network link (the ring enters and leaves each node once), tree
    and halving-doubling have all g devices of a node sending at once (each
    gets 1/g of the node's link).
    """
    c = cluster
    g, m, p = c.devices_per_node, c.nodes, c.devices
    beta_intra, beta_node = 1 / c.intra_bandwidth, 1 / c.inter_bandwidth
    if c.algorithm == "hierarchical":
        return hierarchical_allreduce(
            n, m, g, c.intra_latency, beta_intra, c.inter_latency, beta_node
        )
    if c.algorithm == "torus2d":
        x, y = torus_shape(p, g, c.torus_x)
        if g > 1:  # x = g: the rows are nodes, the columns share the node link
            return torus2d_allreduce(
                n, x, y, c.intra_latency, beta_intra, c.inter_latency, x * beta_node
            )
        return torus2d_allreduce(n, x, y, c.inter_latency, beta_node, c.inter_latency, beta_node)
    if m == 1:
        alpha, beta = c.intra_latency, beta_intra
    elif c.algorithm == "ring":
        alpha, beta = c.inter_latency, max(beta_intra, beta_node)
    else:
        alpha, beta = c.inter_latency, max(beta_intra, g * beta_node)
    flat = {
        "ring": ring_allreduce,
        "tree": tree_allreduce,
        "halving_doubling": halving_doubling_allreduce,
    }[c.algorithm]
    return flat(n, p, alpha, beta)
