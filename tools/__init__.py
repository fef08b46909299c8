"""Command-line programs: training, data conversion, benchmarks, studies."""
