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
