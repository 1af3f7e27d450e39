"""Performance samples and the hardware report, from psutil and a fake GPU reader."""

from __future__ import annotations

from llmswap.machine.fake import FakeReader
from llmswap.machine.hardware import detect
from llmswap.machine.monitor import KEEP_SECONDS, PerformanceMonitor
from llmswap.machine.units import GiB

ARCHITECTURES = ("x86_64", "arm64", "armv7", "ppc64le", "riscv64", "s390x", "other")


def fake_gpus() -> FakeReader:
    reader = FakeReader((24 * GiB,), names=("Fake RTX",))
    reader.set_extra_used(0, 6 * GiB)
    reader.set_gauges(0, util_pct=75.0, temp_c=66.0, fan_pct=40.0, power_w=250.0)
    return reader


def test_a_sample_reads_the_host_and_every_gpu_in_llama_swaps_shape() -> None:
    ticks = iter([1000.0, 1005.0])
    monitor = PerformanceMonitor(5.0, fake_gpus, clock=lambda: next(ticks))
    monitor.sample()
    monitor.sample()
    report = monitor.report(None)
    assert report["enabled"] is True and len(report["sys_stats"]) == 2
    system = report["sys_stats"][0]
    assert system["mem_total_mb"] > 0 and len(system["cpu_util_per_core"]) >= 1
    assert all(io["name"] != "lo" for io in system["net_io"])
    gpu = report["gpu_stats"][-1]
    assert (gpu["id"], gpu["name"], gpu["gpu_util_pct"], gpu["temp_c"], gpu["power_draw_w"]) == (
        0, "Fake RTX", 75.0, 66.0, 250.0)
    assert gpu["mem_used_mb"] == 6 * 1024 and gpu["mem_util_pct"] == 25.0
    assert [s["timestamp"] for s in monitor.report(1000.0)["sys_stats"]] == ["1970-01-01T00:16:45.000Z"]


def test_no_samples_is_null_without_after_and_empty_with_it() -> None:
    monitor = PerformanceMonitor(5.0, lambda: None)
    assert monitor.report(None) == {"enabled": True, "sys_stats": None, "gpu_stats": None}
    assert monitor.report(0.0) == {"enabled": True, "sys_stats": [], "gpu_stats": []}
    monitor.sample()
    assert monitor.report(None)["gpu_stats"] is None  # a host-RAM reader has no GPUs


def test_rings_keep_an_hour_of_samples() -> None:
    monitor = PerformanceMonitor(60.0, lambda: None)
    for _ in range(KEEP_SECONDS // 60 + 5):
        monitor.sample()
    assert len(monitor.system) == KEEP_SECONDS // 60


def test_hardware_report_has_schema_1_and_lists_the_gpus() -> None:
    report = detect(fake_gpus())
    assert report["schema_version"] == 1 and report["capture"]["scope"] == "inference_host"
    assert report["memory"]["capacity_bytes"] > 0
    assert report["architecture"]["name"] in ARCHITECTURES
    [gpu] = report["accelerators"]
    assert (gpu["index"], gpu["kind"], gpu["model"], gpu["memory"]["capacity_bytes"]) == (
        0, "gpu", "Fake RTX", 24 * GiB)
    assert detect(None)["accelerators"] == []
