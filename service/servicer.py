"""`turnstile.v1.GenerationService`: requests in, one streamed message per engine step out.

    Generate ─► validate ─► EngineClient.add_request ─► deltas ─► detokenize ─► GenerateResponse
                                                            │
                          stop string seen ─► Abort ◄───────┘      cancel / deadline ─► Abort

Every error is a `ServiceError` turned into a gRPC status by `abort_with` (service/errors.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import grpc

from engine import protocol
from service.detokenizer import IncrementalDetokenizer
from service.engine_client import EngineClient, EngineDied, ServerAborted
from service.errors import InvalidArgument, QueueFull, ServiceError, Unavailable, abort_with
from service.tokenizer import ServiceTokenizer
from service.validation import Limits, ValidRequest, prompt_token_ids, validate
from turnstile_client.pb import generate_pb2 as pb
from turnstile_client.pb import generate_pb2_grpc as pb_grpc

FINISH_REASONS = {
    "length": pb.FINISH_REASON_LENGTH,
    "stop": pb.FINISH_REASON_STOP,
    "aborted": pb.FINISH_REASON_ABORTED,
}


class GenerationServicer(pb_grpc.GenerationServiceServicer):
    def __init__(self, engine: EngineClient, limits: Limits, max_queue_size: int) -> None:
        self.engine = engine
        self.limits = limits
        self.max_queue_size = max_queue_size
        self.tokenizer: ServiceTokenizer | None = None  # set once the engine is ready
        self.draining = False

    # -- RPCs -------------------------------------------------------------------------------------

    async def Generate(self, request: pb.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        arrival = time.monotonic()
        request_id = request.request_id or uuid.uuid4().hex
        try:
            self._check_available()
            valid = validate(request, self.tokenizer, self.engine.info, self.limits)
            self._check_capacity()
            stream = self.engine.add_request(protocol.AddRequest(
                request_id, valid.prompt_token_ids, valid.params, valid.priority, arrival))
        except ServiceError as error:
            await abort_with(context, error)
        finished = False
        try:
            async for response in self._responses(request_id, valid, stream, arrival):
                finished = response.finish_reason != pb.FINISH_REASON_UNSPECIFIED
                yield response
        except ServiceError as error:
            finished = True  # the engine has already dropped it (died or rejected it)
            await abort_with(context, error)
        finally:
            if not finished:  # cancelled, disconnected or past its deadline
                self.engine.abort(request_id)

    async def Tokenize(self, request: pb.TokenizeRequest,
                       context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        try:
            self._check_available()
            return pb.TokenizeResponse(token_ids=prompt_token_ids(request, self.tokenizer))
        except ServiceError as error:
            await abort_with(context, error)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> pb.GetModelInfoResponse:
        info = self.engine.info
        if info is None:
            await abort_with(context, Unavailable("the engine is still loading the model"))
        return pb.GetModelInfoResponse(
            model_id=info.model_id, architecture=info.architecture, vocab_size=info.vocab_size,
            max_model_len=info.max_model_len, block_size=info.block_size,
            num_kv_blocks=info.num_kv_blocks, max_num_seqs=info.max_num_seqs,
            max_num_batched_tokens=info.max_num_batched_tokens, scheduling=info.scheduling,
            device=info.device, dtype=info.dtype, eos_token_ids=info.eos_token_ids,
            max_tokens_cap=self.limits.max_tokens_cap)

    # -- helpers ----------------------------------------------------------------------------------

    def _check_available(self) -> None:
        if self.draining:
            raise Unavailable("the server is shutting down; send the request to another replica")
        if not self.engine.serving or self.tokenizer is None:
            raise Unavailable("the engine is not ready (starting or restarting); retry shortly")

    def _check_capacity(self) -> None:
        # max_num_seqs requests run; up to max_queue_size more wait; the rest are turned away.
        capacity = self.engine.info.max_num_seqs + self.max_queue_size
        if self.engine.num_in_flight >= capacity:
            raise QueueFull(f"the waiting queue is full ({self.max_queue_size} requests waiting "
                            f"behind {self.engine.info.max_num_seqs} running); retry later")

    async def _responses(self, request_id: str, valid: ValidRequest, stream,
                         arrival: float) -> AsyncIterator[pb.GenerateResponse]:
        detokenizer = IncrementalDetokenizer(self.tokenizer, valid.prompt_token_ids, valid.stop)
        num_completion_tokens = 0
        time_to_first_token = queue_time = 0.0
        while True:
            event = await stream.get()
            if isinstance(event, EngineDied):
                raise Unavailable("the engine stopped while generating; it is being restarted, retry")
            if isinstance(event, protocol.RequestRejected):
                raise InvalidArgument(event.message)
            response = pb.GenerateResponse(request_id=request_id)
            if isinstance(event, ServerAborted):
                finish_reason = pb.FINISH_REASON_ABORTED
                response.text = detokenizer.flush()
                delta = None
            else:
                delta: protocol.SequenceDelta = event
                if num_completion_tokens == 0:
                    time_to_first_token = time.monotonic() - arrival
                    queue_time = delta.queue_time_s or 0.0
                num_completion_tokens += len(delta.new_token_ids)
                response.token_ids.extend(delta.new_token_ids)
                response.text = detokenizer.add_tokens(delta.new_token_ids)
                for logprobs in delta.new_logprobs:
                    if logprobs is not None:
                        response.logprobs.append(_logprobs(logprobs))
                finish_reason = pb.FINISH_REASON_UNSPECIFIED
                if detokenizer.stop_hit:
                    finish_reason = pb.FINISH_REASON_STOP_STRING
                    self.engine.abort(request_id)  # a no-op if this delta also finished it
                elif delta.finish_reason is not None:
                    finish_reason = FINISH_REASONS[delta.finish_reason]
                    response.text += detokenizer.flush()
            if finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                response.finish_reason = finish_reason
                response.usage.prompt_tokens = len(valid.prompt_token_ids)
                response.usage.completion_tokens = num_completion_tokens
                response.usage.cached_tokens = delta.num_cached_tokens if delta else 0
                response.timings.queue_time_s = queue_time
                response.timings.time_to_first_token_s = time_to_first_token
                yield response
                return
            if response.token_ids:
                yield response


def _logprobs(record: protocol.TokenLogprobs) -> pb.TokenLogprobs:
    return pb.TokenLogprobs(
        token_id=record.token_id, logprob=record.logprob,
        top=[pb.TopLogprob(token_id=t, logprob=lp) for t, lp in record.top])
