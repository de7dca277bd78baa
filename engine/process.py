"""The engine process: owns the model, the KV cache and every Sequence; the service sends commands.

    service ──requests──► [drain commands] ─► [step] ─► StepOutputs ──outputs──► service
                               ▲                │
                               └── idle: sleep on the request queue (no spinning)

Each loop drains the request queue (AddRequest, Abort, Shutdown) before the next step, so an abort
frees its blocks before that step runs. When nothing is running the engine blocks on the request
queue with a timeout and checks that its parent is still alive; it also asks the kernel to kill it
when the parent dies (PR_SET_PDEATHSIG), so an engine is never orphaned.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
import traceback

from engine import protocol
from engine.config import EngineConfig
from engine.ipc import Empty, Full, MessageQueue

IDLE_WAIT_S = 0.5  # how long an idle engine sleeps between checks on its parent
STATS_INTERVAL_S = 0.25  # EngineStats at most this often while busy (and always when going idle)
PUT_TIMEOUT_S = 1.0  # an output that waits this long for room re-checks the parent, then retries
_PR_SET_PDEATHSIG = 1


def run_engine(config: EngineConfig, requests: MessageQueue, outputs: MessageQueue,
               parent_pid: int) -> None:
    """Entry point of the engine process (a `multiprocessing` spawn target)."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the service, which shuts us down
    try:
        engine = EngineLoop(config, requests, outputs, parent_pid)
    except Exception as exc:  # the model cannot load: say why, then exit non-zero
        _put(outputs, protocol.EngineError(f"{type(exc).__name__}: {exc}"), parent_pid)
        raise SystemExit(1) from exc
    engine.run()


class EngineLoop:
    def __init__(self, config: EngineConfig, requests: MessageQueue, outputs: MessageQueue,
                 parent_pid: int) -> None:
        from engine.core import EngineCore  # torch is imported here, in the child only
        from engine.tokenizer import tokenizer_dir

        self.requests = requests
        self.outputs = outputs
        self.parent_pid = parent_pid
        self.core = EngineCore(config)
        model, cache = self.core.model_config, self.core.cache_config
        self.ready = protocol.Ready(
            model_id=self.core.model_path.name, architecture=model.architecture,
            vocab_size=model.vocab_size, max_model_len=cache.max_model_len,
            block_size=cache.block_size, num_kv_blocks=cache.num_kv_blocks,
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            scheduling=config.scheduling, device=config.device, dtype=config.dtype,
            eos_token_ids=list(model.eos_token_ids),
            tokenizer_dir=str(tokenizer_dir(self.core.model_path)), pid=os.getpid())
        self._last_stats = 0.0

    def run(self) -> None:
        self._put(self.ready)
        while True:
            busy = self.core.has_unfinished_requests()
            try:
                commands = self.requests.get_many(timeout=0 if busy else IDLE_WAIT_S)
            except Empty:
                commands = []
                if not busy and not _alive(self.parent_pid):
                    return
            aborted = False
            for command in commands:
                if isinstance(command, protocol.Shutdown):
                    return
                aborted |= self._handle(command)
            if aborted:
                self._send_stats()  # show the aborted requests' blocks freed, before the next step
            if self.core.has_unfinished_requests():
                deltas = self.core.step()
                if deltas:
                    self._put(protocol.StepOutputs(self.core.num_steps, deltas))
                if not self.core.has_unfinished_requests():
                    self._send_stats()  # going idle: the final gauges (all blocks free)
                elif time.monotonic() - self._last_stats >= STATS_INTERVAL_S:
                    self._send_stats()

    def _handle(self, command: protocol.Message) -> bool:
        """Apply one command; True if it aborted something."""
        if isinstance(command, protocol.AddRequest):
            try:
                self.core.add_request(command.request_id, command.prompt_token_ids, command.params,
                                      command.priority, command.arrival_time)
            except ValueError as exc:
                self._put(protocol.RequestRejected(command.request_id, str(exc)))
            return False
        if isinstance(command, protocol.Abort):
            return any([self.core.abort(request_id) for request_id in command.request_ids])
        raise TypeError(f"the engine cannot handle {type(command).__name__}")

    def _send_stats(self) -> None:
        scheduler = self.core.scheduler
        blocks = scheduler.block_manager
        self._put(protocol.EngineStats(
            num_steps=self.core.num_steps,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            num_used_blocks=blocks.num_blocks - 1 - blocks.num_free_blocks,
            num_usable_blocks=blocks.num_blocks - 1,
            num_preemptions=scheduler.num_preemptions,
            prefix_cache_queries=blocks.prefix_cache_queries,
            prefix_cache_hits=blocks.prefix_cache_hits,
        ))
        self._last_stats = time.monotonic()

    def _put(self, msg: protocol.Message) -> None:
        _put(self.outputs, msg, self.parent_pid)


def _put(outputs: MessageQueue, msg: protocol.Message, parent_pid: int) -> None:
    """Send to the service, waiting for room as long as the service lives (backpressure)."""
    while True:
        try:
            outputs.put(msg, timeout=PUT_TIMEOUT_S)
            return
        except Full:
            if not _alive(parent_pid):
                raise SystemExit(0) from None


def _alive(pid: int) -> bool:
    return os.getppid() == pid


def _die_with_parent(parent_pid: int) -> None:
    """Have Linux SIGKILL this process when its parent exits; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        traceback.print_exc()  # not Linux: the idle loop's parent check still covers us
    if not _alive(parent_pid):
        raise SystemExit(0)
