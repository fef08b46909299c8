"""The layout file: the planner's per-layer choice as the training tool runs it.

    keras-lars-plan --model=alexnet --devices=8 --global_batch_size=256 --layout_out=plan.json
    keras-lars-train --backend=jax --distribution=model_parallel --model=alexnet --layout=plan.json

    {"mesh": {"batch": 2, "model": 4},
     "layouts": {"fc6/kernel": ["model", null], "fc7/kernel": ["model", null]}}

`mesh`: the devices along each axis of a ("batch", "model") mesh (their
product: the devices of the run); `layouts`: {variable path regex: one mesh
axis or null a dimension}, keras.distribution.LayoutMap's keys and
TensorLayout axes (a path matches a regex when re.fullmatch does); the
variables no regex matches, and their optimizer slots, are replicated. A
regex ending in "/output" lays out the outputs of the layers it matches
(Keras relays a layer's output `<layer>/output` by the LayoutMap).
`read` checks a file against the model's variables and the devices and
says what is wrong in one line (ValueError).

Python's regular expressions backtrack: a pattern such as "([a-z]+)+!"
takes time exponential in the length of the path it fails on. `read`
refuses a pattern whose matching could try more than MATCH_LIMIT ways at
one position of a path as long as the model's longest variable path plus 32
characters, at least 64 (`match_ways`: nested or stacked repeats), and
backreferences, before any is matched, here or by Keras.
"""

import json
import re

from keras_lars.tools import storage

try:
    from re import _parser as _sre_parse  # Python 3.11 on
except ImportError:  # Python 3.10
    import sre_parse as _sre_parse

AXES = ("batch", "model")
MATCH_LIMIT = 1_000_000


def model_parallel_layouts(shapes, model_axis_size):
    """{variable path: layout} of the training tool's --distribution=model_parallel
    (the variables sharded over "model"), from {path: shape}: a convolution
    kernel (h, w, in, out) wider than 1x1 by its output channels, a dense
    kernel (in, out) by its input features, each only where `model_axis_size`
    divides that size."""
    layouts = {}
    for path, shape in shapes.items():
        if len(shape) == 4 and shape[0] * shape[1] > 1 and shape[3] % model_axis_size == 0:
            layouts[path] = (None, None, None, "model")
        elif len(shape) == 2 and shape[0] % model_axis_size == 0:
            layouts[path] = ("model", None)
    return layouts


def write(path, mesh, layouts):
    """Writes {mesh: {batch, model}, layouts} to `path` (JSON)."""
    plan = {"mesh": dict(zip(AXES, mesh)), "layouts": {k: list(v) for k, v in layouts.items()}}
    with open(path, "w") as f:
        json.dump(plan, f, indent=1)
        f.write("\n")


def _ways(items, longest):
    """An upper bound on the ways a backtracking matcher can try to match
    the parsed pattern `items` (re's parse tree) at one position of a text
    of `longest` characters: sequences multiply, alternatives add, a repeat
    of at most r of its body's w ways makes (r + 1) * w ** r. None for a
    construct that has no bound (a backreference)."""
    total = 1
    for op, value in items:
        name = getattr(op, "name", str(op))
        if name in ("LITERAL", "NOT_LITERAL", "ANY", "IN", "AT"):
            ways = 1
        elif name == "SUBPATTERN":
            ways = _ways(value[-1], longest)
        elif name == "ATOMIC_GROUP":
            ways = _ways(value, longest)
        elif name in ("ASSERT", "ASSERT_NOT"):
            ways = _ways(value[1], longest)
        elif name == "BRANCH":
            branches = [_ways(branch, longest) for branch in value[1]]
            ways = None if None in branches else sum(branches)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, body = value
            inner, repeats = _ways(body, longest), min(high, longest)
            if inner is None:
                return None
            if inner > 1 and repeats * (inner - 1).bit_length() > 64:
                ways = 2**64
            else:
                ways = (repeats - min(low, repeats) + 1) * inner**repeats
        else:  # GROUPREF, GROUPREF_EXISTS: backreferences
            return None
        if ways is None:
            return None
        total = min(total * ways, 2**64)
    return total


def match_ways(pattern, longest):
    """`_ways` of the regular expression `pattern` (re.error if it is not one)."""
    return _ways(_sre_parse.parse(pattern), longest)


def read(path, shapes, devices):
    """((batch, model), {regex: tuple of axes}) from the file at `path`,
    checked against {variable path: shape} and the number of devices."""
    special = storage.special_file(path)
    if special:
        raise ValueError(f"cannot read it: it is {special}, not a file")
    try:
        with open(path) as f:
            plan = json.load(f)
    except OSError as error:
        raise ValueError(f"cannot read it: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(plan, dict) or set(plan) != {"mesh", "layouts"}:
        raise ValueError('must hold {"mesh": {"batch": b, "model": m}, "layouts": {...}} only')
    mesh = plan["mesh"]
    if not isinstance(mesh, dict) or set(mesh) != set(AXES):
        raise ValueError(f'"mesh" must give "batch" and "model", not {mesh!r}')
    sizes = tuple(mesh[axis] for axis in AXES)
    whole = (isinstance(size, int) and not isinstance(size, bool) for size in sizes)
    if not all(ok and size >= 1 for ok, size in zip(whole, sizes)):
        raise ValueError(f'"mesh" sizes must be positive integers, not {mesh!r}')
    if sizes[0] * sizes[1] != devices:
        raise ValueError(
            f"mesh batch {sizes[0]} x model {sizes[1]} needs {sizes[0] * sizes[1]} devices; "
            f"the run has {devices}"
        )
    if not isinstance(plan["layouts"], dict):
        raise ValueError(
            f'"layouts" must be an object {{"variable path regex": [axis or null, ...]}}, '
            f"not {plan['layouts']!r}"
        )
    # Keras matches the patterns against longer paths too (optimizer slots, layer outputs).
    longest = max(64, max(map(len, shapes), default=0) + 32)
    layouts = {}
    for pattern, axes in plan["layouts"].items():
        layouts[pattern] = _checked(pattern, axes, shapes, dict(zip(AXES, sizes)), longest)
    return sizes, layouts


def _checked(pattern, axes, shapes, sizes, longest):
    """The axes of one layout, after checking them against every variable
    its regex matches."""
    try:
        regex = re.compile(pattern)
        ways = match_ways(pattern, longest)
    except re.error as error:
        raise ValueError(f'"{pattern}": not a regular expression ({error})') from None
    if ways is None:
        raise ValueError(f'"{pattern}": backreferences are not supported')
    if ways > MATCH_LIMIT:
        raise ValueError(
            f'"{pattern}": may take too long to match (over {MATCH_LIMIT:,} ways to try at '
            f"each position of a path of up to {longest} characters: nested or stacked "
            "repeats such as (x+)+ or .*.*.*.*); write a simpler pattern"
        )
    if not isinstance(axes, list) or any(a is not None and a not in AXES for a in axes):
        raise ValueError(f'"{pattern}": {axes!r} must list "batch", "model" or null per dimension')
    twice = [axis for axis in AXES if axes.count(axis) > 1]
    if twice:
        raise ValueError(
            f'"{pattern}": {axes!r} names "{twice[0]}" twice (a mesh axis lays out one dimension)'
        )
    if pattern.endswith("/output"):  # layers' outputs: their shapes are not checked here
        return tuple(axes)
    matched = {path: shape for path, shape in shapes.items() if regex.fullmatch(path)}
    if not matched:
        raise ValueError(f'"{pattern}" matches no variable of the model')
    for path, shape in matched.items():
        if len(axes) != len(shape):
            raise ValueError(f'"{pattern}": {axes} has {len(axes)} entries, {path} is {shape}')
        for size, axis in zip(shape, axes):
            if axis and size % sizes[axis]:
                raise ValueError(
                    f'"{pattern}": {path} {shape} does not divide over {axis} '
                    f"({sizes[axis]} devices): {size} is not a multiple"
                )
    return tuple(axes)
