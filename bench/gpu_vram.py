"""The vram router on a real GPU: real NVML readings, upstreams that hold real device memory.

    python -m bench.gpu_vram [--out FOLDER]

Run on a machine with an NVIDIA GPU and PyTorch (the device check; CI has no GPU, where the same router is
tested against fake NVML readings, tests/integration/vram/). Three upstreams (bench/gpu_holder.py) each
hold about 38% of the free memory, so two fit and a third does not. Phases, each a fresh llmswap:

1. declared footprints: a, b run side by side; c evicts the least recently used; what llmswap believes is in
   use is set against what NVML reports, and each model's footprint as NVML measured it under its pid;
2. memory llmswap does not own: another program holds half the free memory; a still fits, b must evict a;
3. footprints declared far too small (1 GiB each, fresh state): the router lets a third start that does not
   fit, PyTorch fails with "CUDA out of memory", and llmswap must recover by evicting and starting it again.

Prints a markdown report and writes it, with the raw readings, to FOLDER (default: the current folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.launch import free_port, running_llmswap
from llmswap.machine.nvml import NvmlReader

GIB = 2**30
record: dict[str, Any] = {"phases": {}}


def gpu_used() -> tuple[int, int]:
    reader = NvmlReader()
    try:
        device = reader.devices()[0]
        return device.used, device.total
    finally:
        reader.close()


def config(folder: Path, hold: int, declared: int | None, state: Path) -> Path:
    holder = f"{sys.executable} -m bench.gpu_holder --hold {hold}"
    models = {}
    for name in "abc":
        entry: dict[str, Any] = {"cmd": f"{holder} -- --port ${{PORT}} --model-name {name}"}
        if declared is not None:
            entry["vram"] = f"{declared / GIB:g}GiB"
        models[name] = entry
    path = folder / f"llmswap-{len(list(folder.glob('*.yaml')))}.yaml"
    path.write_text(json.dumps({
        "healthCheckTimeout": 120, "startPort": free_port(), "stateDir": str(state), "models": models,
        "routing": {"router": {"use": "vram", "settings": {"reserve": "1GiB",
                                                            "evict_costs": {"a": 1, "b": 1, "c": 1}}}},
    }))
    return path


async def ask(http: aiohttp.ClientSession, url: str, model: str) -> dict[str, Any]:
    """One request for `model`; then what llmswap runs, believes in use, and what NVML reports."""
    began = time.monotonic()
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{url}/v1/chat/completions", json=body) as answer:
        status, text = answer.status, await answer.text()
    took = time.monotonic() - began
    async with http.get(f"{url}/running") as answer:
        shown = await answer.json()
    used, total = gpu_used()
    device = next(iter(shown["vram"]["devices"].values()))
    step = {
        "asked": model, "status": status, "seconds": round(took, 2),
        "running": sorted(e["model"] for e in shown["running"] if e["state"] == "ready"),
        "llmswap_in_use_gib": round(device["in_use"] / GIB, 2),
        "budget_gib": round(device["budget"] / GIB, 2),
        "nvml_used_gib": round(used / GIB, 2), "nvml_total_gib": round(total / GIB, 2),
        "footprints_gib": {e["model"]: round(e["vram"]["footprint"] / GIB, 2) for e in shown["running"]},
        "sources": {e["model"]: e["vram"]["source"] for e in shown["running"]},
        "error": None if status == 200 else text[:400],
    }
    print(f"  {model}: {status} in {took:.1f} s; running {step['running']}; llmswap in use "
          f"{step['llmswap_in_use_gib']} GiB, NVML used {step['nvml_used_gib']} GiB", file=sys.stderr)
    return step


async def phase(name: str, path: Path, order: str) -> list[dict[str, Any]]:
    print(f"{name}...", file=sys.stderr)
    steps = []
    async with running_llmswap(path, []) as server, aiohttp.ClientSession() as http:
        for model in order:
            steps.append(await ask(http, server.url, model))
        log = path.with_name("llmswap.log").read_text(errors="replace")
    record["phases"][name] = {"steps": steps, "oom_lines": [line for line in log.splitlines()
                                                            if "out of memory" in line.lower()][:5]}
    return steps


async def main() -> str:
    used, total = gpu_used()
    free = total - used
    hold = int(free * 0.38) // GIB * GIB
    record.update(total_gib=round(total / GIB, 2), used_before_gib=round(used / GIB, 2),
                  hold_gib=hold // GIB)
    print(f"GPU: {total / GIB:.1f} GiB, {used / GIB:.1f} used; each upstream holds {hold / GIB:.0f} GiB",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="llmswap-gpu-") as temporary:
        folder = Path(temporary)
        declared = hold + 2 * GIB  # the block, and PyTorch's CUDA context beside it
        first = await phase("declared", config(folder, hold, declared, folder / "state1"), "abca")
        command = [sys.executable, "-m", "bench.gpu_holder", "--hold", str(free // 2)]
        outsider = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
        try:
            assert outsider.stdout is not None
            outsider.stdout.readline()  # "holding ..."
            second = await phase("foreign memory", config(folder, hold, declared, folder / "state2"), "ab")
        finally:
            outsider.terminate()
            outsider.wait(30)
        third = await phase("declared too small", config(folder, hold, GIB, folder / "state3"), "abc")
    checks = {
        "a and b side by side": first[1]["running"] == ["a", "b"],
        "c evicted the least recently used (a)": first[2]["running"] == ["b", "c"],
        "llmswap's in-use within 10% of NVML's growth": all(
            abs(s["llmswap_in_use_gib"] - (s["nvml_used_gib"] - record["used_before_gib"]))
            <= 0.1 * max(s["llmswap_in_use_gib"], 1) for s in first),
        "with foreign memory, b evicted a": second[0]["running"] == ["a"] and second[1]["running"] == ["b"],
        "every request answered 200": all(s["status"] == 200 for s in first + second + third),
        "an under-declared model that hit a real OOM was started again": third[2]["status"] == 200,
    }
    record["checks"] = checks
    lines = [f"GPU {record['total_gib']} GiB ({record['used_before_gib']} GiB used before); each upstream "
             f"holds {record['hold_gib']} GiB", "", "| phase | asked | status | s | running | llmswap in use "
             "GiB | NVML used GiB | footprints GiB (source) |", "|---|---|---:|---:|---|---:|---:|---|"]
    for name, data in record["phases"].items():
        for s in data["steps"]:
            prints = ", ".join(f"{m} {g} ({s['sources'][m]})" for m, g in s["footprints_gib"].items())
            lines.append(f"| {name} | {s['asked']} | {s['status']} | {s['seconds']} | "
                         f"{' '.join(s['running'])} | {s['llmswap_in_use_gib']} | {s['nvml_used_gib']} | "
                         f"{prints} |")
    lines += ["", *[f"- {'PASS' if ok else 'FAIL'}: {what}" for what, ok in checks.items()]]
    report = "\n".join(lines) + "\n"
    print(report)
    return report


def write(out: Path, report: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_vram.md").write_text(report)
    (out / "gpu_vram.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    write(parser.parse_args().out, asyncio.run(main()))
