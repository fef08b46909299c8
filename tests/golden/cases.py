"""Our optimizers on the golden inputs: the options that match each upstream peer and mode.

Imports only keras, numpy and keras_lars (no TensorFlow, no pytest), so that
the JAX-backend child process of tests/test_golden.py can run it too.
README.md beside this file says where the golden files come from.
"""

import dataclasses
import json
from pathlib import Path

import keras
import numpy as np

import keras_lars

HERE = Path(__file__).resolve().parent
EXCLUDE = ["bias", "gamma"]  # regexes, searched in the variable path ("conv_bias")

# The hyperparameters every upstream run used (generate.py).
MOMENTUM = 0.9
WEIGHT_DECAY = 0.01
ETA = 0.01

# Closeness is measured per step and per variable, relative to the variable's
# own scale: max|ours - upstream| <= tolerance * max|upstream|. An element's
# own relative error is meaningless where w - lr*u cancels to near 0.
#
# - "exact": tensorflow/tpu and tf-models-official's classic mode, on the
#   TensorFlow backend: the same float32 operations as ours, measured
#   bit-identical (tf.norm and our sqrt(2 * l2_loss) give the same norms here,
#   and the fused momentum kernels round like their unfused updates).
# - "tight" (1e-6, ~8 float32 ulps of the layer's largest entry): the same
#   equations evaluated in another order (XLA's reductions, lr*(a + b) against
#   lr*a + lr*b, torch's kernels). Measured at most 2.2e-7 (2 ulps) over the
#   10 steps, on both backends.
# - "lamb" (1e-5): tfa rounds 1 - beta^t and m_hat, v_hat to float32 each step,
#   ours folds the bias corrections into float32 scalars computed from float64
#   logs (keras_lars.lamb). Measured 2.6e-6 (the layer that starts at 0 and is
#   not adapted); there tfa itself is 1.8e-6 off the float64 answer
#   (tests/reference.lamb) and ours 3e-7. An earlier LAMB was 7e-6 off tfa.
TOLERANCE = {"exact": 0.0, "tight": 1e-6, "lamb": 1e-5}


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str  # "lars" or "lamb"
    options: dict  # our constructor arguments (besides the learning rate)
    upstream: dict  # the upstream constructor arguments the golden file must show
    tolerance: str  # a key of TOLERANCE (on TensorFlow too unless exact there)
    exact_on_tensorflow: bool = False  # bit-identical on the TensorFlow backend
    # {variable: step}: from that step on the peer does something we have no
    # option for (the test checks that it does differ there).
    diverges: dict = dataclasses.field(default_factory=dict)
    note: str = ""

    @property
    def tensorflow_tolerance(self):
        return TOLERANCE["exact"] if self.exact_on_tensorflow else TOLERANCE[self.tolerance]


def _lamb(**options):
    return dict(beta_1=0.9, beta_2=0.999, epsilon=1e-6, **options)


def _lars(**options):
    return dict(momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, trust_coefficient=ETA, **options)


_TPU = dict(epsilon=0.0, classic_momentum=True, trust_denominator="sum_of_norms")
_MODELS = dict(epsilon=0.0, exclude_from_weight_decay=EXCLUDE, exclude_rank_one=False)
_TIMM = dict(epsilon=1e-8, classic_momentum=False, trust_denominator="sum_of_norms")
_OPTAX = dict(epsilon=0.0, classic_momentum=True, trust_denominator="norm_of_sum")
_LARC = dict(
    epsilon=1e-8,
    classic_momentum=False,
    trust_denominator="sum_of_norms",
    exclude_from_weight_decay=EXCLUDE,
    exclude_from_layer_adaptation=[],
    exclude_rank_one=False,
)
_TIMM_CLIP_NOTE = (
    "timm clips after its zero-norm rule: where ||w|| or ||g|| is 0 its ratio "
    "1 becomes min(1/lr, 1), a local rate of min(lr, 1); ours keeps ratio 1 "
    "(rate lr). They differ where a norm is 0 and lr > 1: dense/kernel "
    "(zero gradient at step 3, lr 1.525) from step 3 on."
)
_LARC_NOTE = (
    "LARC adds the weight decay inside `if param_norm != 0 and grad_norm != 0`: "
    "at a zero-norm step it skips the decay, where ours (and timm) apply it at "
    "ratio 1. No option of ours does that: dense/kernel (zero gradient at "
    "step 3) differs from step 3 on."
)

CASES = {
    # tensorflow-addons 0.23.0 LAMB (TF 2.15, Keras 2).
    "tfa_lamb__decay": Case(
        "lamb",
        _lamb(weight_decay=WEIGHT_DECAY, exclude_from_weight_decay=EXCLUDE),
        dict(weight_decay=WEIGHT_DECAY, exclude_from_weight_decay=EXCLUDE),
        "lamb",
    ),
    "tfa_lamb__no_decay": Case("lamb", _lamb(weight_decay=0.0), dict(weight_decay=0.0), "lamb"),
    "tfa_lamb__separate_lists": Case(
        "lamb",
        _lamb(
            weight_decay=WEIGHT_DECAY,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=["zero"],
        ),
        dict(exclude_from_weight_decay=EXCLUDE, exclude_from_layer_adaptation=["zero"]),
        "lamb",
    ),
    "tfa_lamb__empty_adaptation_list": Case(
        "lamb",
        # tfa's [] falls back to the decay list (truthiness); ours adapts
        # everything for [], so the equivalent is the explicit list.
        _lamb(
            weight_decay=WEIGHT_DECAY,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=EXCLUDE,
        ),
        dict(exclude_from_weight_decay=EXCLUDE, exclude_from_layer_adaptation=[]),
        "lamb",
    ),
    # tensorflow/tpu LARSOptimizer (the MLPerf ResNet-50 reference):
    # ResourceApplyMomentum(lr=1, grad=lr*ratio*(g + beta*w)). Its skip_list
    # is a substring test on var.name and skips both decay and the ratio.
    "tpu_lars__skip": Case(
        "lars",
        _lars(**_TPU, nesterov=False, exclude_from_weight_decay=EXCLUDE, exclude_rank_one=False),
        dict(eeta=ETA, epsilon=0.0, skip_list=EXCLUDE, use_nesterov=False),
        "tight",
        exact_on_tensorflow=True,
    ),
    "tpu_lars__skip_nesterov": Case(
        "lars",
        _lars(**_TPU, nesterov=True, exclude_from_weight_decay=EXCLUDE, exclude_rank_one=False),
        dict(eeta=ETA, epsilon=0.0, skip_list=EXCLUDE, use_nesterov=True),
        "tight",
        exact_on_tensorflow=True,
    ),
    "tpu_lars__no_skip": Case(
        "lars",
        _lars(**_TPU, nesterov=False, exclude_rank_one=False),
        dict(eeta=ETA, epsilon=0.0, skip_list=None, use_nesterov=False),
        "tight",
        exact_on_tensorflow=True,
    ),
    # tf-models-official 2.15 official.modeling.optimization.lars.LARS.
    "models_lars__classic": Case(
        "lars",
        _lars(**_MODELS, nesterov=False, classic_momentum=True, trust_denominator="norm_of_sum"),
        dict(eeta=ETA, classic_momentum=True, nesterov=False, exclude_from_weight_decay=EXCLUDE),
        "tight",
        exact_on_tensorflow=True,
    ),
    "models_lars__classic_nesterov": Case(
        "lars",
        _lars(**_MODELS, nesterov=True, classic_momentum=True, trust_denominator="norm_of_sum"),
        dict(eeta=ETA, classic_momentum=True, nesterov=True, exclude_from_weight_decay=EXCLUDE),
        "tight",
        exact_on_tensorflow=True,
    ),
    # Non-classic: v = m*v + (g + beta*w); u = v (Nesterov: m*v + g + beta*w);
    # ratio = eta*||w||/||u||; w -= lr*ratio*u.
    "models_lars__nonclassic": Case(
        "lars",
        _lars(**_MODELS, nesterov=False, classic_momentum=False, trust_denominator="update_norm"),
        dict(eeta=ETA, classic_momentum=False, nesterov=False, exclude_from_weight_decay=EXCLUDE),
        "tight",
    ),
    "models_lars__nonclassic_nesterov": Case(
        "lars",
        _lars(**_MODELS, nesterov=True, classic_momentum=False, trust_denominator="update_norm"),
        dict(eeta=ETA, classic_momentum=False, nesterov=True, exclude_from_weight_decay=EXCLUDE),
        "tight",
    ),
    # timm 1.0.31 Lars on torch CPU; rank-1 params in a weight_decay=0 group,
    # which timm leaves unadapted unless always_adapt=True.
    "timm_lars__plain": Case(
        "lars",
        _lars(**_TIMM, nesterov=False, clip_trust_ratio=False, exclude_rank_one=True),
        dict(trust_coeff=ETA, eps=1e-8, nesterov=False, trust_clip=False),
        "tight",
    ),
    "timm_lars__nesterov": Case(
        "lars",
        _lars(**_TIMM, nesterov=True, clip_trust_ratio=False, exclude_rank_one=True),
        dict(trust_coeff=ETA, eps=1e-8, nesterov=True, trust_clip=False),
        "tight",
    ),
    "timm_lars__clip": Case(
        "lars",
        _lars(**_TIMM, nesterov=False, clip_trust_ratio=True, exclude_rank_one=True),
        dict(trust_coeff=ETA, eps=1e-8, nesterov=False, trust_clip=True),
        "tight",
        diverges={"dense/kernel": 3},
        note=_TIMM_CLIP_NOTE,
    ),
    "timm_lars__clip_nesterov": Case(
        "lars",
        _lars(**_TIMM, nesterov=True, clip_trust_ratio=True, exclude_rank_one=True),
        dict(trust_coeff=ETA, eps=1e-8, nesterov=True, trust_clip=True),
        "tight",
        diverges={"dense/kernel": 3},
        note=_TIMM_CLIP_NOTE,
    ),
    "timm_lars__always_adapt": Case(
        "lars",
        _lars(
            **_TIMM,
            nesterov=False,
            exclude_from_weight_decay=EXCLUDE,
            exclude_from_layer_adaptation=[],
            exclude_rank_one=False,
        ),
        dict(trust_coeff=ETA, eps=1e-8, always_adapt=True),
        "tight",
    ),
    # optax 0.2.8 lars: chain(add_decayed_weights, masked(scale_by_trust_ratio),
    # scale_by_learning_rate, trace): the rate inside the momentum trace.
    "optax_lars__default": Case(
        "lars",
        _lars(**_OPTAX, nesterov=False, exclude_rank_one=False),
        dict(trust_coefficient=ETA, eps=0.0, nesterov=False),
        "tight",
    ),
    "optax_lars__default_nesterov": Case(
        "lars",
        _lars(**_OPTAX, nesterov=True, exclude_rank_one=False),
        dict(trust_coefficient=ETA, eps=0.0, nesterov=True),
        "tight",
    ),
    "optax_lars__rank1_masked": Case(
        "lars",
        _lars(**_OPTAX, nesterov=False, exclude_rank_one=True),
        dict(trust_coefficient=ETA, eps=0.0, weight_decay_mask="<rank > 1 mask>"),
        "tight",
    ),
    # NVIDIA apex LARC around torch.optim.SGD(momentum=0.9): it folds the
    # group's weight decay into the gradient and adapts every parameter
    # (rank-1 ones with weight_decay=0 in their group).
    "apex_larc__scale": Case(
        "lars",
        _lars(**_LARC, clip_trust_ratio=False),
        dict(LARC=dict(trust_coefficient=ETA, clip=False, eps=1e-8)),
        "tight",
        diverges={"dense/kernel": 3},
        note=_LARC_NOTE,
    ),
    "apex_larc__clip": Case(
        "lars",
        _lars(**_LARC, clip_trust_ratio=True),
        dict(LARC=dict(trust_coefficient=ETA, clip=True, eps=1e-8)),
        "tight",
        diverges={"dense/kernel": 3},
        note=_LARC_NOTE,
    ),
}


def variable_name(name):
    """Keras 3 variable names cannot hold "/": "conv/kernel" -> "conv_kernel"."""
    return name.replace("/", "_")


def load_inputs():
    """(names, initial weights, gradients[step][variable], {"lars": lr, "lamb": lr})."""
    with np.load(HERE / "inputs.npz") as data:
        names = [key[len("w0/") :] for key in data.files if key.startswith("w0/")]
        weights = [data[f"w0/{name}"] for name in names]
        steps = len(data[f"g/{names[0]}"])
        grads = [[data[f"g/{name}"][k] for name in names] for k in range(steps)]
        rates = {"lars": data["lr_lars"], "lamb": data["lr_lamb"]}
    return names, weights, grads, rates


def golden_stems():
    return sorted(path.name[: -len(".npz")] for path in HERE.glob("*__*.npz"))


def load_golden(stem):
    """(meta, {name: weights after every step, shape (steps, ...)})."""
    with np.load(HERE / f"{stem}.npz") as data:
        meta = json.loads(str(data["meta"]))
        trajectory = {key[len("w/") :]: data[key] for key in data.files if key.startswith("w/")}
    return meta, trajectory


def make_optimizer(case, learning_rate):
    make = keras_lars.LARS if case.kind == "lars" else keras_lars.LAMB
    return make(learning_rate=float(learning_rate), **case.options)


def run(stem):
    """Our optimizer on the golden inputs: (optimizer, variables, {name: (steps, ...)})."""
    case = CASES[stem]
    names, weights, grads, rates = load_inputs()
    rate = rates[case.kind]
    variables = [keras.Variable(w, name=variable_name(n)) for n, w in zip(names, weights)]
    optimizer = make_optimizer(case, rate[0])
    trajectory = {name: [] for name in names}
    for k, step in enumerate(grads):
        optimizer.learning_rate.assign(rate[k])  # changes every step
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step], variables)
        for name, variable in zip(names, variables):
            trajectory[name].append(keras.ops.convert_to_numpy(variable))
    return optimizer, variables, {name: np.stack(t) for name, t in trajectory.items()}


def differences(ours, golden, diverges=None):
    """{name: (max relative to the layer scale, max absolute)} over the compared steps."""
    diverges = diverges or {}
    result = {}
    for name, expected in golden.items():
        steps = diverges.get(name, len(expected))
        a = np.asarray(ours[name][:steps], np.float64)
        e = np.asarray(expected[:steps], np.float64)
        axes = tuple(range(1, e.ndim))
        absolute = np.max(np.abs(a - e), axis=axes)  # per step
        scale = np.max(np.abs(e), axis=axes)
        relative = np.where(scale > 0, absolute / np.where(scale > 0, scale, 1.0), absolute)
        result[name] = (float(np.max(relative, initial=0.0)), float(np.max(absolute, initial=0.0)))
    return result
