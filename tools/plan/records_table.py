"""The published records against the predictions: the table of
keras-lars-plan --records and of docs/planning.md (docs/generate.py), each
record's error under (a) one utilization and (b) each device's calibration,
the scores and leave-one-out (step.records_rows, step.leave_one_out; the
records: records.py)."""

from keras_lars.tools.plan.published import PER_DEVICE
from keras_lars.tools.plan.records import CALIBRATED_UTILIZATION
from keras_lars.tools.plan.records import CALIBRATION_RECORD
from keras_lars.tools.plan.records import RECORDS
from keras_lars.tools.plan.records import TOLERANCE
from keras_lars.tools.plan.report import duration
from keras_lars.tools.plan.step import fit_utilization
from keras_lars.tools.plan.step import leave_one_out
from keras_lars.tools.plan.step import records_rows


def _percent(fraction):
    return f"{round(fraction, 2) + 0.0:+.0%}"  # + 0.0: no "-0%"


def _range_text(row):
    if row is None:
        return "-"
    if round(row.low, 2) == round(row.high, 2):
        return _percent(row.error)
    return f"{_percent(row.low)} .. {_percent(row.high)}"


def _inputs_text(rec):
    """The record's varied inputs (several values: the range) and the other
    inputs it assumes (one value, no source)."""
    varied = sorted(name for name, values in rec.assumed.items() if len(set(values)) > 1)
    fixed = sorted(set(rec.assumed) - rec.sourced_fields() - set(varied))
    parts = [f"varied: {', '.join(varied)}" if varied else ""]
    parts.append(f"assumed: {', '.join(fixed)}" if fixed else "")
    return "; ".join(part for part in parts if part) or "all published"


def _verdict(rec, row):
    if not rec.scored:
        return "not scored"
    if row is None:
        return "no throughput"
    return "within" if row.within else "MISS"


def _batch_text(rec, arrow="->"):
    """'34,816', or '34,816->69,632' where the batch grew (at its switch_epoch)."""
    grown = f"{arrow}{rec.grown_batch:,}" if rec.grown_batch else ""
    return f"{rec.global_batch:,}{grown}"


def _per_device_u(rec):
    """The record's device's calibrated u at its activations ('-': none)."""
    device = rec.device_model(PER_DEVICE)
    return f"{device.utilization:.3f}" if device else "-"


def leave_one_out_lines(results):
    """The leave-one-out summary: each scored record predicted over its
    range at the u fitted on the other scored ones."""
    us = sorted(result.utilization for result in results)
    errors = sorted(abs(result.error) for result in results)
    return [
        f"leave-one-out: each of the {len(results)} scored records predicted at the u fitted "
        f"on the other {len(results) - 1} (the geometric median of their fit u: {us[0]:.2f} "
        f".. {us[-1]:.2f}): {sum(result.within for result in results)} within "
        f"+-{TOLERANCE:.0%} over their whole range (median |error| at the nominal inputs "
        f"{errors[len(errors) // 2]:.0%})",
    ]


def _both_models():
    """The records' rows under one u and under PER_DEVICE, and leave-one-out
    by record (the scored ones)."""
    loo = {result.record.key: result for result in leave_one_out()}
    return records_rows(), records_rows(PER_DEVICE), [loo.get(rec.key) for rec in RECORDS]


def _loo_text(result):
    return _range_text(result.ranged) if result else "-"


def records_text():
    """The records table; `one u`: predicted and error at the fitted u;
    `per device`: each device's calibrated u and the error under it; `fit
    u`: the utilization that would reproduce the published time; `LOO`: a
    scored record's error (range) at the u fitted on the other scored ones
    (step.leave_one_out)."""
    rows, calibrated, loo = _both_models()
    lines = [
        f"ResNet-50 / ImageNet: published vs predicted from the records' hardware, (a) at one "
        f"u = {CALIBRATED_UTILIZATION} fitted on {CALIBRATION_RECORD}, (b) per device: u, b_half "
        f"and c_fixed fitted on the device's published throughputs (nothing on the records); "
        f"within: the whole range over the assumed inputs inside +-{TOLERANCE:.0%}",
        f"{'record':<22}{'hardware':<22}{'batch':>15}{'epochs':>7}{'published':>11}"
        f"{'(a) predicted':>14}{'error (range)':>17}{'(b) u':>7}{'predicted':>11}"
        f"{'error (range)':>17}{'fit u':>7}{'LOO (range)':>17}  verdict (a) / (b)",
    ]
    for row, other, result in zip(rows, calibrated, loo):
        rec = row.record
        predicted = duration(other.predicted) if other else "-"
        lines.append(
            f"{rec.key:<22}{f'{rec.devices} {rec.device}':<22}{_batch_text(rec):>15}"
            f"{rec.epochs:>7g}{duration(rec.published_seconds):>11}"
            f"{duration(row.predicted):>14}{_range_text(row):>17}{_per_device_u(rec):>7}"
            f"{predicted:>11}{_range_text(other):>17}"
            f"{fit_utilization(rec):>7.3f}{_loo_text(result):>17}  "
            f"{_verdict(rec, row)} / {_verdict(rec, other)}"
        )
    lines += [score_line(rows), score_line(calibrated, PER_DEVICE)]
    lines += leave_one_out_lines([r for r in loo if r])
    lines.append("sources, assumed inputs and the misses: docs/planning.md")
    return "\n".join(lines)


def score_line(rows, utilization=CALIBRATED_UTILIZATION, records=RECORDS):
    """How many scored records are within the tolerance over their range,
    `rows` (records_rows at `utilization`) aligned with `records`; under
    PER_DEVICE, of those whose device has a published throughput."""
    scored = [(rec, row) for rec, row in zip(records, rows) if rec.scored]
    predicted = [row for _, row in scored if row]
    within = sum(row.within for row in predicted)
    if utilization == PER_DEVICE:
        missing = sorted({rec.device for rec, row in scored if row is None})
        return (
            f"(b) per device: {within} of {len(predicted)} scored records within "
            f"+-{TOLERANCE:.0%} over their whole range ({len(scored) - len(predicted)} "
            f"more not predicted: no published throughput of a {', '.join(missing)} at "
            "their activations)"
        )
    return (
        f"(a) one u: {within} of {len(scored)} scored records within +-{TOLERANCE:.0%} over "
        f"their whole range ({len(rows) - len(scored)} not scored: the calibration and rows "
        "that repeat it)"
    )


def records_markdown():
    """The records table as Markdown, with both scores and the leave-one-out
    summary (docs/generate.py writes it into docs/planning.md)."""
    rows, calibrated, loo = _both_models()
    lines = [
        "| record | source | hardware | batch | epochs | published | inputs | (a) predicted "
        "| (a) error (range) | (a) | (b) u | (b) predicted | (b) error (range) | (b) | fit u "
        "| LOO |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, other, result in zip(rows, calibrated, loo):
        rec = row.record
        verdicts = []
        for ranged in (row, other):
            verdict = _verdict(rec, ranged)
            if verdict == "MISS":
                verdict = "**miss**"
            elif rec.note and not rec.scored:
                verdict = f"not scored: {rec.note.split(':')[0]}"
            verdicts.append(verdict)
        lines.append(
            f"| `{rec.key}` | {rec.paper} | {rec.devices} {rec.device} | "
            f"{_batch_text(rec, ' → ')} | {rec.epochs:g} | {duration(rec.published_seconds)} | "
            f"{_inputs_text(rec)} | {duration(row.predicted)} | {_range_text(row)} | "
            f"{verdicts[0]} | {_per_device_u(rec)} | "
            f"{duration(other.predicted) if other else '-'} | {_range_text(other)} | "
            f"{verdicts[1]} | {fit_utilization(rec):.3f} | {_loo_text(result)} |"
        )
    lines += ["", score_line(rows) + ".", "", score_line(calibrated, PER_DEVICE) + ".", ""]
    lines += [line + "." for line in leave_one_out_lines([r for r in loo if r])]
    return "\n".join(lines) + "\n"
