"""Names of the files a steps-to-target study keeps in its directory
(keras-lars-study, tools/batch_study), which the planner and the
planner's benchmark read."""

TRIALS_FILE = "trials.jsonl"  # one record per finished trial
NOISE_STORE = "noise_scales.jsonl"  # one fixed-weight noise-scale measurement per line
NOISE_TABLE = "noise_scales"  # its table, rewritten from the store: .csv and .json
