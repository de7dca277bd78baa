"""Generate over real gRPC on loopback, against a real engine process."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import grpc
import pytest

from engine import SamplingParams
from tests.conftest import CHATS
from tests.service.conftest import MAX_MODEL_LEN, MAX_TOKENS_CAP
from turnstile_client import (AsyncClient, Client, InvalidArgumentError, TurnstileError,
                              build_request)
from turnstile_client.pb import generate_pb2 as pb
from turnstile_client.pb import generate_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address, timeout=120) as client:
        yield client


def test_stream_order_and_final_message(client, llm):
    chunks = list(client.generate_stream([{"role": "user", "content": CHATS[0]}], max_tokens=12,
                                         temperature=0, request_id="order-1"))
    assert {c.request_id for c in chunks} == {"order-1"}
    assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    token_ids = [t for c in chunks for t in c.token_ids]
    assert all(len(c.token_ids) == 1 for c in chunks)  # one message per engine step
    assert last.finish_reason in ("length", "stop")
    assert last.usage.completion_tokens == len(token_ids) <= 12
    prompt = llm.chat_prompt([{"role": "user", "content": CHATS[0]}])
    assert last.usage.prompt_tokens == len(llm.tokenizer.encode(prompt, add_special_tokens=False))
    assert "".join(c.text for c in chunks) == llm.tokenizer.decode(token_ids, skip_special_tokens=True)
    assert 0 <= last.timings.queue_time_s <= last.timings.time_to_first_token_s


def test_sixteen_concurrent_streams_match_offline_llm(server, llm, chat_prompts):
    prompts = [chat_prompts[i % len(chat_prompts)] + " " * (i // len(chat_prompts)) for i in range(16)]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    offline = llm.generate(prompts, params)

    async def run_all():
        async with AsyncClient(server.address, timeout=300) as client:
            return await asyncio.gather(*[client.generate(list(o.prompt_token_ids), max_tokens=24,
                                                          temperature=0) for o in offline])

    served = asyncio.run(run_all())
    for got, want in zip(served, offline):
        assert got.token_ids == want.token_ids
        assert got.text == want.text
        assert got.finish_reason == want.finish_reason


def test_text_prompt_and_tokenize_agree(client, llm):
    ids = client.tokenize("The quick brown fox")
    assert ids == llm.tokenizer.encode("The quick brown fox", add_special_tokens=True)
    out = client.generate("The quick brown fox", max_tokens=3, temperature=0)
    assert out.usage.prompt_tokens == len(ids)


def test_stop_string_is_cut_and_aborts(server, client):
    full = client.generate("The capital of France is", max_tokens=16, temperature=0, ignore_eos=True)
    words = full.text.split()
    assert len(words) >= 3, full.text
    stop = " " + words[2]
    cut = client.generate("The capital of France is", max_tokens=16, temperature=0,
                          ignore_eos=True, stop=[stop])
    assert cut.finish_reason == "stop_string"
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.usage.completion_tokens < full.usage.completion_tokens
    server.wait_for_stats(lambda s: s.num_running == 0 and s.num_used_blocks == 0)


def test_stop_token_ids_and_eos(client):
    full = client.generate("Count: one, two,", max_tokens=8, temperature=0, ignore_eos=True)
    stop_id = full.token_ids[3]
    out = client.generate("Count: one, two,", max_tokens=8, temperature=0, ignore_eos=True,
                          stop_token_ids=[stop_id])
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: full.token_ids.index(stop_id) + 1]


def test_logprobs(client):
    out = client.generate("Hello", max_tokens=4, temperature=0, logprobs=3, ignore_eos=True)
    assert len(out.logprobs) == len(out.token_ids) == 4
    for record, token_id in zip(out.logprobs, out.token_ids):
        assert record.token_id == token_id
        assert len(record.top) == 3 and record.top[0][0] == token_id  # greedy: the top token
        assert record.logprob <= 0 and math.isclose(record.logprob, record.top[0][1], rel_tol=1e-6)


def test_seeded_sampling_is_reproducible(client):
    a = client.generate("Once upon a time", max_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    b = client.generate("Once upon a time", max_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    assert a.token_ids == b.token_ids


def test_model_info(client):
    info = client.model_info()
    assert (info.vocab_size, info.max_model_len, info.max_tokens_cap) == (49152, MAX_MODEL_LEN, MAX_TOKENS_CAP)
    assert info.max_num_seqs == 16 and info.scheduling == "continuous" and info.eos_token_ids


BAD_REQUESTS = [
    ("prompt too long", dict(prompt=[1] * MAX_MODEL_LEN), "max_model_len"),
    ("empty text", dict(prompt=""), "text"),
    ("empty token ids", dict(prompt=[]), "token_ids"),
    ("token outside vocabulary", dict(prompt=[1, 49152]), "token_ids.ids[1]"),
    ("max_tokens zero", dict(max_tokens=0), "max_tokens"),
    ("max_tokens above cap", dict(max_tokens=MAX_TOKENS_CAP + 1), "max_tokens"),
    ("negative temperature", dict(temperature=-0.5), "sampling.temperature"),
    ("NaN temperature", dict(temperature=float("nan")), "sampling.temperature"),
    ("top_p zero", dict(top_p=0.0), "sampling.top_p"),
    ("top_p above one", dict(top_p=1.5), "sampling.top_p"),
    ("min_p above one", dict(min_p=2.0), "sampling.min_p"),
    ("repetition_penalty zero", dict(repetition_penalty=0.0), "sampling.repetition_penalty"),
    ("too many stop strings", dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("empty stop string", dict(stop=[""]), "stop[0]"),
    ("stop token outside vocabulary", dict(stop_token_ids=[10**6]), "stop_token_ids[0]"),
    ("too many logprobs", dict(logprobs=21), "logprobs"),
    ("seed too large", dict(seed=2**64 - 1), "sampling.seed"),
]


@pytest.mark.parametrize("case,kwargs,field", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_input_is_invalid_argument_naming_the_field(client, case, kwargs, field):
    kwargs = {"prompt": "Hello", **kwargs}
    with pytest.raises(InvalidArgumentError) as raised:
        client.generate(kwargs.pop("prompt"), **kwargs)
    assert raised.value.code == "INVALID_ARGUMENT"
    assert field in raised.value.message, raised.value.message


def test_missing_prompt_and_empty_chat(server):
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        for request, field in [(pb.GenerateRequest(), "prompt"),
                               (pb.GenerateRequest(chat=pb.Chat()), "chat.messages")]:
            with pytest.raises(grpc.RpcError) as raised:
                list(stub.Generate(request, timeout=30))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in raised.value.details()


def test_duplicate_request_id_is_rejected(client):
    stream = client.generate_stream("Tell me a long story.", max_tokens=200, ignore_eos=True,
                                    request_id="twin")
    next(stream)
    with pytest.raises(TurnstileError) as raised:
        client.generate("Hello", max_tokens=2, request_id="twin")
    assert raised.value.code == "ALREADY_EXISTS"
    stream.close()


def _long_stream(client, request_id):
    """A stream that would run for hundreds of steps; returns it after its first chunk."""
    stream = client.generate_stream("Write a very long essay about the ocean.", max_tokens=MAX_TOKENS_CAP,
                                    ignore_eos=True, request_id=request_id)
    next(stream)
    return stream


def test_cancel_frees_blocks_within_one_step(server, client):
    keeper = _long_stream(client, "keeper")  # keeps the engine stepping while the other goes
    victim = _long_stream(client, "victim")
    server.wait_for_stats(lambda s: s.num_running == 2)
    steps_at_cancel = server.engine.num_steps
    victim.close()  # cancels the call
    stats = server.wait_for_stats(lambda s: s.num_running == 1)
    assert stats.num_steps <= steps_at_cancel + 2  # the step in flight, plus propagation
    keeper.close()
    stats = server.wait_for_stats(lambda s: s.num_running == 0)
    assert stats.num_used_blocks == 0


def test_deadline_aborts_and_frees_blocks(server):
    with Client(server.address) as client:
        with pytest.raises(TurnstileError) as raised:
            client.generate("Write a very long essay about the ocean.", max_tokens=MAX_TOKENS_CAP,
                            ignore_eos=True, timeout=1.0)
    assert raised.value.code == "DEADLINE_EXCEEDED"
    stats = server.wait_for_stats(lambda s: s.num_running == 0 and s.num_waiting == 0)
    assert stats.num_used_blocks == 0
    assert server.engine.num_in_flight == 0


def test_client_disconnect_frees_blocks(server):
    channel_client = Client(server.address)
    stream = _long_stream(channel_client, "dropped")
    server.wait_for_stats(lambda s: s.num_running == 1)
    channel_client.close()  # the connection goes away without a clean cancel of the stream
    stats = server.wait_for_stats(lambda s: s.num_running == 0)
    assert stats.num_used_blocks == 0
    del stream


def test_health_and_reflection(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "turnstile.v1.GenerationService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert {"turnstile.v1.GenerationService", "grpc.health.v1.Health"} <= names
