"""KV caches kept across swaps, end to end: llmswap saves a llama-server's slots before it stops it for a swap
and restores them after the next start, so a conversation that comes back to its model processes only its new
tokens.

Each test runs its own llmswap over real llama-server processes. `warm` and `cold` serve the same GGUF, with
`kvCache` on and off; `other` is another model in the same swap group, so asking for it stops them. The
conversations are a few thousand tokens of words; answers are greedy (temperature 0, fixed seed), so the
same prompt and cache give the same text.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.e2e.llamaserver.conftest import START_WITHIN, llamaserver_entry
from tests.helpers.cli import LlmswapProcess, running_llmswap, stop_with, write_config
from tests.helpers.demo import free_port_run
from tests.helpers.gguf_model import TinyLlama, words, write_tiny_llama

pytestmark = [pytest.mark.llamaserver, pytest.mark.timeout(300)]

PROMPT_WORDS = 1800


def opening(seed: int = 1) -> list[dict[str, str]]:
    return [{"role": "user", "content": words(PROMPT_WORDS, seed)}]


def follow_up(messages: list[dict[str, str]], answer: str, seed: int = 2) -> list[dict[str, str]]:
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": words(12, seed)}]


class Answer:
    def __init__(self, body: dict[str, Any], seconds: float) -> None:
        self.text: str = body["choices"][0]["message"]["content"]
        self.timings: dict[str, Any] = body.get("timings", {})
        self.seconds = seconds

    @property
    def cached(self) -> int:
        return int(self.timings.get("cache_n", 0))

    @property
    def processed(self) -> int:
        return int(self.timings.get("prompt_n", 0))


async def ask(server: LlmswapProcess, model: str, messages: list[dict[str, str]]) -> Answer:
    payload = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, "seed": 7}
    began = time.monotonic()
    async with aiohttp.ClientSession() as session, session.post(
            f"{server.url}/v1/chat/completions", json=payload,
            timeout=aiohttp.ClientTimeout(total=240)) as response:
        body = await response.json()
        assert response.status == 200, body
    return Answer(body, time.monotonic() - began)


async def get_json(server: LlmswapProcess, path: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}{path}") as response:
        assert response.status == 200
        return await response.json() if "json" in response.content_type else await response.text()


def config_of(folder: Path, llama_server: str, ggufs: dict[str, Path], **top: Any) -> Path:
    models = {
        "warm": llamaserver_entry(llama_server, ggufs["chat"], kv=True),
        "cold": llamaserver_entry(llama_server, ggufs["chat"], kv=False),
        "other": llamaserver_entry(llama_server, ggufs["other"], kv=False),
    }
    top.setdefault("kvCache", {"dir": str(folder / "kv")})
    return write_config(folder / "config.yaml", models, healthCheckTimeout=START_WITHIN,
                        startPort=free_port_run(len(models)), logLevel="info", **top)


async def test_a_conversation_that_swaps_away_and_back_restores_its_cache(
        llama_server: str, ggufs: dict[str, Path], tmp_path: Path) -> None:
    async with running_llmswap(config_of(tmp_path, llama_server, ggufs)) as server:
        first = opening()
        answer = await ask(server, "warm", first)
        second = follow_up(first, answer.text)
        stayed = await ask(server, "warm", second)  # the model never left: a cache hit in the same server
        await ask(server, "other", opening(3))  # a swap: warm is saved, then stopped
        returned = await ask(server, "warm", second)  # started again, restored before it got the request

        cold_answer = await ask(server, "cold", first)
        await ask(server, "other", opening(3))
        cold = await ask(server, "cold", follow_up(first, cold_answer.text))  # the same, with no kvCache

        saves = await get_json(server, "/api/kvcache")
        metrics = await get_json(server, "/metrics")

    total = returned.cached + returned.processed
    assert returned.text == stayed.text
    assert returned.cached >= 0.95 * total, returned.timings  # nearly the whole prompt came from the cache
    assert cold.processed >= 0.95 * total and cold.cached == 0, cold.timings  # processed all over again
    assert returned.seconds < cold.seconds, (returned.seconds, cold.seconds)  # same run, same machine
    print(f"after a swap: {returned.seconds:.2f}s restored against {cold.seconds:.2f}s cold "
          f"(x{returned.seconds / cold.seconds:.2f}); {returned.cached} of {total} prompt tokens cached")

    warm = next(record for record in saves["models"] if record["model"] == "warm")
    assert [(save["slot"], save["tokens"] > total) for save in warm["saves"]] == [(0, True)]
    assert "cold" not in {record["model"] for record in saves["models"]}  # no kvCache: nothing written
    assert 'llmswap_kvcache_operations_total{action="restore",model="warm",outcome="ok"} 1.0' in metrics
    assert 'llmswap_kvcache_slots_total{action="restore",model="warm"} 1.0' in metrics
    assert 'llmswap_kvcache_operations_total{action="save",model="warm",outcome="ok"} 2.0' in metrics
    restored = [line for line in server.stderr_lines + server.stdout_lines
                if '"POST /v1/chat/completions" 200' in line and "model=warm" in line and ",restore:" in line]
    assert len(restored) == 1, server.output()  # the first start had nothing to restore
    saved = [line for line in server.stderr_lines + server.stdout_lines
             if '"POST /v1/chat/completions" 200' in line and "phases=save:" in line]
    assert len(saved) == 2, server.output()  # warm saved before each of the two swaps it lost (other, cold)
    assert 'llmswap_swap_phase_seconds_count{model="warm",phase="restore"} 1.0' in metrics
    assert f"cached={returned.cached}" in restored[0]  # and how much of the prompt the cache gave


async def test_a_changed_model_file_restores_nothing(llama_server: str, ggufs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    own = {**ggufs, "chat": tmp_path / "chat.gguf"}
    own["chat"].write_bytes(ggufs["chat"].read_bytes())
    async with running_llmswap(config_of(tmp_path, llama_server, own)) as server:
        first = opening()
        answer = await ask(server, "warm", first)
        await ask(server, "other", opening(3))  # warm saved
        assert (tmp_path / "kv" / "warm" / "slot0.bin").is_file()
        # The model file is replaced by another model of the same architecture (llama-server would restore
        # the save into it without a word).
        write_tiny_llama(TinyLlama("chat", embedding=256, layers=4, feed_forward=704, heads=4, kv_heads=2,
                                   context=4096, seed=99), own["chat"])
        second = follow_up(first, answer.text)
        changed = await ask(server, "warm", second)
        assert changed.cached == 0, changed.timings
        assert not (tmp_path / "kv" / "warm" / "slot0.bin").exists()
        assert changed.text == (await ask(server, "cold", second)).text  # it answers as the new model does
        stale = [line for line in server.stderr_lines + server.stdout_lines if "stale save" in line]
        assert stale and "changed" in stale[0], server.output()


async def test_a_conversation_survives_a_restart_of_llmswap(llama_server: str, ggufs: dict[str, Path],
                                                            tmp_path: Path) -> None:
    config = config_of(tmp_path, llama_server, ggufs)
    async with running_llmswap(config) as server:
        first = opening()
        answer = await ask(server, "warm", first)
        assert await stop_with(server, signal.SIGTERM) == 0  # the shutdown saves warm's slot
    async with running_llmswap(config) as server:
        again = await ask(server, "warm", follow_up(first, answer.text))
    assert again.cached >= 0.95 * (again.cached + again.processed), again.timings


async def test_a_changed_cmd_restores_nothing(llama_server: str, ggufs: dict[str, Path],
                                             tmp_path: Path) -> None:
    config = config_of(tmp_path, llama_server, ggufs)
    async with running_llmswap(config) as server:
        first = opening()
        answer = await ask(server, "warm", first)
        await ask(server, "other", opening(3))  # warm saved
        document = yaml.safe_load(config.read_text())
        document["models"]["warm"]["cmd"] += " --temp 0"  # another command line: another server
        config.write_text(yaml.safe_dump(document, sort_keys=False))
        server.send_signal(signal.SIGHUP)
        await server.wait_for_output("config reload: applied")
        again = await ask(server, "warm", follow_up(first, answer.text))
    assert again.cached == 0, again.timings
    output = server.stderr_lines + server.stdout_lines
    assert any("stale save" in line and "changed" in line for line in output), server.output()


async def test_saves_are_deleted_when_llmswap_was_killed_while_the_model_served(
        llama_server: str, ggufs: dict[str, Path], tmp_path: Path) -> None:
    config = config_of(tmp_path, llama_server, ggufs)
    async with running_llmswap(config) as server:
        first = opening()
        await ask(server, "warm", first)
        await ask(server, "other", opening(3))  # warm saved
        await ask(server, "warm", follow_up(first, "x"))  # restored, and now serving: nothing vouches
        os.kill(server.pid, signal.SIGKILL)  # (its upstream dies with it: the parent-death signal)
        await server.process.wait()
    async with running_llmswap(config) as server:
        again = await ask(server, "warm", follow_up(first, "x"))
    assert again.cached == 0, again.timings
    assert not (tmp_path / "kv" / "warm" / "slot0.bin").exists()


async def test_two_slots_are_saved_and_both_restored(llama_server: str, ggufs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    models = {
        "pair": llamaserver_entry(llama_server, ggufs["chat"], kv=True, slots=2),
        "other": llamaserver_entry(llama_server, ggufs["other"], kv=False),
    }
    config = write_config(tmp_path / "config.yaml", models, healthCheckTimeout=START_WITHIN,
                          startPort=free_port_run(len(models)), kvCache={"dir": str(tmp_path / "kv")})
    async with running_llmswap(config) as server:
        one, two = opening(1), opening(5)
        answer_one = await ask(server, "pair", one)
        answer_two = await ask(server, "pair", two)  # a different prompt: the other, idle slot
        await ask(server, "other", opening(3))
        saves = await get_json(server, "/api/kvcache")
        back_one = await ask(server, "pair", follow_up(one, answer_one.text))
        back_two = await ask(server, "pair", follow_up(two, answer_two.text))
    pair = next(record for record in saves["models"] if record["model"] == "pair")
    assert [save["slot"] for save in pair["saves"]] == [0, 1]
    for back in (back_one, back_two):
        assert back.cached >= 0.95 * (back.cached + back.processed), back.timings


async def test_max_size_is_held_across_models(llama_server: str, ggufs: dict[str, Path],
                                              tmp_path: Path) -> None:
    models = {
        "a": llamaserver_entry(llama_server, ggufs["chat"], kv=True),
        "b": llamaserver_entry(llama_server, ggufs["chat"], kv=True),
    }
    probe = write_config(tmp_path / "probe.yaml", models, healthCheckTimeout=START_WITHIN,
                         startPort=free_port_run(2), kvCache={"dir": str(tmp_path / "probe")})
    async with running_llmswap(probe) as server:  # how large is one conversation's save?
        await ask(server, "a", opening())
        await ask(server, "b", opening(3))
    one_save = (tmp_path / "probe" / "a" / "slot0.bin").stat().st_size

    bound = int(one_save * 1.5)  # room for one save, not two
    config = write_config(tmp_path / "config.yaml", models, healthCheckTimeout=START_WITHIN,
                          startPort=free_port_run(2),
                          kvCache={"dir": str(tmp_path / "kv"), "maxSize": f"{bound}B"})
    async with running_llmswap(config) as server:
        await ask(server, "a", opening())
        await ask(server, "b", opening(3))  # a saved
        await ask(server, "a", opening())  # b saved: the two no longer fit, a's older save goes
        saves = await get_json(server, "/api/kvcache")
    assert saves["total_bytes"] <= bound
    assert {record["model"]: len(record["saves"]) for record in saves["models"]} == {"a": 0, "b": 1}
