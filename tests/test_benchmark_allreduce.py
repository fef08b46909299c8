"""The all-reduce benchmark: its ring fit against the closed form, and one
real run of two worker processes on localhost."""

import pytest

from keras_lars.tools import benchmark_allreduce as benchmark
from keras_lars.tools import settings
from keras_lars.tools.plan import ring_allreduce

SPEEDUP = {"float32": 1.0, "bfloat16": 0.6}


def _rows(workers, alpha, beta, sizes):
    return [
        {
            "dtype": dtype,
            "form": form,
            "float32_bytes": n,
            "bytes": n // (2 if dtype == "bfloat16" else 1),
            "seconds": ring_allreduce(n, workers, alpha, beta)
            * (0.6 if dtype == "bfloat16" else 1),
        }
        for dtype in benchmark.DTYPES
        for form in benchmark.FORMS
        for n in sizes
    ]


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_the_fit_recovers_alpha_and_beta_of_exact_ring_times(workers):
    alpha, beta = 2.5e-4, 1 / 3e9
    rows = _rows(workers, alpha, beta, [4096 * 4**k for k in range(8)])
    fitted = benchmark.fit_ring(rows, workers)
    assert fitted == pytest.approx((alpha, beta), rel=1e-9)
    text, _, _ = benchmark.report(rows, workers)
    assert f"{workers} workers on localhost (ring): alpha = 250.0 us, 1/beta = 3.00 GB/s" in text
    assert text.count(" 0.50 ") == 16 and text.count(" 0.60") == 16  # bytes and time ratios


def test_settings_are_checked():
    with pytest.raises(settings.ConfigError, match="--workers=1: must be a list"):
        benchmark.AllReduceSettings(workers=("1",))
    with pytest.raises(settings.ConfigError, match="--max_bytes=1024: must be >= --min_bytes"):
        benchmark.AllReduceSettings(min_bytes=4096, max_bytes=1024)
    assert benchmark.AllReduceSettings(min_bytes=4096, max_bytes=65536).sizes == [
        4096,
        16384,
        65536,
    ]


@pytest.mark.multiworker
@pytest.mark.subprocess
def test_two_real_workers_measure_every_size_form_and_dtype():
    rows = benchmark.measure(2, [4096, 65536], repeats=2, timeout=300)
    assert len(rows) == 2 * 2 * 2
    for row in rows:
        assert row["seconds"] > 0
        assert row["bytes"] == row["float32_bytes"] // (2 if row["dtype"] == "bfloat16" else 1)
