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
