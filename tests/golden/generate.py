"""Writes the golden trajectories of the upstream LARS and LAMB implementations.

Not part of CI: each subcommand runs the real upstream code in a virtual
environment of its own (README.md beside this file lists them):

    python generate.py inputs                 # numpy only: inputs.npz
    python generate.py tfa                    # tensorflow-addons LAMB (TF 2.15)
    python generate.py models                 # tf-models-official LARS (TF 2.15)
    python generate.py tpu --source FILE --commit SHA    # tensorflow/tpu LARSOptimizer
    python generate.py timm                   # timm Lars (torch CPU)
    python generate.py optax                  # optax.lars (jax CPU)
    python generate.py larc --source FILE --commit SHA   # NVIDIA apex LARC

Every peer file `<peer>__<mode>.npz` holds `w/<name>`, the weights after every
step (shape (STEPS, ...)), and `meta`, a JSON string: the peer, the mode, the
upstream package and version (or repository, path, commit and sha256 of the
file), the Python/framework versions, the upstream constructor arguments, and
which variables the upstream run left out of weight decay / layer adaptation.
"""

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import sys
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
INPUTS = HERE / "inputs.npz"

# name -> shape. "zero/kernel" starts at 0 (||w|| = 0); "dense/kernel" gets a
# zero gradient at ZERO_GRADIENT_STEP (||g|| = 0).
SHAPES = {
    "conv/kernel": (3, 3, 4, 8),
    "conv/bias": (8,),
    "bn/gamma": (8,),
    "dense/kernel": (32, 10),
    "zero/kernel": (6, 5),
}
STEPS = 10
ZERO_GRADIENT_STEP = 3
SEED = 20261130

# Shared hyperparameters (the test reads them back from each file's meta).
MOMENTUM = 0.9
WEIGHT_DECAY = 0.01
TRUST_COEFFICIENT = 0.01  # eta: 0.01 makes a step ~1-5% of ||w||, visible in float32
EXCLUDE = ["bias", "gamma"]


# ----------------------------------------------------------------------------
# inputs


def _warmup_decay(low, peak, steps, warmup):
    """Linear warmup low -> peak over `warmup` steps, then quadratic decay."""
    values = []
    for k in range(steps):
        if k < warmup:
            values.append(low + (peak - low) * k / warmup)
        else:
            fraction = (k - warmup) / (steps - warmup)
            values.append(low + (peak - low) * (1.0 - fraction) ** 2)
    return np.array(values, np.float32)


def make_inputs():
    rng = np.random.default_rng(SEED)
    weight_scale = {
        "conv/kernel": 0.2,
        "conv/bias": 0.1,
        "bn/gamma": 0.1,
        "dense/kernel": 0.2,
        "zero/kernel": 0.0,
    }
    # conv/kernel gets small gradients: its LARS trust ratio (~0.2) exceeds
    # the smallest learning rates, so LARC/timm clipping binds on it.
    gradient_scale = {
        "conv/kernel": 0.01,
        "conv/bias": 0.05,
        "bn/gamma": 0.05,
        "dense/kernel": 0.05,
        "zero/kernel": 0.05,
    }
    arrays = {}
    for name, shape in SHAPES.items():
        w = rng.normal(0.0, 1.0, shape) * weight_scale[name]
        if name == "bn/gamma":
            w = w + 1.0
        arrays[f"w0/{name}"] = w.astype(np.float32)
    for name, shape in SHAPES.items():
        g = rng.normal(0.0, gradient_scale[name], (STEPS, *shape))
        if name == "dense/kernel":
            g[ZERO_GRADIENT_STEP] = 0.0
        arrays[f"g/{name}"] = g.astype(np.float32)
    arrays["lr_lars"] = _warmup_decay(0.1, 2.0, STEPS, warmup=4)
    arrays["lr_lamb"] = _warmup_decay(1e-3, 1e-2, STEPS, warmup=4)
    meta = {
        "seed": SEED,
        "steps": STEPS,
        "zero_gradient_step": ZERO_GRADIENT_STEP,
        "zero_gradient_variable": "dense/kernel",
        "zero_weight_variable": "zero/kernel",
        "numpy": np.__version__,
    }
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    np.savez(INPUTS, **arrays)
    print(f"wrote {INPUTS.name}: lr_lars={arrays['lr_lars']}, lr_lamb={arrays['lr_lamb']}")


def load_inputs():
    with np.load(INPUTS) as data:
        w0 = {name: data[f"w0/{name}"] for name in SHAPES}
        g = {name: data[f"g/{name}"] for name in SHAPES}
        return w0, g, data["lr_lars"], data["lr_lamb"]


# ----------------------------------------------------------------------------
# writing


def _versions(*packages):
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for package in packages:
        versions[package] = importlib.metadata.version(package)
    return versions


def _source_record(path, repository, repository_path, commit):
    data = Path(path).read_bytes()
    return {
        "repository": repository,
        "path": repository_path,
        "commit": commit,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def save(peer, mode, trajectory, meta):
    """trajectory: name -> list of STEPS arrays (weights after each step)."""
    arrays = {f"w/{name}": np.stack(trajectory[name]).astype(np.float32) for name in SHAPES}
    for name in SHAPES:
        assert arrays[f"w/{name}"].shape == (STEPS, *SHAPES[name]), name
        assert np.all(np.isfinite(arrays[f"w/{name}"])), name
    meta = dict(meta, peer=peer, mode=mode, steps=STEPS, platform=platform.platform())
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    path = HERE / f"{peer}__{mode}.npz"
    np.savez(path, **arrays)
    print(f"wrote {path.name}")


# ----------------------------------------------------------------------------
# TensorFlow 2.15 / Keras 2 peers (tensorflow-addons, tf-models-official)


def _run_keras2(optimizer, learning_rates):
    import tensorflow as tf

    w0, g, _, _ = load_inputs()
    variables = [tf.Variable(w0[name], name=name) for name in SHAPES]
    trajectory = {name: [] for name in SHAPES}
    for k in range(STEPS):
        optimizer.learning_rate = float(learning_rates[k])  # a float32 value, exactly
        grads = [tf.constant(g[name][k]) for name in SHAPES]
        optimizer.apply_gradients(zip(grads, variables))
        for name, variable in zip(SHAPES, variables):
            trajectory[name].append(variable.numpy())
    return trajectory, variables


def run_tfa():
    import tensorflow_addons as tfa

    _, _, _, lr = load_inputs()
    modes = {
        # Decay excluded by name; layer adaptation falls back to that list.
        "decay": dict(weight_decay=WEIGHT_DECAY, exclude_from_weight_decay=EXCLUDE),
        # No decay, no exclusion: every variable adapted.
        "no_decay": dict(weight_decay=0.0),
        # Separate lists: bias/gamma not decayed but adapted; zero not adapted.
        "separate_lists": dict(
            weight_decay=WEIGHT_DECAY,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=["zero"],
        ),
        # The truthiness trap: [] means "fall back to the decay list" in tfa.
        "empty_adaptation_list": dict(
            weight_decay=WEIGHT_DECAY,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=[],
        ),
    }
    for mode, kwargs in modes.items():
        arguments = dict(
            learning_rate=float(lr[0]), beta_1=0.9, beta_2=0.999, epsilon=1e-6, **kwargs
        )
        optimizer = tfa.optimizers.LAMB(**arguments)
        trajectory, variables = _run_keras2(optimizer, lr)
        names = dict(zip(SHAPES, variables))
        meta = {
            "upstream": "tensorflow_addons.optimizers.LAMB",
            "versions": _versions("tensorflow-addons", "tensorflow-cpu", "tensorflow", "keras"),
            "arguments": dict(arguments, learning_rate="lr_lamb[step]"),
            "learning_rate": "lr_lamb, set with optimizer.learning_rate = lr before each step",
            "excluded_from_weight_decay": [
                n for n in SHAPES if not optimizer._do_use_weight_decay(names[n])
            ],
            "excluded_from_layer_adaptation": [
                n for n in SHAPES if not optimizer._do_layer_adaptation(names[n])
            ],
            "variable_names": "tf.Variable(name=<name>): '<name>:0'",
        }
        save("tfa_lamb", mode, trajectory, meta)


def run_models():
    from official.modeling.optimization import lars

    _, _, lr, _ = load_inputs()
    for classic in (True, False):
        for nesterov in (False, True):
            mode = ("classic" if classic else "nonclassic") + ("_nesterov" if nesterov else "")
            arguments = dict(
                learning_rate=float(lr[0]),
                momentum=MOMENTUM,
                weight_decay_rate=WEIGHT_DECAY,
                eeta=TRUST_COEFFICIENT,
                nesterov=nesterov,
                classic_momentum=classic,
                exclude_from_weight_decay=EXCLUDE,
                exclude_from_layer_adaptation=None,
            )
            optimizer = lars.LARS(**arguments)
            trajectory, variables = _run_keras2(optimizer, lr)
            names = {n: v.name for n, v in zip(SHAPES, variables)}
            meta = {
                "upstream": "official.modeling.optimization.lars.LARS",
                "versions": _versions(
                    "tf-models-official", "tensorflow-cpu", "tensorflow", "keras"
                ),
                "arguments": dict(arguments, learning_rate="lr_lars[step]"),
                "learning_rate": "lr_lars, set with optimizer.learning_rate = lr before each step",
                "excluded_from_weight_decay": [
                    n for n in SHAPES if not optimizer._use_weight_decay(names[n])
                ],
                "excluded_from_layer_adaptation": [
                    n for n in SHAPES if not optimizer._do_layer_adaptation(names[n])
                ],
                "variable_names": "tf.Variable(name=<name>): '<name>:0'",
            }
            save("models_lars", mode, trajectory, meta)


def _load_file_as_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tpu(source, commit):
    """tensorflow/tpu's LARSOptimizer (a tf.compat.v1 optimizer), in a v1 graph."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    module = _load_file_as_module(source, "tpu_lars_optimizer")
    w0, g, lr, _ = load_inputs()
    modes = {
        "skip": dict(skip_list=EXCLUDE, use_nesterov=False),
        "skip_nesterov": dict(skip_list=EXCLUDE, use_nesterov=True),
        "no_skip": dict(skip_list=None, use_nesterov=False),
    }
    for mode, kwargs in modes.items():
        arguments = dict(
            momentum=MOMENTUM,
            weight_decay=WEIGHT_DECAY,
            eeta=TRUST_COEFFICIENT,
            epsilon=0.0,
            **kwargs,
        )
        graph = tf.Graph()
        with graph.as_default():
            variables = [
                tf1.Variable(w0[name], name=name, use_resource=True, dtype=tf.float32)
                for name in SHAPES
            ]
            rate = tf1.placeholder(tf.float32, [], name="learning_rate")
            grads = [tf1.placeholder(tf.float32, SHAPES[name]) for name in SHAPES]
            optimizer = module.LARSOptimizer(learning_rate=rate, **arguments)
            train = optimizer.apply_gradients(zip(grads, variables))
            init = tf1.global_variables_initializer()
            var_names = {n: v.name for n, v in zip(SHAPES, variables)}
            trajectory = {name: [] for name in SHAPES}
            with tf1.Session(graph=graph) as session:
                session.run(init)
                for k in range(STEPS):
                    feed = {rate: lr[k]}
                    feed.update({p: g[name][k] for p, name in zip(grads, SHAPES)})
                    session.run(train, feed)
                    for name, value in zip(SHAPES, session.run(variables)):
                        trajectory[name].append(value)

        # compute_lr's own test: skip_list is None or no entry is a substring.
        skip_list = kwargs["skip_list"] or []
        skipped = [n for n in SHAPES if any(s in var_names[n] for s in skip_list)]

        meta = {
            "upstream": "LARSOptimizer from tensorflow/tpu (the MLPerf ResNet-50 reference)",
            "source": _source_record(
                source, "tensorflow/tpu", "models/official/efficientnet/lars_optimizer.py", commit
            ),
            "versions": _versions("tensorflow-cpu", "tensorflow"),
            "arguments": dict(arguments, learning_rate="lr_lars[step] (placeholder)"),
            "learning_rate": "lr_lars, fed through a placeholder each step",
            "run": "tf.compat.v1 graph + Session, resource variables (ResourceApplyMomentum)",
            "excluded_from_weight_decay": skipped,
            "excluded_from_layer_adaptation": skipped,
            "variable_names": "tf.compat.v1.Variable(name=<name>): '<name>:0'",
        }
        save("tpu_lars", mode, trajectory, meta)


# ----------------------------------------------------------------------------
# PyTorch peers (timm, apex LARC)


def _run_torch(make_optimizer, learning_rates):
    """make_optimizer(params: name -> Parameter) -> optimizer. Rank <= 1
    parameters go in a second group with weight_decay=0."""
    import torch

    w0, g, _, _ = load_inputs()
    params = {name: torch.nn.Parameter(torch.tensor(w0[name])) for name in SHAPES}
    optimizer = make_optimizer(params)
    trajectory = {name: [] for name in SHAPES}
    for k in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = float(learning_rates[k])
        for name, p in params.items():
            p.grad = torch.tensor(g[name][k])
        optimizer.step()
        for name, p in params.items():
            trajectory[name].append(p.detach().numpy().copy())
    return trajectory


def _param_groups(params, rank_one_weight_decay):
    return [
        {"params": [p for n, p in params.items() if len(SHAPES[n]) > 1]},
        {
            "params": [p for n, p in params.items() if len(SHAPES[n]) <= 1],
            "weight_decay": rank_one_weight_decay,
        },
    ]


def _import_timm_lars():
    """timm/optim/lars.py (and its _helpers.py) from the installed wheel,
    without timm/__init__.py, which imports torchvision (the CPU torch from
    the registry has no matching CPU torchvision wheel)."""
    spec = importlib.util.find_spec("timm")
    package = types.ModuleType("timm_optim_only")
    package.__path__ = [str(Path(spec.submodule_search_locations[0]) / "optim")]
    sys.modules["timm_optim_only"] = package
    return importlib.import_module("timm_optim_only.lars")


def run_timm():
    lars = _import_timm_lars()
    _, _, lr, _ = load_inputs()
    modes = {
        "plain": dict(nesterov=False, trust_clip=False),
        "nesterov": dict(nesterov=True, trust_clip=False),
        "clip": dict(nesterov=False, trust_clip=True),
        "clip_nesterov": dict(nesterov=True, trust_clip=True),
        "always_adapt": dict(nesterov=False, trust_clip=False, always_adapt=True),
    }
    for mode, kwargs in modes.items():
        arguments = dict(
            lr=float(lr[0]),
            momentum=MOMENTUM,
            weight_decay=WEIGHT_DECAY,
            trust_coeff=TRUST_COEFFICIENT,
            eps=1e-8,
            **kwargs,
        )

        def make(params, arguments=arguments):
            return lars.Lars(_param_groups(params, 0.0), **arguments)

        trajectory = _run_torch(make, lr)
        always = kwargs.get("always_adapt", False)
        meta = {
            "upstream": "timm.optim.Lars (timm/optim/lars.py)",
            "versions": _versions("timm", "torch"),
            "arguments": dict(arguments, lr="lr_lars[step]"),
            "param_groups": "rank > 1: defaults; rank <= 1: weight_decay=0",
            "learning_rate": "lr_lars, set in every param group before each step",
            "run": "foreach=None resolves to the single-tensor path on CPU",
            "zero_norm_steps": "ratio 1 where ||w|| or ||g|| is 0, then trust_clip's "
            "min(ratio / lr, 1) on it too",
            "excluded_from_weight_decay": [n for n in SHAPES if len(SHAPES[n]) <= 1],
            "excluded_from_layer_adaptation": [
                n for n in SHAPES if len(SHAPES[n]) <= 1 and not always
            ],
        }
        save("timm_lars", mode, trajectory, meta)


def run_larc(source, commit):
    import torch

    module = _load_file_as_module(source, "apex_larc")
    _, _, lr, _ = load_inputs()
    for mode in ("scale", "clip"):
        sgd_arguments = dict(lr=float(lr[0]), momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        larc_arguments = dict(trust_coefficient=TRUST_COEFFICIENT, clip=mode == "clip", eps=1e-8)

        def make(params, sgd_arguments=sgd_arguments, larc_arguments=larc_arguments):
            sgd = torch.optim.SGD(_param_groups(params, 0.0), **sgd_arguments)
            return module.LARC(sgd, **larc_arguments)

        trajectory = _run_torch(make, lr)
        meta = {
            "upstream": "apex.parallel.LARC wrapping torch.optim.SGD",
            "source": _source_record(source, "NVIDIA/apex", "apex/parallel/LARC.py", commit),
            "versions": _versions("torch"),
            "arguments": {
                "SGD": dict(sgd_arguments, lr="lr_lars[step]"),
                "LARC": larc_arguments,
            },
            "param_groups": "rank > 1: defaults; rank <= 1: weight_decay=0",
            "learning_rate": "lr_lars, set in every param group before each step",
            "run": "LARC.py alone (it imports only torch), CPU",
            "excluded_from_weight_decay": [n for n in SHAPES if len(SHAPES[n]) <= 1],
            "excluded_from_layer_adaptation": [],
            "zero_norm_steps": "LARC adds no weight decay where ||w|| or ||g|| is 0",
        }
        save("apex_larc", mode, trajectory, meta)


# ----------------------------------------------------------------------------
# optax


def run_optax():
    import jax
    import jax.numpy as jnp
    import optax

    w0, g, lr, _ = load_inputs()
    table = jnp.asarray(lr)

    def schedule(count):
        return table[count]

    def rank_above_one(params):
        return {name: value.ndim > 1 for name, value in params.items()}

    modes = {
        "default": dict(nesterov=False),
        "default_nesterov": dict(nesterov=True),
        "rank1_masked": dict(
            nesterov=False, weight_decay_mask=rank_above_one, trust_ratio_mask=rank_above_one
        ),
    }
    for mode, kwargs in modes.items():
        arguments = dict(
            weight_decay=WEIGHT_DECAY,
            trust_coefficient=TRUST_COEFFICIENT,
            eps=0.0,
            momentum=MOMENTUM,
            **kwargs,
        )
        optimizer = optax.lars(schedule, **arguments)
        params = {name: jnp.asarray(w0[name]) for name in SHAPES}
        state = optimizer.init(params)

        @jax.jit
        def step(params, state, grads, optimizer=optimizer):
            updates, state = optimizer.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        trajectory = {name: [] for name in SHAPES}
        for k in range(STEPS):
            grads = {name: jnp.asarray(g[name][k]) for name in SHAPES}
            params, state = step(params, state, grads)
            for name in SHAPES:
                trajectory[name].append(np.asarray(params[name]))
        masked = "weight_decay_mask" in kwargs
        shown = {
            key: ("<rank > 1 mask>" if callable(value) else value)
            for key, value in arguments.items()
        }
        meta = {
            "upstream": "optax.lars",
            "versions": _versions("optax", "jax", "jaxlib"),
            "arguments": dict(shown, learning_rate="lambda count: lr_lars[count]"),
            "learning_rate": "lr_lars through a schedule indexing the table by step count",
            "run": "jax.jit of update + apply_updates, CPU, float32",
            "excluded_from_weight_decay": [n for n in SHAPES if masked and len(SHAPES[n]) <= 1],
            "excluded_from_layer_adaptation": [n for n in SHAPES if masked and len(SHAPES[n]) <= 1],
        }
        save("optax_lars", mode, trajectory, meta)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("inputs")
    for name in ("tfa", "models", "timm", "optax"):
        commands.add_parser(name)
    for name in ("tpu", "larc"):
        command = commands.add_parser(name)
        command.add_argument("--source", required=True, help="the upstream file")
        command.add_argument("--commit", required=True, help="its repository commit")
    args = parser.parse_args(argv)
    if args.command == "inputs":
        make_inputs()
    elif args.command == "tpu":
        run_tpu(args.source, args.commit)
    elif args.command == "larc":
        run_larc(args.source, args.commit)
    else:
        {"tfa": run_tfa, "models": run_models, "timm": run_timm, "optax": run_optax}[args.command]()


if __name__ == "__main__":
    main()
