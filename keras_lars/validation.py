"""Argument checks: a ValueError that names the argument and the value."""

import math
import numbers

# LARS/LAMB's `allreduce_dtype` (layerwise.py); here, where no Keras is imported, for
# the training tool's flag.
ALLREDUCE_DTYPES = (None, "float32", "bfloat16", "float16")


def check_number(name, value, above=None, at_least=None, below=None, at_most=None, finite=True):
    """Returns float(value); raises ValueError naming `name` if out of range,
    NaN, or (with finite=True) infinite."""
    limits = [
        (above, lambda v, b: v > b, ">"),
        (at_least, lambda v, b: v >= b, ">="),
        (below, lambda v, b: v < b, "<"),
        (at_most, lambda v, b: v <= b, "<="),
    ]
    wanted = " and ".join(f"{sign} {bound}" for bound, _, sign in limits if bound is not None)
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if (
        not is_number
        or value != value
        or (finite and math.isinf(value))
        or not all(ok(value, bound) for bound, ok, _ in limits if bound is not None)
    ):
        kind = "a finite number" if finite else "a number"
        raise ValueError(f"`{name}` must be {kind} {wanted}".rstrip() + f", received {value!r}.")
    return float(value)


def check_integer(name, value, at_least):
    """Returns int(value); raises ValueError naming `name` unless an integer >= at_least."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < at_least:
        raise ValueError(f"`{name}` must be an integer >= {at_least}, received {value!r}.")
    return int(value)


def check_bool(name, value):
    """Returns `value`; raises ValueError naming `name` unless True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False, received {value!r}.")
    return value
