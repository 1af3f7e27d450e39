"""`GET /api/performance`, `GET /api/hardware` and the machine's gauges on `/metrics`.

Owns the app's `PerformanceMonitor` (started with the app unless `performance.disabled`; a reload that
changes `every` restarts it with empty rings, one that disables it stops it, as llama-swap does) and the
hardware report (detected once at start, off the event loop).

    llmswap_cpu_util_percent{core}                 llmswap_host_memory_{total,used,free}_bytes
    llmswap_host_swap_{total,used}_bytes           llmswap_load_average{interval}
    llmswap_network_bytes_total{interface,direction}
    llmswap_gpu_{util_percent,memory_util_percent,memory_used_bytes,memory_total_bytes,
                 temperature_celsius,fan_speed_percent,power_draw_watts}{id,name,uuid}
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmswap.config.model import Config
from llmswap.machine import hardware
from llmswap.machine.monitor import MB, PerformanceMonitor
from llmswap.machine.reader import GpuGauges, GpuReading
from llmswap.router.router import Router
from llmswap.server.http.errors import error_response
from llmswap.server.observe.metrics import ServerMetrics

log = logging.getLogger("llmswap.perf")



class Performance:
    """The monitor (None when disabled at start) and the settings it runs with."""

    def __init__(self, config: Config, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        settings = config.performance
        self.available = not settings.disabled
        self.monitor: PerformanceMonitor | None = self._new(settings.every) if self.available else None
        self.hardware: dict[str, Any] | None = None  # detected at start; None if that failed

    def _new(self, every: float) -> PerformanceMonitor:
        return PerformanceMonitor(every, self.gauges)

    def gauges(self) -> GpuGauges | None:
        reader = self.metrics.memory_reader()
        return reader if isinstance(reader, GpuGauges) else None

    def follow(self, router: Router) -> None:
        """A reload's `performance:` (ignored when it was disabled at start: that lasts until a restart)."""
        if not self.available or self.monitor is None:
            return
        settings = router.config.performance
        current = self.monitor
        if settings.disabled:
            current.cancel()
            self.monitor = self._new(current.every)  # not started: the routes answer with no samples
        elif settings.every != current.every:
            current.cancel()
            self.monitor = self._new(settings.every)
            self.monitor.start()


PERFORMANCE: web.AppKey[Performance] = web.AppKey("llmswap_performance", Performance)


async def performance_route(request: web.Request) -> web.Response:
    perf = request.app[PERFORMANCE]
    if perf.monitor is None:
        return web.json_response({"enabled": False}, status=503)
    after: float | None = None
    if raw := request.query.get("after"):
        try:
            # An unencoded `+01:00` arrives as ` 01:00` (a query's `+` is a space).
            text = raw.strip().replace("Z", "+00:00").replace(" ", "+")
            after = datetime.fromisoformat(text).timestamp()
        except ValueError:
            return error_response(request, 400, "invalid 'after' timestamp, use RFC3339 format")
    return web.json_response(perf.monitor.report(after))


async def hardware_route(request: web.Request) -> web.Response:
    report = request.app[PERFORMANCE].hardware
    if report is None:
        return error_response(request, 503, "hardware detection unavailable")
    return web.json_response(report)


class MachineCollector:
    """The newest samples as Prometheus series (nothing before the first sample, or when disabled)."""

    def __init__(self, perf: Performance) -> None:
        self.perf = perf

    def collect(self) -> Iterator[Metric]:
        monitor = self.perf.monitor
        latest = monitor.latest_system() if monitor is not None else None
        if latest is not None:
            cpu = GaugeMetricFamily("llmswap_cpu_util_percent", "CPU use per core (%)", labels=("core",))
            for core, value in enumerate(latest.cpu_util_per_core):
                cpu.add_metric((str(core),), value)
            yield cpu
            for name, value in (("total", latest.mem_total_mb), ("used", latest.mem_used_mb),
                                ("free", latest.mem_free_mb)):
                yield GaugeMetricFamily(f"llmswap_host_memory_{name}_bytes", f"Host memory {name}",
                                        value=value * MB)
            for name, value in (("total", latest.swap_total_mb), ("used", latest.swap_used_mb)):
                yield GaugeMetricFamily(f"llmswap_host_swap_{name}_bytes", f"Host swap {name}",
                                        value=value * MB)
            load = GaugeMetricFamily("llmswap_load_average", "System load average", labels=("interval",))
            for interval, value in (("1m", latest.load_avg_1), ("5m", latest.load_avg_5),
                                    ("15m", latest.load_avg_15)):
                load.add_metric((interval,), value)
            yield load
            net = CounterMetricFamily("llmswap_network_bytes", "Network bytes by interface and direction",
                                      labels=("interface", "direction"))
            for io in latest.net_io:
                net.add_metric((io.name, "recv"), io.bytes_recv)
                net.add_metric((io.name, "sent"), io.bytes_sent)
            yield net
        gpus = monitor.latest_gpus() if monitor is not None else []
        if not gpus:
            return
        labels = ("id", "name", "uuid")
        series = {
            "util_percent": ("GPU utilisation (%)", lambda r: r.util_pct),
            "memory_util_percent": ("GPU memory in use (%)", _memory_percent),
            "memory_used_bytes": ("GPU memory used", lambda r: r.memory_used),
            "memory_total_bytes": ("GPU memory total", lambda r: r.memory_total),
            "temperature_celsius": ("GPU temperature", lambda r: r.temp_c),
            "fan_speed_percent": ("GPU fan speed (%)", lambda r: r.fan_pct),
            "power_draw_watts": ("GPU power draw", lambda r: r.power_w),
        }
        for suffix, (documentation, read) in series.items():
            family = GaugeMetricFamily(f"llmswap_gpu_{suffix}", documentation, labels=labels)
            for stat in gpus:
                value = read(stat.reading)
                if value is not None:
                    family.add_metric((str(stat.reading.index), stat.reading.name, stat.reading.uuid), value)
            yield family


def _memory_percent(reading: GpuReading) -> float | None:
    return reading.memory_used / reading.memory_total * 100 if reading.memory_total else None


def setup(app: web.Application) -> None:
    perf = app[PERFORMANCE]
    perf.metrics.registry.register(MachineCollector(perf))
    app.router.add_get("/api/performance", performance_route)
    app.router.add_get("/api/hardware", hardware_route)
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)


async def _start(app: web.Application) -> None:
    perf = app[PERFORMANCE]
    if perf.monitor is not None:
        perf.monitor.start()
    try:
        perf.hardware = await asyncio.wait_for(asyncio.to_thread(hardware.detect, perf.gauges()), 10)
    except Exception as exc:
        log.warning("hardware detection failed (%s: %s); /api/hardware answers 503", type(exc).__name__, exc)


async def _stop(app: web.Application) -> None:
    perf = app[PERFORMANCE]
    if perf.monitor is not None:
        await perf.monitor.stop()
