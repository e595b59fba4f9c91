"""spec/ngram_lookup: the Triton kernel equals the torch reference (and both a plain Python search)."""

import numpy as np
import pytest
import torch
from lightspeed_kernel.reference import spec as ref
from lightspeed_kernel.triton import spec


def python_lookup(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Longest tail (n_min..n_max tokens) ending earlier; ties: most known tokens after it (at most k),
    then latest; the known tokens after it."""
    length, best_len, best_end = len(tokens), 0, -1
    for end in range(length - 1):
        m = 0
        while m < n_max and end - m >= 0 and tokens[end - m] == tokens[length - 1 - m]:
            m += 1
        follow = min(length - 1 - end, k)
        if m >= n_min and (m, follow, end) > (best_len, min(length - 1 - best_end, k), best_end):
            best_len, best_end = m, end
    return [] if best_end < 0 else tokens[best_end + 1: best_end + 1 + k]


def _table(token_rows, device, width_pad=9, stale=99):
    width = max(len(r) for r in token_rows) + width_pad
    history = torch.full((len(token_rows) + 2, width), stale, dtype=torch.int32)  # two rows never drafted
    for i, r in enumerate(token_rows):
        history[i + 1, : len(r)] = torch.tensor(r, dtype=torch.int32)
    lengths = torch.zeros(len(token_rows) + 2, dtype=torch.int64)
    lengths[1: len(token_rows) + 1] = torch.tensor([len(r) for r in token_rows])
    rows = torch.arange(1, len(token_rows) + 1)
    return history.to(device), rows.to(device), lengths.to(device), max(len(r) for r in token_rows)


AWKWARD = [
    [7], [2, 2], [4, 4, 4, 4, 4], [5, 6, 7, 8, 9], [1, 2, 3, 4, 1, 2, 3],
    [1, 2, 9, 1, 2, 8, 3, 1, 2], [1, 2, 3, 4, 0, 5, 2, 3, 6, 1, 2, 3],
]


@pytest.mark.parametrize("n_min, n_max", [(1, 1), (1, 4), (2, 3), (3, 8)])
@pytest.mark.parametrize("k", [1, 4, 15])
def test_kernel_equals_reference_and_python_on_awkward_rows(device, k, n_min, n_max):
    history, rows, lengths, max_len = _table(AWKWARD, device)
    want_d, want_v = ref.ngram_lookup(history, rows, lengths, k=k, n_min=n_min, n_max=n_max, max_len=max_len)
    got_d, got_v = spec.ngram_lookup(history, rows, lengths, k=k, n_min=n_min, n_max=n_max, max_len=max_len)
    assert torch.equal(got_d.cpu(), want_d.cpu()) and torch.equal(got_v.cpu(), want_v.cpu())
    for i, row in enumerate(AWKWARD):
        expected = python_lookup(row, k, n_min, n_max)
        assert want_v[i].item() == len(expected) and want_d[i, : len(expected)].tolist() == expected


def test_long_rows_span_several_blocks(device):
    # 3000 tokens over a 6-token vocabulary: matches end in every 1024-position block of the scan.
    rng = np.random.default_rng(3)
    token_rows = [rng.integers(0, 6, size=n).tolist() for n in (3000, 1500, 1025, 40)]
    history, rows, lengths, max_len = _table(token_rows, device)
    want = ref.ngram_lookup(history, rows, lengths, k=5, n_min=2, n_max=6, max_len=max_len)
    got = spec.ngram_lookup(history, rows, lengths, k=5, n_min=2, n_max=6, max_len=max_len)
    assert torch.equal(got[0].cpu(), want[0].cpu()) and torch.equal(got[1].cpu(), want[1].cpu())
    for i, row in enumerate(token_rows):
        assert want[0][i, : want[1][i]].tolist() == python_lookup(row, 5, 2, 6)


def test_a_repeating_run_drafts_k_tokens(device):
    # The latest repeat of "4" ends just before the tail, with one token after it; an earlier one
    # has k after it: the run drafts k tokens.
    history, rows, lengths, max_len = _table([[9, 4, 4, 4, 4, 4, 4, 4, 4]], device)
    for fn in (ref.ngram_lookup, spec.ngram_lookup):
        drafts, valid = fn(history, rows, lengths, k=3, n_min=2, n_max=3, max_len=max_len)
        assert drafts[0].tolist() == [4, 4, 4] and valid[0].item() == 3


def test_no_rows(device):
    history, _, lengths, max_len = _table([[1, 2, 1]], device)
    drafts, valid = spec.ngram_lookup(history, torch.zeros(0, dtype=torch.int64, device=device), lengths, k=3,
                                      n_min=1, n_max=2, max_len=max_len)
    assert drafts.shape == (0, 3) and valid.shape == (0,)


# -- spec/verify, spec/shift_rows, spec/fill_drafts ------------------------------------------------

def python_verify(row_tokens, tokens, inputs, num_samples, chain=None):
    """Accepted per decode row, keep and rejected per sample, written out with loops."""
    accepted, keep, rejected, start = [], [True] * num_samples, [0] * num_samples, 0
    for b, n in enumerate(row_tokens):
        lead = 0
        while lead < n - 1 and start + lead + 1 < len(inputs) and tokens[start + lead] == inputs[start + lead + 1]:
            lead += 1
        if chain is not None and not chain[b]:
            lead = 0
        accepted.append(lead + 1)
        for j in range(n):
            keep[start + j], rejected[start + j] = j <= lead, n - lead - 1
        start += n
    return accepted, keep, rejected


def _verify_case(rng, row_tokens, prefill_samples, vocab, truncate_inputs):
    qsl = np.concatenate([[0], np.cumsum(row_tokens)]).astype(np.int32)
    ndt = int(qsl[-1])
    num_inputs = ndt + (0 if truncate_inputs else 1 + prefill_samples * 3)
    inputs = rng.integers(0, vocab, size=num_inputs)
    tokens = rng.integers(0, vocab, size=ndt + prefill_samples)
    # Make drafts agree for a random prefix of each row, so every acceptance length occurs.
    for b, n in enumerate(row_tokens):
        agree = int(rng.integers(0, n))
        for j in range(min(agree, n - 1)):
            if qsl[b] + j + 1 < num_inputs:
                tokens[qsl[b] + j] = inputs[qsl[b] + j + 1]
    return qsl, tokens, inputs


@pytest.mark.parametrize("row_tokens, prefill_samples, truncate_inputs", [
    ([], 0, False), ([], 3, False), ([1], 0, True), ([1, 1, 1], 2, False), ([5], 0, True), ([5, 1, 3, 5], 1, False),
    ([2, 17, 1, 9], 4, True), ([16] * 7, 0, False),
])
@pytest.mark.parametrize("with_chain", [False, True])
def test_verify_kernel_equals_reference_and_python(device, row_tokens, prefill_samples, truncate_inputs,
                                                   with_chain):
    rng = np.random.default_rng(len(row_tokens) * 7 + prefill_samples)
    qsl, tokens, inputs = _verify_case(rng, row_tokens, prefill_samples, vocab=3, truncate_inputs=truncate_inputs)
    nd, num = len(row_tokens), tokens.shape[0]
    chain = rng.integers(0, 2, size=nd).astype(bool) if with_chain else None
    slots = np.concatenate([np.repeat(rng.permutation(nd + 2)[:nd], row_tokens), np.zeros(prefill_samples)])
    matched = rng.integers(0, 5, size=nd + 2)
    args = dict(num_decodes=nd, max_query_len=max(row_tokens, default=1))
    dev = dict(tokens=torch.tensor(tokens, device=device), input_ids=torch.tensor(inputs, device=device),
               query_start_loc=torch.tensor(qsl, device=device))
    extras = dict(chain_ok=None if chain is None else torch.tensor(chain, device=device),
                  matched=torch.tensor(matched, dtype=torch.int32, device=device),
                  sample_slots=torch.tensor(slots, dtype=torch.int64, device=device))
    want_acc, want_keep, want_rej = python_verify(row_tokens, tokens.tolist(), inputs.tolist(), num, chain)
    for fn in (ref.spec_verify, spec.spec_verify):
        verdict, keep, rejected = (t.cpu() for t in fn(**dev, **args, **extras))
        assert verdict.shape == (3, nd)
        assert verdict[0].tolist() == want_acc and keep.tolist() == want_keep and rejected.tolist() == want_rej
        assert verdict[1].tolist() == ([1] * nd if chain is None else chain.astype(int).tolist())
        assert verdict[2].tolist() == [int(matched[int(slots[s])]) for s in qsl[:nd]]
        verdict, _, _ = fn(**dev, **args)  # without matched: two verdict rows
        assert verdict.shape == (2, nd)


def python_shift(qsl, positions, inputs, seq_lens, page_table, mask, src, prev_rejected, prev_sampled, page_size):
    positions, inputs, seq_lens = list(positions), list(inputs), list(seq_lens)
    slots, shifts = [0] * len(positions), []
    for b in range(len(qsl) - 1):
        s = prev_rejected[src[qsl[b]]] if qsl[b + 1] > qsl[b] and mask[qsl[b]] else 0
        shifts.append(s)
        seq_lens[b] -= s
        if s or (qsl[b + 1] > qsl[b] and mask[qsl[b]]):
            inputs[qsl[b]] = prev_sampled[src[qsl[b]] - s]
        for i in range(qsl[b], qsl[b + 1]):
            positions[i] -= s
            slots[i] = page_table[b][positions[i] // page_size] * page_size + positions[i] % page_size
    return positions, slots, seq_lens, shifts, inputs


@pytest.mark.parametrize("row_tokens, page_size", [([], 4), ([1], 1), ([1, 5, 0, 3], 4), ([3, 1, 1200, 2], 16),
                                                   ([5] * 6, 2)])
def test_shift_rows_kernel_equals_reference_and_python(device, row_tokens, page_size):
    rng = np.random.default_rng(sum(row_tokens) + page_size)
    qsl = np.concatenate([[0], np.cumsum(row_tokens)]).astype(np.int32)
    num_tokens, rows = int(qsl[-1]), len(row_tokens)
    prev = 9
    prev_rejected = rng.integers(0, 4, size=prev)
    prev_sampled = rng.integers(100, 200, size=prev)
    # Every row starts past the largest shift (3), at a random place in its pages.
    start = rng.integers(3, 40, size=rows)
    positions = np.concatenate([np.zeros(0)] + [np.arange(n) + s for n, s in zip(row_tokens, start, strict=True)]).astype(np.int64)
    seq_lens = (start + np.asarray(row_tokens, dtype=np.int64)).astype(np.int32)
    pages = int(max(seq_lens, default=1) // page_size + 1)
    page_table = rng.permutation(rows * pages + 1)[: rows * pages].reshape(rows, pages).astype(np.int32)
    mask = rng.integers(0, 2, size=num_tokens).astype(bool)
    src = np.where(mask, rng.integers(3, prev, size=num_tokens), 0).astype(np.int64)  # src - shift >= 0
    inputs = rng.integers(0, 50, size=num_tokens)
    want = python_shift(qsl, positions.tolist(), inputs.tolist(), seq_lens.tolist(), page_table.tolist(), mask,
                        src, prev_rejected.tolist(), prev_sampled.tolist(), page_size)
    for fn in (ref.spec_shift_rows, spec.spec_shift_rows):
        ids = torch.tensor(inputs, device=device)
        got = fn(torch.tensor(positions, device=device), ids, torch.tensor(seq_lens, device=device),
                 torch.tensor(page_table, device=device), torch.tensor(qsl, device=device),
                 torch.tensor(mask, device=device), torch.tensor(src, device=device),
                 torch.tensor(prev_rejected, device=device), torch.tensor(prev_sampled, device=device),
                 page_size=page_size, max_query_len=max(row_tokens, default=1))
        out_pos, slots, out_lens, shift = (t.cpu().tolist() for t in got)
        assert (out_pos, slots, out_lens, shift, ids.cpu().tolist()) == want


@pytest.mark.parametrize("row_tokens, k", [([], 3), ([1], 1), ([1, 4, 2], 3), ([5, 5, 1, 5], 4), ([2, 1], 15)])
def test_fill_drafts_kernel_equals_reference_and_python(device, row_tokens, k):
    rng = np.random.default_rng(len(row_tokens) * 31 + k)
    qsl = np.concatenate([[0], np.cumsum(row_tokens)]).astype(np.int32)
    nd, ndt = len(row_tokens), int(qsl[-1])
    prefill = 3
    inputs = rng.integers(0, 50, size=ndt + prefill)
    drafts = rng.integers(100, 200, size=(nd + 3, k))
    row_slots = rng.permutation(nd + 3)[:nd]
    slots = np.concatenate([np.repeat(row_slots, row_tokens), [nd + 2]]).astype(np.int64)
    want = inputs.tolist()
    for b, n in enumerate(row_tokens):
        for m in range(n - 1):
            want[qsl[b] + 1 + m] = int(drafts[row_slots[b], m])
    for fn in (ref.spec_fill_drafts, spec.spec_fill_drafts):
        ids = torch.tensor(inputs, device=device)
        fn(ids, torch.tensor(qsl, device=device), torch.tensor(drafts, device=device),
           torch.tensor(slots, device=device), num_decodes=nd, max_query_len=max(row_tokens, default=1))
        assert ids.cpu().tolist() == want


@pytest.mark.parametrize("row_tokens, prefill_samples, width", [([], 0, 20), ([], 2, 20), ([1], 0, 20),
                                                                 ([5, 1, 3], 2, 20), ([4, 4], 1, 9)])
@pytest.mark.parametrize("with_keep", [False, True])
def test_ngram_record_kernel_equals_reference_and_python(device, row_tokens, prefill_samples, width, with_keep):
    rng = np.random.default_rng(sum(row_tokens) * 5 + prefill_samples + width)
    qsl = np.concatenate([[0], np.cumsum(row_tokens)]).astype(np.int32)
    nd, ndt = len(row_tokens), int(qsl[-1])
    num_slots = nd + prefill_samples + 2
    row_slots = rng.permutation(num_slots)[: nd + prefill_samples]
    slots = np.concatenate([np.repeat(row_slots[:nd], row_tokens), row_slots[nd:]]).astype(np.int64)
    # Decode rows continue at a position; each prefill samples after its last prompt token (some past width).
    starts = rng.integers(0, width, size=nd + prefill_samples)
    positions = np.concatenate([np.zeros(0)] + [np.arange(n) + s for n, s in zip(row_tokens, starts, strict=False)]
                               + [np.arange(3) + s for s in starts[nd:]]).astype(np.int64)
    logits = np.concatenate([np.arange(ndt), ndt + 3 * np.arange(prefill_samples) + 2]).astype(np.int64)
    tokens = rng.integers(1, 90, size=ndt + prefill_samples)
    keep = np.ones(tokens.shape[0], dtype=bool)
    if with_keep:  # a decode row keeps a prefix of its samples, at least one
        for b, n in enumerate(row_tokens):
            keep[qsl[b] + int(rng.integers(1, n + 1)):qsl[b + 1]] = False
    history = rng.integers(100, 200, size=(num_slots, width)).astype(np.int32)
    lengths = rng.integers(0, width, size=num_slots)
    want_h, want_l = history.copy(), lengths.copy()
    for i in range(tokens.shape[0]):
        at = positions[logits[i]] + 1
        want_h[slots[i], min(at, width - 1)] = tokens[i]
    for slot in row_slots:
        own = np.nonzero(slots == slot)[0]
        want_l[slot] = max(positions[logits[i]] + 2 for i in own if keep[i])
    for fn in (ref.ngram_record, spec.ngram_record):
        h, ln = torch.tensor(history, device=device), torch.tensor(lengths, device=device)
        out_slots = torch.full((row_slots.shape[0],), -1, dtype=torch.int64, device=device)
        fn(h, ln, torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
           torch.tensor(logits, device=device), torch.tensor(slots, device=device), torch.tensor(qsl, device=device),
           num_decodes=nd, num_decode_tokens=ndt, max_query_len=max(row_tokens, default=1),
           keep=torch.tensor(keep, device=device) if with_keep else None, out_slots=out_slots)
        assert np.array_equal(h.cpu().numpy(), want_h) and np.array_equal(ln.cpu().numpy(), want_l)
        assert out_slots.cpu().tolist() == row_slots.tolist()


def test_ngram_lookup_writes_each_row_entry_of_the_out_tensors(device):
    history, rows, lengths, max_len = _table(AWKWARD, device)
    drafts, valid = ref.ngram_lookup(history, rows, lengths, k=4, n_min=1, n_max=3, max_len=max_len)
    for fn in (ref.ngram_lookup, spec.ngram_lookup):
        out_d = torch.full((history.shape[0], 4), -5, dtype=torch.int64, device=device)
        out_v = torch.full((history.shape[0],), -5, dtype=torch.int32, device=device)
        got = fn(history, rows, lengths, k=4, n_min=1, n_max=3, max_len=max_len, out_drafts=out_d, out_valid=out_v)
        assert torch.equal(got[0], drafts) and torch.equal(got[1], valid)
        assert torch.equal(out_d[rows], drafts) and torch.equal(out_v[rows], valid)
        untouched = torch.ones(history.shape[0], dtype=torch.bool, device=device)
        untouched[rows] = False
        assert (out_d[untouched] == -5).all() and (out_v[untouched] == -5).all()
