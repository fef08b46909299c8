"""The bytes the collectives of a compiled XLA program move, read from its
optimized HLO text (`jax.jit(f).lower(...).compile().as_text()`).

The convention, which the planner's `collectives` module shares: bytes
moved = the bytes one device sends in one step when every collective runs
its bandwidth-optimal algorithm (ring; Thakur, Rabenseifner & Gropp 2005),
over a group of g devices, n = the bytes of one device's buffer:

    all-reduce          2 (g - 1) / g * n      (reduce-scatter + all-gather)
    reduce-scatter      (g - 1) / g * n        (n: its input)
    all-gather          (g - 1) / g * n        (n: its output)
    all-to-all          (g - 1) / g * n
    collective-permute  n

The HLO of an SPMD program has per-device shapes, so n is read off the
instruction's result type (a tuple: the sum of its elements); g from its
replica groups. The same convention applied to the planner's gradients
gives its 2 (p - 1) / p * P s_g.
"""

import dataclasses
import math
import re

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
}
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")

# `%name = <result type> <kind>(` or `<kind>-start(` (async pairs: the start
# carries the operands; its -done is not counted again).
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>.+?)\s+"
    r"(?P<kind>all-reduce|reduce-scatter|all-gather|all-to-all|collective-permute)"
    r"(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction: its kind, the devices of one group and
    the bytes of one device's buffer (the input of a reduce-scatter, the
    output otherwise)."""

    kind: str
    group: int
    buffer_bytes: int

    @property
    def bytes_moved(self):
        """Bytes one device sends (the module docstring's table)."""
        g, n = self.group, self.buffer_bytes
        if self.kind == "collective-permute":
            return float(n)
        factor = 2 if self.kind == "all-reduce" else 1
        return factor * (g - 1) / g * n


def array_bytes(type_text):
    """Bytes of the arrays in an HLO type (`f32[8,3]{1,0}` or a tuple)."""
    total = 0
    for dtype, dims in _ARRAY.findall(type_text):
        if dtype not in DTYPE_BYTES:
            continue
        total += DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def group_size(line, devices):
    """Devices in one replica group of the instruction on `line`.

    XLA prints the groups as explicit lists `{{0,1},{2,3}}`, as an iota
    `[groups,size]<=[...]`, or over a named mesh `mesh['a'=2,'b'=4] {'b'}`;
    none (`{}`) means all `devices`."""
    named = re.search(
        r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(\[[\d,]*\](?:T\([\d,]*\))?\))?"
        r"\s*\{([^}]*)\}",
        line,
    )
    if named:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", named.group(1)))
        axes = re.findall(r"'([^']+)'", named.group(2))
        return math.prod(int(sizes[a]) for a in axes) if axes else devices
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if iota:
        return int(iota.group(2))
    listed = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if listed:
        return len(listed.group(1).split(","))
    return devices


def collectives(hlo_text, devices):
    """The Collectives of an HLO module's text (`devices`: the program's,
    for instructions without replica groups)."""
    found = []
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        kind, result = match.group("kind"), match.group("type")
        if match.group("start") and kind in ("all-gather", "collective-permute"):
            # async: the start returns (its input, its output): count the output
            dtype, dims = _ARRAY.findall(result)[-1]
            result = f"{dtype}[{dims}]"
        size, group = array_bytes(result), group_size(line, devices)
        if kind == "reduce-scatter":
            size *= group  # the result is one group member's share of the input
        found.append(Collective(kind, group, size))
    return found


def bytes_moved(hlo_text, devices):
    """{kind: bytes one device sends a step} of an HLO module (every kind
    of KINDS, 0.0 where absent)."""
    totals = dict.fromkeys(KINDS, 0.0)
    for collective in collectives(hlo_text, devices):
        totals[collective.kind] += collective.bytes_moved
    return totals
