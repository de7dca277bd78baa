"""EngineClient over both transports (engine process and in-process thread) on a tiny random Llama:
the same requests give the same tokens as EngineCore driven directly, aborts free blocks, and an
engine that cannot start reports why."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from engine import protocol
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.sampling_params import SamplingParams
from engine.tokenizer import tokenizer_dir
from engine.weights import DEFAULT_MODEL, resolve_model_path
from service.engine_client import EngineClient, EngineStartError
from tests.model.test_tiny_models import save_tiny

PROMPTS = {"a": [5, 6, 7], "b": list(range(3, 40)), "c": [9] * 17}
PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> EngineConfig:
    path, _ = save_tiny(tmp_path_factory.mktemp("tiny"), "llama")
    for f in tokenizer_dir(resolve_model_path(DEFAULT_MODEL)).iterdir():  # any tokenizer will do:
        shutil.copy(f, path / f.name)  # these tests send token ids
    return EngineConfig(model=str(path), block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
                        num_kv_blocks=80, cpu_linear="mkl", num_threads=1)


def offline_tokens(config: EngineConfig) -> dict[str, list[int]]:
    core = EngineCore(config)
    for request_id, prompt in PROMPTS.items():
        core.add_request(request_id, prompt, PARAMS)
    tokens = {request_id: [] for request_id in PROMPTS}
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens[delta.request_id] += delta.new_token_ids
    return tokens


async def collect(stream: asyncio.Queue) -> tuple[list[int], str]:
    tokens = []
    while True:
        event = await asyncio.wait_for(stream.get(), 60)
        assert isinstance(event, protocol.SequenceDelta), event
        tokens += event.new_token_ids
        if event.finish_reason is not None:
            return tokens, event.finish_reason


@pytest.mark.parametrize("transport", ["process", "inprocess"])
def test_transports_match_the_engine_and_free_aborted_blocks(tiny_config, transport):
    want = offline_tokens(tiny_config)

    async def run():
        states = []
        client = EngineClient(tiny_config, transport, on_state_change=states.append)
        await client.start()
        assert states == [True] and client.info.vocab_size == 256
        streams = {rid: client.add_request(protocol.AddRequest(rid, prompt, PARAMS))
                   for rid, prompt in PROMPTS.items()}
        results = {rid: await collect(stream) for rid, stream in streams.items()}
        long = client.add_request(protocol.AddRequest(
            "long", [4, 5], SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)))
        await long.get()
        client.abort("long")
        while not (client.stats and client.stats.num_running == 0):
            await asyncio.sleep(0.01)
        stats = client.stats
        await client.shutdown()
        return results, stats

    results, stats = asyncio.run(run())
    assert {rid: tokens for rid, (tokens, _) in results.items()} == want
    assert {reason for _, reason in results.values()} == {"length"}
    assert stats.num_used_blocks == 0 and stats.num_waiting == 0


@pytest.mark.parametrize("transport", ["process", "inprocess"])
def test_engine_that_cannot_load_says_why(tmp_path, transport):
    config = EngineConfig(model=str(tmp_path / "nothing.gguf"))

    async def run():
        client = EngineClient(config, transport)
        with pytest.raises(EngineStartError) as raised:
            await client.start()
        await client.shutdown()
        return str(raised.value)

    assert "nothing.gguf" in asyncio.run(run())
