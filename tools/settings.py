"""One declaration per tool setting, from which everything else is derived.

A tool's settings are a frozen dataclass whose fields are made with
`setting(default, help, choices=..., check=...)`. From that one declaration:

    define_flags(Schema, flag_values)   the absl flags (only entry points call it)
    from_flags(Schema, flag_values)     (field values by name, names given on the command line)
    Schema(**values)                    the frozen config; __post_init__ calls check(self)
    dataclasses.asdict(config)          config.json and the study's cell keys
    markdown_table(Schema)              the docs page of the flags (docs/generate.py)

A field's type annotation picks its flag type: str, int, float, bool, or
tuple (a comma-separated list); `choices` makes an enum (str) or restricts a
list's items. A check is fn(value, config) -> None, or the requirement the
value misses ("must be >= 1"); `check(config)` raises ConfigError
"--name=value: requirement." for the first field that fails.
"""

import dataclasses
import json
import math
import os
import sys
import typing

from absl import flags


class ConfigError(ValueError):
    """A bad setting; the message names the flag and its value."""


def setting(default, help, *, choices=(), check=None, resumable=False, per_process=False):
    """A dataclass field declaring one setting (see the module docstring).
    `resumable`: the setting may differ when a run is resumed (where it
    runs, not what it computes). `per_process`: the processes (workers) of
    one run may differ in it; every other setting they must share."""
    return dataclasses.field(
        default=default,
        metadata={
            "help": help,
            "choices": tuple(choices),
            "check": check,
            "resumable": resumable,
            "per_process": per_process,
        },
    )


# --- checks --------------------------------------------------------------------------
def at_least(bound):
    return lambda value, config: None if value >= bound else f"must be >= {bound}"


def greater_than(bound):
    return lambda value, config: None if value > bound else f"must be > {bound}"


def in_interval(low, high):
    """low <= value < high."""
    return lambda value, config: None if low <= value < high else f"must be in [{low}, {high})"


def between(low, high):
    """low <= value <= high."""
    return lambda value, config: (
        None if low <= value <= high else f"must be between {low} and {high}"
    )


def one_of(*allowed):
    return lambda value, config: (
        None if value in allowed else f"must be {' or '.join(map(str, allowed))}"
    )


def _field_type(schema, field):
    hints = typing.get_type_hints(schema)
    kind = hints[field.name]
    kind = typing.get_origin(kind) or kind
    if kind is typing.Union:  # Optional[str]
        kind = next(a for a in typing.get_args(hints[field.name]) if a is not type(None))
    if kind not in (str, int, float, bool, tuple):
        raise TypeError(f"{schema.__name__}.{field.name}: unsupported setting type {kind}")
    return kind


def fields(schema, exclude=()):
    """The settings of `schema` (a dataclass or instance), in declaration order."""
    return [f for f in dataclasses.fields(schema) if f.name not in exclude and f.metadata]


def check(config):
    """Raises ConfigError for the first setting of `config` that fails its
    type, choices or check."""
    for field in fields(config):
        value = getattr(config, field.name)
        kind = _field_type(type(config), field)
        if value is None and field.default is None:
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            object.__setattr__(config, field.name, value)
        problem = None
        if kind is tuple:
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(config, field.name, value)
            if not isinstance(value, tuple):
                problem = "must be a list"
        elif not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            problem = f"must be of type {kind.__name__}"
        elif kind is float and not math.isfinite(value):
            problem = "must be a finite number"
        choices = field.metadata["choices"]
        if problem is None and choices:
            items = value if kind is tuple else (value,)
            wrong = [item for item in items if item not in choices]
            if wrong:
                problem = f"{wrong[0]!r} is not one of {', '.join(map(str, choices))}"
        if problem is None and field.metadata["check"]:
            problem = field.metadata["check"](value, config)
        if problem:
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
            raise ConfigError(f"--{field.name}={shown}: {problem}.")


# --- the Keras backend -------------------------------------------------------------
def keras_backend():
    """Keras's backend: `keras.backend.backend()` once Keras is loaded; before
    (our programs check their flags first), the one Keras would load, read as
    Keras reads it: KERAS_BACKEND, else keras.json's "backend" in $KERAS_HOME
    (default ~/.keras, /tmp/.keras where home is not writable), else tensorflow."""
    if "keras" in sys.modules:
        return sys.modules["keras"].backend.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME")
    if home is None:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    try:
        with open(os.path.expanduser(os.path.join(home, "keras.json"))) as f:
            return json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


# --- flags ---------------------------------------------------------------------------
def define_flags(schema, flag_values=flags.FLAGS, exclude=(), defaults=None):
    """Defines one absl flag per setting of `schema` (but `exclude`), with
    `defaults` (name -> value) in place of the schema's defaults. The flags
    belong to the program's main module (absl's `--help` lists those)."""
    defaults = defaults or {}
    for field in fields(schema, exclude):
        kind = _field_type(schema, field)
        default = defaults.get(field.name, field.default)
        text, choices = field.metadata["help"], list(field.metadata["choices"])
        keywords = {"flag_values": flag_values, "module_name": sys.argv[0]}
        if kind is bool:
            flags.DEFINE_bool(field.name, default, text, **keywords)
        elif kind is tuple:
            if choices:
                text += f" (any of {', '.join(choices)})"
            flags.DEFINE_list(field.name, list(default), text, **keywords)
        elif choices:
            flags.DEFINE_enum(field.name, default, choices, text, **keywords)
        elif kind is int:
            flags.DEFINE_integer(field.name, default, text, **keywords)
        elif kind is float:
            flags.DEFINE_float(field.name, default, text, **keywords)
        else:
            flags.DEFINE_string(field.name, default, text, **keywords)


def parse_flags(argv, flag_values=flags.FLAGS):
    """absl's parse as every console script's `flags_parser`: a flag absl
    does not know or a value it refuses (not among the choices, not a number)
    ends the program in one line `error: ...`, as the settings' checks do,
    not in absl's FATAL line and its hint."""
    try:
        return flag_values(argv)
    except flags.Error as error:
        sys.exit(f"error: {str(error).rstrip('.')}.")


def from_flags(schema, flag_values=flags.FLAGS, exclude=()):
    """({name: value} of the parsed flags of `schema`, {names given on the
    command line}); lists become tuples."""
    values, given = {}, set()
    for field in fields(schema, exclude):
        flag = flag_values[field.name]
        values[field.name] = tuple(flag.value) if isinstance(flag.value, list) else flag.value
        if flag.present:
            given.add(field.name)
    return values, given


def options_from_flags(schema, flag_values=flags.FLAGS):
    """`schema` built from the parsed flags; a setting that fails its check
    ends the program with one line `error: --name=value: requirement.`"""
    try:
        return schema(**from_flags(schema, flag_values)[0])
    except ConfigError as error:
        sys.exit(f"error: {error}")


# --- docs ----------------------------------------------------------------------------
def markdown_table(schema, exclude=(), defaults=None):
    """The settings of `schema` as a Markdown table: flag, default, help."""
    defaults = defaults or {}
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    for field in fields(schema, exclude):
        default = defaults.get(field.name, field.default)
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        kind = _field_type(schema, field)
        text = field.metadata["help"]
        if field.metadata["choices"] and kind is not tuple:
            text += f" One of: {', '.join(field.metadata['choices'])}."
        elif field.metadata["choices"]:
            text += f" Any of: {', '.join(field.metadata['choices'])}."
        shown = "" if default is None else f"`{default}`"
        lines.append(f"| `--{field.name}` | {shown} | {text.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
