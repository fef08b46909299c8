"""Plain-numpy LARS and LAMB, written from the papers' equations (float64).

Independent of keras_lars: the tests compare the Keras optimizers with these.
"""

import numpy as np


def _norm(x):
    return float(np.sqrt(np.sum(np.asarray(x, np.float64) ** 2)))


def lars(
    weights,
    gradient_steps,
    learning_rates,
    *,
    momentum=0.9,
    weight_decay=0.0,
    eta=0.001,
    epsilon=0.0,
    nesterov=False,
    classic=True,
    denominator="sum_of_norms",
    clip=False,
    decay=None,
    adapt=None,
):
    """You, Gitman, Ginsburg 2017, Algorithm 1 and its common variants.

    weights: list of arrays; gradient_steps: list (per step) of lists of arrays;
    decay/adapt: per-variable booleans. Returns the final weights.
    """
    w = [np.array(x, np.float64) for x in weights]
    v = [np.zeros_like(x) for x in w]
    decay = decay or [True] * len(w)
    adapt = adapt or [True] * len(w)
    for grads, lr in zip(gradient_steps, learning_rates):
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            beta = weight_decay if decay[i] else 0.0
            d = g + beta * w[i]
            if denominator == "update_norm":  # ratio of the momentum update
                v[i] = momentum * v[i] + d
                u = momentum * v[i] + d if nesterov else v[i]
                wn, un = _norm(w[i]), _norm(u)
                local = eta * wn / (un + epsilon) if adapt[i] and wn > 0 and un > 0 else 1.0
                if clip and local != 1.0:
                    local = min(local / lr, 1.0)
                w[i] = w[i] - lr * local * u
                continue
            local = 1.0
            if adapt[i]:
                wn = _norm(w[i])
                if denominator == "sum_of_norms":
                    un = _norm(g)
                    den = un + beta * wn
                else:
                    un = den = _norm(d)
                if wn > 0 and un > 0:
                    local = eta * wn / (den + epsilon)
                    if clip:
                        local = min(local / lr, 1.0)
            if momentum == 0:
                w[i] = w[i] - lr * local * d
            elif classic:
                v[i] = momentum * v[i] + lr * local * d
                w[i] = w[i] - (momentum * v[i] + lr * local * d if nesterov else v[i])
            else:
                v[i] = momentum * v[i] + local * d
                w[i] = w[i] - lr * (momentum * v[i] + local * d if nesterov else v[i])
    return w


def lamb(
    weights,
    gradient_steps,
    learning_rates,
    *,
    beta_1=0.9,
    beta_2=0.999,
    epsilon=1e-6,
    weight_decay=0.0,
    decay=None,
    adapt=None,
    bounds=None,
    update_norms=None,
):
    """You et al. 2019, Algorithm 2 (as in tensorflow-addons' LAMB).

    update_norms: a list that receives ||r + wd*w|| of each variable at
    each step."""
    w = [np.array(x, np.float64) for x in weights]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    decay = decay or [True] * len(w)
    adapt = adapt or [True] * len(w)
    for t, (grads, lr) in enumerate(zip(gradient_steps, learning_rates), start=1):
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            m_hat = m[i] / (1 - beta_1**t)
            v_hat = v[i] / (1 - beta_2**t)
            r = m_hat / (np.sqrt(v_hat) + epsilon)
            if decay[i]:
                r = r + weight_decay * w[i]
            ratio = 1.0
            if adapt[i]:
                wn, rn = _norm(w[i]), _norm(r)
                if wn > 0 and rn > 0:
                    ratio = wn / rn
                    if bounds is not None:
                        ratio = min(max(ratio, bounds[0]), bounds[1])
            if update_norms is not None:
                update_norms.append(_norm(r))
            w[i] = w[i] - lr * ratio * r
    return w
