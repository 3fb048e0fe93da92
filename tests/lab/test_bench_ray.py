"""``bench ray``'s arithmetic: the hop histograms read back from real gateways' metrics, and their quantiles."""

from __future__ import annotations

import os

import pytest

from assistant.bench.processes import cpu_seconds
from assistant.server.metrics import Metrics
from lab.ray_hop import bucket_quantile, parse_hop_histograms


def test_hop_histograms_sum_gateways_and_interpolate_quantiles() -> None:
    a, b = Metrics(), Metrics()
    for ms in (1.5, 1.6, 1.7, 1.8):  # in the 1–2 ms bucket
        a.observe_ray_hop("call", ms / 1000)
    for ms in (4.0, 4.5, 20.0, 400.0):
        b.observe_ray_hop("call", ms / 1000)
    b.observe_ray_hop("chunk", 0.0004)
    hist = parse_hop_histograms([a.render()[0].decode(), b.render()[0].decode()])
    call = hist["call"]
    assert call[float("inf")] == 8 and hist["chunk"][float("inf")] == 1
    # rank 4 of 8 is the last of the four 1–2 ms samples: the bucket's top, 2 ms
    assert bucket_quantile(call, 0.5) == pytest.approx(0.002)
    # rank 2 of 8: half-way into the 1–2 ms bucket (linear within it, as Prometheus does)
    assert bucket_quantile(call, 0.25) == pytest.approx(0.0015)
    assert bucket_quantile({}, 0.5) is None


def test_cpu_seconds_of_this_process_grows() -> None:
    before = cpu_seconds([os.getpid()])
    if before is None:
        pytest.fail("/proc is expected on the Linux machines the bench runs on")
    sum(i * i for i in range(2_000_000))
    assert cpu_seconds([os.getpid()]) > before


def test_hist_delta_is_what_one_level_observed() -> None:
    from lab.ray_hop import hist_delta

    m = Metrics()
    m.observe_ray_hop("call", 0.004)
    before = parse_hop_histograms([m.render()[0].decode()])
    m.observe_ray_hop("call", 0.012)
    m.observe_ray_hop("asr", 0.05)
    level = hist_delta(parse_hop_histograms([m.render()[0].decode()]), before)
    assert level["call"][float("inf")] == 1 and level["asr"][float("inf")] == 1
    assert 0.01 < bucket_quantile(level["call"], 0.5) <= 0.015  # only the 12 ms sample is this level's
