"""The planner's collective bytes against the training tool's compiled step.

    python -m keras_lars.tools.plan.hlo_bytes                 # the table of docs/planning.md
    python -m keras_lars.tools.plan.hlo_bytes --json alexnet:model_parallel:8:2:224:256

A case is model:layout:devices:model_axis_size:image_size:global_batch_size,
the layout data_parallel, model_parallel or hybrid (--layout_file=plan.json,
else the planner's --layout_out for the case). Each is compiled in a child
process on that many simulated CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count, KERAS_BACKEND=jax): the
tool's own model, optimizer (LARS), loss and metrics (tools/train/build.py)
and its keras.distribution (tools/train/runtime_jax.make_devices), the
Keras train step jitted as Keras jits it, lowered on abstract arrays laid
out as Keras lays out the variables and their optimizer slots (nothing is
allocated: ResNet-50 replicated on 64 devices would need 13 GB), and
compiled. hlo.bytes_moved reads the optimized HLO; collectives.layout_bytes
is the planner's prediction.
"""

import json
import os
import subprocess
import sys
import tempfile

from keras_lars.tools.plan import cli
from keras_lars.tools.plan import hlo
from keras_lars.tools.plan.collectives import layout_bytes
from keras_lars.tools.plan.collectives import plan_layout

CLASSES = 1000
# The cases of docs/planning.md's table: (model, layout, devices, model axis, image, batch).
TABLE = (
    ("alexnet", "data_parallel", 8, 1, 224, 256),
    ("alexnet", "model_parallel", 8, 4, 224, 256),
    ("alexnet", "hybrid", 8, 0, 224, 256),
    ("alexnet", "data_parallel", 16, 1, 224, 512),
    ("alexnet", "model_parallel", 16, 4, 224, 512),
    ("alexnet", "data_parallel", 64, 1, 224, 2048),
    ("alexnet", "model_parallel", 64, 8, 224, 2048),
    ("resnet50", "data_parallel", 8, 1, 224, 256),
    ("resnet50", "model_parallel", 8, 2, 224, 256),
    ("resnet50", "data_parallel", 16, 1, 224, 512),
    ("resnet50", "model_parallel", 16, 2, 224, 512),
    ("resnet50", "data_parallel", 64, 1, 224, 2048),
    ("resnet50", "model_parallel", 64, 8, 224, 2048),
)


class RefusedError(RuntimeError):
    """This Keras runs no keras.distribution in the tool (below 3.10):
    `by_case` {case: the tool's reason}."""

    def __init__(self, by_case):
        super().__init__(next(iter(by_case.values())))
        self.by_case = by_case


def parse_case(text):
    model, layout, devices, axis, image, batch = text.split(":")
    return model, layout, int(devices), int(axis), int(image), int(batch)


def case_text(case):
    return ":".join(str(part) for part in case)


def _abstract_state(model, distribution):
    """The train step's state as jax.ShapeDtypeStructs with the shardings
    Keras gives the variables under `distribution`: a model variable its
    layout, an optimizer slot its reference variable's (Keras's
    add_variable_from_reference passes the reference's layout; the slot is
    named `<optimizer>/<reference path with _>_<slot>`), anything else
    replicated (the distribution's default)."""
    import jax

    def struct(variable, layout):
        return jax.ShapeDtypeStruct(
            tuple(variable.shape), variable.dtype, sharding=layout.backend_layout
        )

    def own(variable):
        return struct(variable, distribution.get_variable_layout(variable))

    references = {v.path.replace("/", "_") + "_": v for v in model.trainable_variables}

    def slot(variable):
        name = variable.path.split("/", 1)[-1]
        found = [
            prefix
            for prefix, reference in references.items()
            if name.startswith(prefix) and tuple(reference.shape) == tuple(variable.shape)
        ]
        if not found:
            return own(variable)
        reference = references[max(found, key=len)]
        return struct(variable, distribution.get_variable_layout(reference))

    return (
        [own(v) for v in model.trainable_variables],
        [own(v) for v in model.non_trainable_variables],
        [slot(v) for v in model.optimizer.variables],
        [own(v) for v in model.metrics_variables],
    )


def compiled_text(case, layout_file=""):
    """The optimized HLO text of the tool's train step for `case` (call in
    a process whose JAX has the case's devices)."""
    import jax
    import keras
    import numpy as np

    import keras_lars
    from keras_lars import compat
    from keras_lars.tools.train import build
    from keras_lars.tools.train import config as train_config
    from keras_lars.tools.train import runtime_jax

    model_name, layout, devices, axis, image, batch = case
    assert len(jax.devices()) == devices, (jax.devices(), devices)
    settings = {"distribution": layout, "model_axis_size": max(axis, 1)}
    if layout == "hybrid":
        settings = {"distribution": "model_parallel", "layout": layout_file}
    config = train_config.Config(
        backend="jax",
        model=model_name,
        image_size=image,
        global_batch_size=batch,
        optimizer="lars",
        **settings,
    )
    runtime_jax.make_devices(config, lambda: build.variable_shapes(config, CLASSES))
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)  # built on one device, laid out abstractly
    model = build.compiled_model(config, CLASSES, keras_lars.WarmupPolyDecay(0.1, 10, 100))
    images = np.zeros((2, image, image, 3), "float32")
    model._symbolic_build(data_batch=(images, np.zeros((2,), "int32")))
    keras.distribution.set_distribution(distribution)
    state = _abstract_state(model, distribution)
    data = (
        jax.ShapeDtypeStruct(
            (batch, image, image, 3),
            "float32",
            sharding=distribution.get_data_layout((batch, image, image, 3)).backend_layout,
        ),
        jax.ShapeDtypeStruct(
            (batch,), "int32", sharding=distribution.get_data_layout((batch,)).backend_layout
        ),
    )
    shardings = tuple([array.sharding for array in part] for part in state)
    compat.record_state_shardings(model, shardings)  # Keras 3.10-3.11 read them
    step = jax.jit(model.train_step, donate_argnums=0, out_shardings=(None, shardings))
    text = step.lower(state, data).compile().as_text()
    keras.distribution.set_distribution(None)
    return text


def child(cases, layout_file=""):
    """Compiles each case (all with the same devices) here; JSON lines out."""
    import time

    from keras_lars import compat

    for case in cases:
        problem = compat.distribution_problem("data" if case[1] == "data_parallel" else "model")
        if problem:  # below Keras 3.10 the tool refuses keras.distribution
            print(json.dumps({"case": case_text(case), "refused": problem}))
            continue
        start = time.perf_counter()
        try:
            text = compiled_text(case, layout_file)
        except compat.UnsupportedVersionError as error:
            print(json.dumps({"case": case_text(case), "refused": str(error)}))
            continue
        compile_seconds = time.perf_counter() - start
        moved = hlo.bytes_moved(text, case[2])
        print(json.dumps({"case": case_text(case), "compiled": moved, "seconds": compile_seconds}))
        sys.stdout.flush()


# LLVM's optimisations off: only the optimized HLO is read, whose collectives
# XLA's HLO passes (SPMD partitioning, fusion, the combiners) place before
# code generation. Measured 2026-12-07 (jax 0.10.2, 2 loaded cores): the same
# bytes in every case of tests/test_plan_hlo.py, ResNet-50 model parallel on 8
# devices compiled in 26 s instead of 57.
FAST_CODEGEN = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def compile_cases(cases, layout_file="", timeout=1800):
    """{case: ({kind: compiled bytes}, seconds)}, one child process per
    device count."""
    results, refused = {}, {}
    for devices in sorted({case[2] for case in cases}):
        group = [case for case in cases if case[2] == devices]
        env = dict(
            os.environ,
            KERAS_BACKEND="jax",
            JAX_PLATFORMS="cpu",
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_CODEGEN}",
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        command = [sys.executable, "-m", "keras_lars.tools.plan.hlo_bytes", "--child"]
        command += [f"--layout_file={layout_file}"] if layout_file else []
        command += [case_text(case) for case in group]
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode:
            raise RuntimeError(f"compiling {group} failed:\n{done.stderr[-3000:]}")
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                if "refused" in row:
                    refused[parse_case(row["case"])] = row["refused"]
                else:
                    results[parse_case(row["case"])] = (row["compiled"], row["seconds"])
    if refused:
        raise RefusedError(refused)
    return results


def planned(case, layout_file=""):
    """{kind: bytes} the planner predicts for `case`."""
    model_name, layout, devices, axis, image, batch = case
    if layout == "hybrid":
        with open(layout_file) as f:
            plan = json.load(f)
        mesh, layouts = plan["mesh"], plan["layouts"]
        return layout_bytes(model_name, image, batch, (mesh["batch"], mesh["model"]), layouts)
    mesh = (devices, 1) if layout == "data_parallel" else (devices // axis, axis)
    layouts = plan_layout(model_name, image, layout, mesh[1])
    return layout_bytes(model_name, image, batch, mesh, layouts)


def table(results, layout_file=""):
    """Markdown: planned and compiled MB a device sends a step, per case."""
    lines = [
        "| model | layout | devices | mesh (batch x model) | image | batch | planned MB | "
        "compiled MB | difference | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, (compiled, seconds) in results.items():
        model_name, layout, devices, axis, image, batch = case
        plan = planned(case, layout_file)
        p, c = sum(plan.values()), sum(compiled.values())
        if layout == "hybrid":
            with open(layout_file) as f:
                mesh = " x ".join(str(size) for size in json.load(f)["mesh"].values())
        else:
            mesh = f"{devices // axis} x {axis}"
        lines.append(
            f"| {model_name} | {layout} | {devices} | {mesh} | {image} | {batch:,} | "
            f"{p / 1e6:.2f} | {c / 1e6:.2f} | {p / c - 1:+.2%} | {seconds:.0f} |"
        )
    return "\n".join(lines)


def main(argv):
    layout_file = next((a.split("=", 1)[1] for a in argv if a.startswith("--layout_file=")), "")
    cases = [parse_case(a) for a in argv if not a.startswith("--")]
    if "--child" in argv:
        child(cases, layout_file)
        return
    cases = cases or list(TABLE)
    hybrid = [case for case in cases if case[1] == "hybrid"]
    if hybrid and not layout_file:  # the planner's layout for the (first) hybrid case
        model_name, _, devices, _, image, batch = hybrid[0]
        layout_file = os.path.join(tempfile.mkdtemp(), "plan.json")
        options = cli.PlanSettings(
            model=model_name,
            devices=devices,
            image_size=image,
            global_batch_size=batch,
            layout_out=layout_file,
        )
        cli.layout_out_text(options)
    results = compile_cases(cases, layout_file)
    if "--json" in argv:
        rows = {
            case_text(c): {"compiled": v[0], "planned": planned(c, layout_file)}
            for c, v in results.items()
        }
        print(json.dumps(rows))
    else:
        print(table(results, layout_file))


if __name__ == "__main__":
    main(sys.argv[1:])
