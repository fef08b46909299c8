"""The names in a keras-lars-train model directory that other programs read,
declared once: for the tool (tools/train/model_dir.py), the studies, and the
planner, which loads without TensorFlow (keras-lars-plan --from_run).

    <model_dir>/config.json      CONFIG_FILE: the run's settings and data
    <model_dir>/summary.json     SUMMARY_FILE: the final metrics, history, config, layout
    <model_dir>/checkpoints/     CHECKPOINTS: ckpt-* (tools/checkpoints.py); each state
                                 records its run under SETTINGS and LAYOUT, as the
                                 summary records the layout under LAYOUT
"""

CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"
CHECKPOINTS = "checkpoints"
SETTINGS, LAYOUT = "settings", "layout"
# summary.json's history: the unlagged noise-scale readings, (B_simple, its standard
# error), as keras_lars.NoiseScaleMonitor(interval=True) (INTERVAL_LOG_KEYS) and the
# adaptive batch's decisions (tools/train/adaptive.LOGGED) log them
NOISE_READINGS = (
    ("noise_scale_interval", "noise_scale_interval_error"),
    ("adaptive_noise_scale", "adaptive_noise_scale_error"),
)
