"""Golden trajectories of the upstream optimizers (README.md), and our side (cases.py)."""
