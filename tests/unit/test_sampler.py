"""Sampler: greedy, filters, penalties, seeded reproducibility, distribution, logprobs. No model."""

import math

import pytest
import torch

import engine.sampler as sampler_module
from engine.sampler import Sampler, TokenLogprobs, _apply_penalties, _top_k_top_p
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def sample(logits, params, prompts=None, outputs=None, generators=None, sampler=None):
    num_rows = logits.shape[0]
    if isinstance(params, SamplingParams):
        params = [params] * num_rows
    return (sampler or Sampler(torch.Generator().manual_seed(0)))(
        logits,
        params,
        prompts or [[] for _ in range(num_rows)],
        outputs or [[] for _ in range(num_rows)],
        generators or [None] * num_rows,
    )


def random_logits(num_rows, vocab_size, seed=0, scale=3.0):
    return torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(seed)) * scale


def logits_of(probs, num_rows=1):
    return torch.tensor(probs).log().repeat(num_rows, 1)


def drawn(logits, params, **kwargs):
    return set(sample(logits, params, **kwargs).token_ids)


# --- greedy -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_fast_path_equals_argmax(dtype):
    logits = random_logits(16, 500).to(dtype)
    out = sample(logits, GREEDY)
    assert out.token_ids == logits.float().argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 16


def test_all_greedy_takes_the_fast_path(monkeypatch):
    def must_not_run(*args):
        raise AssertionError("the all-greedy batch left the fast path")

    monkeypatch.setattr(sampler_module, "_apply_penalties", must_not_run)
    monkeypatch.setattr(sampler_module, "_logprobs", must_not_run)
    logits = random_logits(64, 500)
    assert sample(logits, GREEDY).token_ids == logits.argmax(dim=-1).tolist()
    with pytest.raises(AssertionError, match="fast path"):
        sample(logits, SamplingParams(temperature=0.0, logprobs=0))


def test_greedy_rows_in_a_mixed_batch_equal_argmax():
    logits = random_logits(6, 500)
    params = [GREEDY, SamplingParams(), SamplingParams(temperature=0.0, logprobs=2)] * 2
    token_ids = sample(logits, params).token_ids
    expected = logits.argmax(dim=-1).tolist()
    assert [token_ids[i] for i in (0, 2, 3, 5)] == [expected[i] for i in (0, 2, 3, 5)]


def test_empty_batch():
    assert sample(torch.zeros(0, 10), []).token_ids == []


@pytest.mark.parametrize("temperature", [0.05, 1.0, 5.0, 100.0])
def test_top_k_1_equals_greedy(temperature):
    logits = random_logits(64, 1000)
    params = SamplingParams(temperature=temperature, top_k=1)
    assert sample(logits, params).token_ids == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [1.0, 100.0])
def test_tiny_top_p_keeps_only_the_max(temperature):
    logits = random_logits(64, 1000)
    params = SamplingParams(temperature=temperature, top_p=1e-6)
    assert sample(logits, params).token_ids == logits.argmax(dim=-1).tolist()


# --- filters ----------------------------------------------------------------------------------

PROBS = [0.5, 0.3, 0.15, 0.05]


@pytest.mark.parametrize(
    "top_k, top_p, kept",
    [
        (0, 1.0, {0, 1, 2, 3}),
        (2, 1.0, {0, 1}),
        (3, 1.0, {0, 1, 2}),
        (0, 0.45, {0}),
        (0, 0.7, {0, 1}),  # 0.5 < 0.7 <= 0.8
        (0, 0.9, {0, 1, 2}),  # 0.8 < 0.9 <= 0.95
        (3, 0.83, {0, 1}),  # renormalised over the top 3: 0.5/0.95 < 0.83 <= 0.8/0.95
    ],
)
def test_top_k_top_p_keep_the_expected_tokens(top_k, top_p, kept):
    params = SamplingParams(top_k=top_k, top_p=top_p)
    assert drawn(logits_of(PROBS, 4000), params) == kept


@pytest.mark.parametrize(
    "min_p, kept", [(0.0, {0, 1, 2, 3}), (0.2, {0, 1, 2}), (0.5, {0, 1}), (0.7, {0})]
)
def test_min_p_drops_tokens_below_min_p_times_the_max(min_p, kept):
    assert drawn(logits_of(PROBS, 4000), SamplingParams(min_p=min_p)) == kept


def reference_top_k_top_p(logits, top_k, top_p):
    """A full sort per row in float64, written for clarity. Returns the kept mask and, per token,
    the mass before it in the sorted row (inf outside the top_k)."""
    kept = torch.zeros_like(logits, dtype=torch.bool)
    mass_before = torch.full_like(logits, math.inf, dtype=torch.float64)
    for row, (k, p) in enumerate(zip(top_k, top_p)):
        values, ids = logits[row].double().sort(descending=True)
        if k > 0:
            values, ids = values[:k], ids[:k]
        probs = values.softmax(dim=-1)
        mass_before[row, ids] = probs.cumsum(dim=-1) - probs
        kept[row, ids] = mass_before[row, ids] < p if p < 1.0 else True
    return kept, mass_before


TOP_P = [1.0, 1.0, 0.9, 0.5, 0.3, 0.99, 0.95, 0.999, 0.2, 0.8]
SMALL_TOP_K = [0, 5, 0, 100, 0, 30, 70, 0, 1, 3000]  # 512 candidates, the fallback sort for more
LARGE_TOP_K = [0, 5, 0, 100, 0, 2999, 700, 0, 1, 3000]  # 2999 candidates


@pytest.mark.parametrize("top_k", [SMALL_TOP_K, LARGE_TOP_K])
@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0])  # 0.05: nearly flat, nuclei spill past 512
def test_top_k_top_p_match_a_full_sort(scale, top_k):
    logits = random_logits(10, 3000, seed=1, scale=scale)
    top_p = TOP_P
    out = _top_k_top_p(logits, top_k, top_p)
    kept = out > -math.inf
    assert torch.equal(out[kept], logits[kept])
    expected, mass_before = reference_top_k_top_p(logits, top_k, top_p)
    # float32 and float64 may disagree only about a token whose mass before it is a hair from top_p.
    rows, ids = (kept != expected).nonzero(as_tuple=True)
    pairs = zip(rows.tolist(), ids.tolist())
    margins = [abs(mass_before[r, i].item() - top_p[r]) for r, i in pairs]
    assert all(margin < 1e-5 for margin in margins), margins
    assert len(margins) <= 2
    if scale == 0.05:  # the fallback was needed: some nucleus holds more than 512 tokens
        assert expected[2].sum() > 512


# --- penalties --------------------------------------------------------------------------------

RAW = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0, 0.0]])
PROMPT = [[0, 1, 1]]
OUTPUT = [[2, 2, 3, 5]]


@pytest.mark.parametrize(
    "params, expected",
    [
        (SamplingParams(repetition_penalty=2.0), [1.0, -2.0, 0.25, -6.0, 1.0, 0.0]),
        (SamplingParams(repetition_penalty=0.5), [4.0, -0.5, 1.0, -1.5, 1.0, 0.0]),
        (SamplingParams(frequency_penalty=0.5), [2.0, -1.0, -0.5, -3.5, 1.0, -0.5]),
        (SamplingParams(presence_penalty=0.5), [2.0, -1.0, 0.0, -3.5, 1.0, -0.5]),
        (SamplingParams(frequency_penalty=-1.0), [2.0, -1.0, 2.5, -2.0, 1.0, 1.0]),
        (
            SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=1.0),
            [1.0, -2.0, 0.25 - 1.0 - 1.0, -6.0 - 0.5 - 1.0, 1.0, 0.0 - 0.5 - 1.0],
        ),
    ],
)
def test_each_penalty_changes_exactly_the_expected_logits(params, expected):
    logits = torch.cat([RAW, RAW])  # row 1 has no penalties and must not change
    before = logits.clone()
    out = _apply_penalties(logits, [params, SamplingParams()], PROMPT * 2, OUTPUT * 2)
    assert out.tolist() == [expected, RAW[0].tolist()]
    assert torch.equal(logits, before)


def test_penalties_apply_to_each_row_its_own_params_and_tokens():
    logits = torch.cat([RAW, RAW, RAW])
    params = [
        SamplingParams(),
        SamplingParams(repetition_penalty=2.0),
        SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
    ]
    prompts, outputs = [[0, 1], [4], [0]], [[2], [1, 1], [4, 4, 4]]
    out = _apply_penalties(logits, params, prompts, outputs)
    assert out.tolist() == [
        RAW[0].tolist(),
        [2.0, -2.0, 0.5, -3.0, 0.5, 0.0],
        [2.0, -1.0, 0.5, -3.0, 1.0 - 0.75 - 0.5, 0.0],
    ]


def test_no_penalties_returns_the_logits_untouched():
    assert _apply_penalties(RAW, [SamplingParams()], PROMPT, OUTPUT) is RAW


def test_penalties_steer_greedy_and_leave_the_callers_logits_alone():
    logits = torch.tensor([[2.0, 1.9, 0.0]] * 3)
    before = logits.clone()
    params = [
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        SamplingParams(temperature=0.0, repetition_penalty=1.1),
        GREEDY,
    ]
    out = sample(logits, params, prompts=[[], [0], []], outputs=[[0], [], [0]])
    assert out.token_ids == [1, 1, 0]
    assert torch.equal(logits, before)


def test_out_of_vocabulary_token_ids_are_rejected():
    with pytest.raises(ValueError, match="token ids"):
        _apply_penalties(RAW, [SamplingParams(presence_penalty=1.0)], [[]], [[6]])


# --- seeds ------------------------------------------------------------------------------------


def run_steps(rows, num_steps=8, vocab_size=1000):
    """rows: list of (params, seed or None). Returns each row's tokens over the steps."""
    sampler = Sampler(torch.Generator().manual_seed(99))
    generators = [None if s is None else torch.Generator().manual_seed(s) for _, s in rows]
    tokens = [[] for _ in rows]
    for step in range(num_steps):
        logits = random_logits(1, vocab_size, seed=step, scale=0.5).repeat(len(rows), 1)
        params = [p for p, _ in rows]
        out = sample(logits, params, outputs=tokens, generators=generators, sampler=sampler)
        for row, token_id in zip(tokens, out.token_ids):
            row.append(token_id)
    return tokens


SEEDED = SamplingParams(seed=1234, top_p=0.95, frequency_penalty=0.3)


def test_a_seeded_row_repeats_its_tokens_whatever_the_batch():
    alone = run_steps([(SEEDED, 1234)])[0]
    others = [
        (SamplingParams(), None),
        (SamplingParams(seed=7, top_k=50), 7),
        (GREEDY, None),
        (SamplingParams(temperature=0.7, min_p=0.1), None),
    ]
    first = run_steps([(SEEDED, 1234)] + others)[0]
    last = run_steps(others[::-1] + [(SamplingParams(), None), (SEEDED, 1234)])[-1]
    assert alone == first == last
    assert len(set(alone)) > 1  # the tokens really are drawn


def test_different_seeds_give_different_tokens():
    tokens = run_steps([(SamplingParams(seed=1), 1), (SamplingParams(seed=2), 2)], num_steps=20)
    assert tokens[0] != tokens[1]  # equal with probability ~ (1/1000)^20


def test_unseeded_rows_differ_between_rows_and_calls():
    logits = random_logits(1, 1000, scale=0.5).repeat(50, 1)
    sampler = Sampler(torch.Generator().manual_seed(0))
    first = sample(logits, SamplingParams(), sampler=sampler).token_ids
    second = sample(logits, SamplingParams(), sampler=sampler).token_ids
    assert first != second
    assert len(set(first)) > 25  # 50 draws over ~1000 near-equal tokens


def test_a_seed_without_its_generator_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        sample(RAW, [SamplingParams(seed=3)])


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError):
        Sampler()(RAW, [SamplingParams()], [], [[]], [None])


# --- distribution -----------------------------------------------------------------------------

THREE = [0.2, 0.3, 0.5]


def frequencies(token_ids, vocab_size=3):
    counts = torch.bincount(torch.tensor(token_ids), minlength=vocab_size)
    return (counts / counts.sum()).tolist()


def powered(probs, temperature):
    weights = [p ** (1 / temperature) for p in probs]
    return [w / sum(weights) for w in weights]


@pytest.mark.parametrize(
    "params, expected",
    [
        (SamplingParams(), THREE),
        (SamplingParams(temperature=2.0), powered(THREE, 2.0)),
        (SamplingParams(temperature=0.5), powered(THREE, 0.5)),
        (SamplingParams(top_k=2), [0.0, 0.375, 0.625]),
    ],
)
def test_sampling_matches_the_distribution(params, expected):
    # 20000 draws: the standard error of a frequency is <= 0.0036, so 0.015 is over 4 sigma.
    out = sample(logits_of(THREE, 20000), params)
    assert frequencies(out.token_ids) == pytest.approx(expected, abs=0.015)


def test_seeded_rows_follow_the_distribution_too():
    num_rows = 5000
    generators = [torch.Generator().manual_seed(seed) for seed in range(num_rows)]
    params = [SamplingParams(seed=seed) for seed in range(num_rows)]
    out = sample(logits_of(THREE, num_rows), params, generators=generators)
    assert frequencies(out.token_ids) == pytest.approx(THREE, abs=0.025)  # > 3.5 sigma


# --- logprobs ---------------------------------------------------------------------------------


def test_logprobs_are_the_raw_log_softmax_with_top_n_descending():
    logits = random_logits(4, 200)
    params = [
        SamplingParams(logprobs=5, temperature=0.3, repetition_penalty=1.5),
        SamplingParams(logprobs=0),
        SamplingParams(),
        SamplingParams(temperature=0.0, logprobs=20, presence_penalty=2.0),
    ]
    out = sample(logits, params, prompts=[[1, 2]] * 4, outputs=[[3]] * 4)
    expected = logits.log_softmax(dim=-1)  # before penalties and temperature
    assert out.logprobs[2] is None
    for row in (0, 1, 3):
        record = out.logprobs[row]
        assert isinstance(record, TokenLogprobs)
        assert record.token_id == out.token_ids[row]
        assert record.logprob == pytest.approx(expected[row, record.token_id].item(), abs=1e-6)
        n = params[row].logprobs
        top_ids = expected[row].argsort(descending=True)[:n].tolist()
        assert [token_id for token_id, _ in record.top] == top_ids
        top_logprobs = [lp for _, lp in record.top]
        assert top_logprobs == pytest.approx(expected[row, top_ids].tolist(), abs=1e-6)
    assert out.logprobs[1].top == ()
    assert len(out.logprobs[3].top) == 20


def test_logprobs_of_low_precision_logits_are_computed_in_float32():
    logits = random_logits(2, 300).to(torch.bfloat16)
    out = sample(logits, SamplingParams(temperature=0.0, logprobs=1))
    expected = logits.float().log_softmax(dim=-1)
    for row in range(2):
        assert out.logprobs[row].logprob == pytest.approx(expected[row].max().item(), abs=1e-6)
