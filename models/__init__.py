"""Reference model definitions for large-batch training."""
