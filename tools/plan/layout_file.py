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
"""

import json
import re

AXES = ("batch", "model")


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


def read(path, shapes, devices):
    """((batch, model), {regex: tuple of axes}) from the file at `path`,
    checked against {variable path: shape} and the number of devices."""
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
    if not all(isinstance(size, int) and size >= 1 for size in sizes):
        raise ValueError(f'"mesh" sizes must be positive integers, not {mesh!r}')
    if sizes[0] * sizes[1] != devices:
        raise ValueError(
            f"mesh batch {sizes[0]} x model {sizes[1]} needs {sizes[0] * sizes[1]} devices; "
            f"the run has {devices}"
        )
    layouts = {}
    for pattern, axes in dict(plan["layouts"]).items():
        layouts[pattern] = _checked(pattern, axes, shapes, dict(zip(AXES, sizes)))
    return sizes, layouts


def _checked(pattern, axes, shapes, sizes):
    """The axes of one layout, after checking them against every variable
    its regex matches."""
    try:
        regex = re.compile(pattern)
    except re.error as error:
        raise ValueError(f'"{pattern}": not a regular expression ({error})') from None
    if not isinstance(axes, list) or any(a is not None and a not in AXES for a in axes):
        raise ValueError(f'"{pattern}": {axes!r} must list "batch", "model" or null per dimension')
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
