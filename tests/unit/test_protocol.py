"""The wire protocol: every message survives encode -> decode unchanged, and stays torch/grpc-free."""

import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from engine import protocol
from engine.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[2]

PARAMS = SamplingParams(max_tokens=7, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
                        repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=-0.5, seed=1234,
                        stop_token_ids=(2, 13, 128009), ignore_eos=True, logprobs=3)
LOGPROBS = protocol.TokenLogprobs(token_id=42, logprob=-0.25, top=((42, -0.25), (7, -1.5), (99, -3.0)))

ADD = protocol.AddRequest("r1", [1, 2, 3, 65536, 128000], PARAMS, priority=2, arrival_time=12.5)
DELTA = protocol.SequenceDelta("r1", [42, 9], [LOGPROBS, protocol.TokenLogprobs(9, -0.5, ())],
                               finish_reason="stop", num_prompt_tokens=5, num_cached_tokens=16,
                               queue_time_s=0.125)
STEP = protocol.StepOutputs(8, [protocol.SequenceDelta("a", [1], queue_time_s=0.5),
                                protocol.SequenceDelta("b", [2], [LOGPROBS]),
                                protocol.SequenceDelta("c", [], finish_reason="aborted"),
                                protocol.SequenceDelta("d", [3], [None], finish_reason="length")])
STATS = protocol.EngineStats(num_steps=100, num_running=3, num_waiting=4, num_used_blocks=30,
                             num_usable_blocks=120, num_preemptions=1, prefix_cache_queries=64,
                             prefix_cache_hits=48)

# At least one example per tag; the list is checked against MESSAGE_TYPES below.
EXAMPLES = [
    ADD,
    protocol.AddRequest("r2", [5], SamplingParams()),  # defaults: empty stop_token_ids, seed None
    protocol.Abort(["r1", "r2", "ünïcode-☃"]),
    protocol.Abort([]),
    protocol.Shutdown(),
    protocol.Ready(model_id="SmolLM2-135M", architecture="llama", vocab_size=49152, max_model_len=2048,
                   block_size=16, num_kv_blocks=512, max_num_seqs=32, max_num_batched_tokens=2048,
                   scheduling="continuous", device="cpu", dtype="float32", eos_token_ids=[0, 2],
                   tokenizer_dir="/models/smollm2", pid=4321),
    LOGPROBS,
    protocol.TokenLogprobs(token_id=0, logprob=0.0, top=()),
    protocol.SequenceDelta("r1", [17]),  # new_logprobs defaults to []
    protocol.SequenceDelta("r1", [17, 18], [None, None]),  # logprobs None per token
    DELTA,
    protocol.StepOutputs(7, []),
    STEP,
    STATS,
    protocol.RequestRejected("r3", "prompt too long: 5000 > max_model_len 2048"),
    protocol.EngineError("OSError: model.gguf: no such file"),
]


def test_examples_cover_every_message_type():
    assert {type(msg) for msg in EXAMPLES} == set(protocol.MESSAGE_TYPES.values())
    assert len({cls.tag for cls in protocol.MESSAGE_TYPES.values()}) == len(protocol.MESSAGE_TYPES)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    data = protocol.encode(msg)
    assert isinstance(data, bytes)
    decoded = protocol.decode(data)
    assert type(decoded) is type(msg)
    assert decoded == msg
    assert protocol.encode(decoded) == data  # and it encodes back to the same bytes


def test_nested_fields_come_back_with_their_types():
    add = protocol.decode(protocol.encode(ADD))
    assert add.params == PARAMS and add.params.stop_token_ids == (2, 13, 128009)  # a tuple again
    assert add.params.seed == 1234 and add.params.logprobs == 3 and add.params.ignore_eos is True

    delta = protocol.decode(protocol.encode(DELTA))
    assert delta.new_logprobs[0].top == ((42, -0.25), (7, -1.5), (99, -3.0))  # tuples, not lists
    assert delta.new_logprobs[1].top == ()
    assert delta.queue_time_s == 0.125 and delta.finish_reason == "stop"

    step = protocol.decode(protocol.encode(STEP))
    assert [d.request_id for d in step.outputs] == ["a", "b", "c", "d"]
    assert [d.new_logprobs for d in step.outputs] == [[], [LOGPROBS], [], [None]]
    assert all(type(d) is protocol.SequenceDelta for d in step.outputs)

    stats = protocol.decode(protocol.encode(STATS))
    assert stats.kv_cache_usage == 0.25


def test_wire_layout_is_tag_then_fields():
    assert msgpack.unpackb(protocol.encode(protocol.Abort(["x"]))) == [2, ["x"]]
    assert msgpack.unpackb(protocol.encode(protocol.Shutdown())) == [3]


@pytest.mark.parametrize("tag", [0, 4, 17, 999, "1"])
def test_unknown_tag_raises_value_error(tag):
    with pytest.raises(ValueError, match="unknown message tag"):
        protocol.decode(msgpack.packb([tag, "x"]))


def test_protocol_and_ipc_import_neither_torch_nor_grpc():
    code = ("import sys, engine.protocol, engine.ipc; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'grpc', 'grpc_tools')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"
