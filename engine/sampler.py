"""Turns one step's logits into the next token of each row.

Per row, as in vLLM and HF:

    raw logits ─► logprobs (log_softmax in float32: what the user is shown)
        │
        ▼
    penalties (repetition over prompt + output; frequency and presence over output)
        │
        ├─ temperature == 0 ─► argmax
        ▼
    / temperature ─► top_k ─► top_p ─► min_p ─► softmax ─► argmax(probs / Exp(1) noise)

The last step is the exponential race: argmax_i(p_i / E_i), with E_i ~ Exp(1) independent, picks
token i with probability p_i. Its noise is drawn per row, so a seeded row draws only from its own
generator and yields the same tokens whatever else is in the batch and wherever it sits.

Per-row parameters become [num_rows, 1] columns so that each stage is one batched op; Python loops
run over rows only to read params, draw seeded noise and build the logprobs records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain

import torch

from engine.protocol import TokenLogprobs
from engine.sampling_params import SamplingParams

# top_p first looks for the nucleus among this many largest logits, and sorts the whole row only
# when the nucleus reaches past them: on a CPU a full sort costs some 40 argmaxes of the same rows.
NUCLEUS_CANDIDATES = 512


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprobs | None]  # None where params.logprobs is None


class Sampler:
    def __init__(self, generator: torch.Generator | None = None):
        # Unseeded rows draw from this one (None: torch's default generator for the device).
        self.generator = generator

    def __call__(
        self,
        logits: torch.Tensor,  # [num_rows, vocab_size], any float dtype; never written
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],  # per row, for repetition_penalty
        output_token_ids: list[list[int]],  # per row, tokens generated so far
        generators: list[torch.Generator | None],  # per row: its own generator when seeded
    ) -> SamplerOutput:
        num_rows = logits.shape[0]
        lengths = (len(params), len(prompt_token_ids), len(output_token_ids), len(generators))
        if any(n != num_rows for n in lengths):
            raise ValueError(f"expected {num_rows} params, prompts, outputs and generators")
        if all(p.greedy and not p.has_penalties and p.logprobs is None for p in params):
            # Fast path, the common case: one argmax over the batch.
            return SamplerOutput(logits.argmax(dim=-1).tolist(), [None] * num_rows)

        raw = logits.float()  # may alias the caller's tensor: only read, never written
        logits = _apply_penalties(raw, params, prompt_token_ids, output_token_ids)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        for i in random_rows:
            if params[i].seed is not None and generators[i] is None:
                raise ValueError(f"row {i} has a seed but no generator")
        if len(random_rows) == num_rows:
            token_ids = self._sample(logits, params, generators)
        else:
            token_ids = logits.argmax(dim=-1)  # [num_rows]; random rows are overwritten below
            if random_rows:
                token_ids[random_rows] = self._sample(
                    logits[random_rows],
                    [params[i] for i in random_rows],
                    [generators[i] for i in random_rows],
                )
        token_id_list = token_ids.tolist()
        return SamplerOutput(token_id_list, _logprobs(raw, params, token_ids, token_id_list))

    def _sample(
        self,
        logits: torch.Tensor,  # [num_rows, vocab_size] float32, penalised
        params: list[SamplingParams],  # none greedy
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:  # [num_rows] token ids
        logits = logits / _column([p.temperature for p in params], logits.device)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            logits = _top_k_top_p(logits, [p.top_k for p in params], [p.top_p for p in params])
        probs = logits.softmax(dim=-1)
        if any(p.min_p > 0.0 for p in params):
            min_p = _column([p.min_p for p in params], probs.device)
            # Not renormalised: the race below is indifferent to the scale of a row.
            probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        noise = self._exponential_noise(probs.shape, probs.device, generators)
        return probs.div_(noise).argmax(dim=-1)

    def _exponential_noise(
        self, shape: torch.Size, device: torch.device, generators: list[torch.Generator | None]
    ) -> torch.Tensor:  # [num_rows, vocab_size], i.i.d. Exp(1)
        num_rows, vocab_size = shape
        uniform = torch.empty(num_rows, vocab_size, device=device)
        shared_rows = [j for j, g in enumerate(generators) if g is None]
        if len(shared_rows) == num_rows:
            uniform.uniform_(generator=self.generator)
        elif shared_rows:  # one batched draw for all unseeded rows
            uniform[shared_rows] = torch.rand(
                len(shared_rows), vocab_size, device=device, generator=self.generator
            )
        for j, generator in enumerate(generators):
            if generator is not None:  # exactly vocab_size draws per step, from its own generator
                uniform[j].uniform_(generator=generator)
        # -log(U) ~ Exp(1). rand and uniform_ draw from [0, 1), so the noise lies in (0, inf] and
        # probs / noise is never 0/0. ~4x cheaper on a CPU than Tensor.exponential_.
        return uniform.log_().neg_()


def _apply_penalties(
    logits: torch.Tensor,  # [num_rows, vocab_size] float32; not written
    params: list[SamplingParams],
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
) -> torch.Tensor:  # a penalised copy, or `logits` itself when no row has penalties
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return logits
    device, vocab_size = logits.device, logits.shape[1]
    # Penalties touch only the tokens a row has seen, so they are read and written by flat index
    # (row * vocab_size + token_id), not through [num_rows, vocab_size] masks. Where an index
    # repeats, every copy writes the same value: a token is penalised once per row, and the
    # frequency penalty is scaled by its count instead.
    output = _flat_ids(rows, [output_token_ids[i] for i in rows], vocab_size)
    seen = torch.cat([_flat_ids(rows, [prompt_token_ids[i] for i in rows], vocab_size), output])
    seen, output = seen.to(device), output.to(device)
    penalties = torch.tensor(  # [num_rows, 3]
        [[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in params],
        dtype=torch.float32,
        device=device,
    )
    out = logits.clone(memory_format=torch.contiguous_format)
    flat = out.view(-1)
    # HF/CTRL: a seen token's logit moves toward "less likely" whatever its sign.
    x, repetition = flat[seen], penalties[seen // vocab_size, 0]
    flat[seen] = torch.where(x > 0, x / repetition, x * repetition)
    # OpenAI: frequency per occurrence in the output, presence once per distinct output token.
    # Counts are sums of ones, exact in any order, so they are deterministic on a GPU too.
    counts = torch.zeros_like(flat).index_add_(0, output, torch.ones(len(output), device=device))
    row = output // vocab_size
    flat[output] = flat[output] - penalties[row, 1] * counts[output] - penalties[row, 2]
    return out


def _flat_ids(
    rows: list[int], token_ids: list[list[int]], vocab_size: int
) -> torch.Tensor:  # [total tokens] int64 on the CPU: row * vocab_size + token_id
    ids = torch.tensor(list(chain.from_iterable(token_ids)), dtype=torch.long)
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size})")
    lengths = torch.tensor([len(t) for t in token_ids], dtype=torch.long)
    return torch.tensor(rows, dtype=torch.long).repeat_interleave(lengths) * vocab_size + ids


def _top_k_top_p(
    logits: torch.Tensor,  # [num_rows, vocab_size] float32, after temperature
    top_k: list[int],  # 0 = off
    top_p: list[float],  # 1.0 = off
) -> torch.Tensor:  # a copy with the dropped logits set to -inf
    """Keeps per row the top_k largest logits, then the smallest prefix of those (in descending
    order) whose mass, renormalised over the top_k, reaches top_p; the first is always kept.

    Both keep a prefix of the sorted row, so a row reduces to a threshold: its smallest kept logit.
    Tokens tied with that logit are kept too."""
    device, vocab_size = logits.device, logits.shape[1]
    k = torch.tensor([t if 0 < t < vocab_size else vocab_size for t in top_k], device=device)
    p = torch.tensor([t if t < 1.0 else math.inf for t in top_p], device=device)
    # Every top_k prefix fits among the candidates; a nucleus may not when top_k is off.
    num_candidates = max([t for t in top_k if 0 < t < vocab_size], default=1)
    if any(t < 1.0 for t in top_p):
        num_candidates = max(num_candidates, NUCLEUS_CANDIDATES)
    num_candidates = min(num_candidates, vocab_size)
    candidates = logits.topk(num_candidates, dim=-1).values  # [num_rows, num_candidates] descending
    # Log of the mass top_p is measured against: the top_k set, or the whole row when top_k is off.
    log_mass = _log_mass_of_prefix(candidates, k)
    if any(t < 1.0 and not 0 < u < vocab_size for t, u in zip(top_p, top_k)):
        log_mass = torch.where(k < vocab_size, log_mass, logits.logsumexp(dim=-1))
    threshold, spilled = _prefix_threshold(candidates, k, p, log_mass)
    threshold = threshold.masked_fill((k == vocab_size) & (p == math.inf), -math.inf)  # no filter
    if spilled.any():  # the nucleus reaches past the candidates: sort those rows in full
        rows = spilled.nonzero().squeeze(1)
        full = logits[rows].sort(dim=-1, descending=True).values
        threshold[rows] = _prefix_threshold(full, k[rows], p[rows], log_mass[rows])[0]
    return logits.masked_fill(logits < threshold.unsqueeze(1), -math.inf)


def _log_mass_of_prefix(values: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # values: [num_rows, n] descending; k: [num_rows]. Returns [num_rows]: logsumexp(values[:, :k]).
    beyond_k = torch.arange(values.shape[1], device=values.device) >= k.unsqueeze(1)
    return values.masked_fill(beyond_k, -math.inf).logsumexp(dim=-1)


def _prefix_threshold(
    values: torch.Tensor,  # [num_rows, n] the n largest logits, descending
    k: torch.Tensor,  # [num_rows] top_k (vocab_size when off)
    p: torch.Tensor,  # [num_rows] top_p (inf when off)
    log_mass: torch.Tensor,  # [num_rows] log of the mass probabilities are relative to
) -> tuple[torch.Tensor, torch.Tensor]:  # threshold [num_rows]; spilled [num_rows] bool
    probs = (values - log_mass.unsqueeze(1)).exp()
    cumulative = probs.cumsum(dim=-1)
    # Position j is kept iff it is in the top_k and the mass before it is still short of top_p.
    in_top_k = torch.arange(values.shape[1], device=values.device) < k.unsqueeze(1)
    keep = in_top_k & (cumulative - probs < p.unsqueeze(1))
    num_kept = keep.sum(dim=-1)  # >= 1: position 0 always passes
    threshold = values.gather(1, (num_kept - 1).unsqueeze(1)).squeeze(1)
    # Spilled: the nucleus is not closed within these values (it needs more of the row).
    spilled = keep[:, -1] & (cumulative[:, -1] < p) & (p < math.inf)
    return threshold, spilled


def _logprobs(
    raw: torch.Tensor,  # [num_rows, vocab_size] float32 raw logits
    params: list[SamplingParams],
    token_ids: torch.Tensor,  # [num_rows]
    token_id_list: list[int],
) -> list[TokenLogprobs | None]:
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    out: list[TokenLogprobs | None] = [None] * len(params)
    if not rows:
        return out
    logprobs = raw[rows].log_softmax(dim=-1)  # [len(rows), vocab_size]
    chosen = logprobs.gather(1, token_ids[rows].unsqueeze(1)).squeeze(1).tolist()
    top_values, top_ids = logprobs.topk(max(params[i].logprobs for i in rows), dim=-1)
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    for j, i in enumerate(rows):
        n = params[i].logprobs
        top = tuple(zip(top_ids[j][:n], top_values[j][:n]))
        out[i] = TokenLogprobs(token_id=token_id_list[i], logprob=chosen[j], top=top)
    return out


def _column(values: list[float], device: torch.device) -> torch.Tensor:  # [len(values), 1]
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)
