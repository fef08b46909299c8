"""The layer-wise trust ratio that LARS and LAMB share.

The trust ratio (You et al. 2017, 2019) rescales each layer's step by how large
the layer's weights are compared with its update:

    ratio = coefficient * ||w|| / (denominator + epsilon)

where the denominator is ||u|| (LAMB, and LARS in the tensorflow/models and
optax form, u = g + beta * w) or ||g|| + beta * ||w|| (the LARS paper).

Zero-norm policy: where ||w|| = 0 (a freshly zeroed layer) or ||u|| = 0 (no
signal this step) the ratio is 1, i.e. the layer takes the global rate. Weight
decay still applies in that case, because it is part of u, not of the ratio.

Norms are always accumulated in float32: a float16 sum of squares overflows
at 256 for a layer of a million unit-sized weights.
"""

from keras import ops


def trust_ratio(
    weight_norm,
    update_norm,
    denominator=None,
    coefficient=1.0,
    epsilon=0.0,
    bounds=None,
    clip_to_learning_rate=None,
):
    """Returns the factor that multiplies the global learning rate of a layer.

        ratio = coefficient * ||w|| / (denominator + epsilon),  denominator = ||u||
        ratio = clip(ratio, *bounds)                 if bounds is given
        ratio = min(ratio / lr, 1)                   if clip_to_learning_rate=lr
                                                     (LARC clipping: local rate
                                                      min(ratio, lr))
        ratio = 1      where ||w|| == 0 or ||u|| == 0
        ratio = nan    where ||w|| or ||u|| is not finite

    A non-finite norm (a NaN or inf entry in the weights or the gradient)
    propagates: the whole layer's update becomes NaN, so the loss turns
    non-finite at the next step and a divergence check sees it (as plain
    SGD would, but never hidden behind a ratio of 1 that steps the other
    entries ~1/eta too far). All arguments are float32 scalars (or Python
    floats).
    """
    if denominator is None:
        denominator = update_norm
    ratio = coefficient * weight_norm / (denominator + epsilon)
    if bounds is not None:
        ratio = ops.clip(ratio, bounds[0], bounds[1])
    if clip_to_learning_rate is not None:
        ratio = ops.minimum(ratio / clip_to_learning_rate, 1.0)
    defined = ops.logical_and(ops.greater(weight_norm, 0.0), ops.greater(update_norm, 0.0))
    ratio = ops.where(defined, ratio, ops.ones_like(ratio))
    finite = ops.logical_and(ops.isfinite(weight_norm), ops.isfinite(update_norm))
    return ops.where(finite, ratio, ops.full_like(ratio, float("nan")))
