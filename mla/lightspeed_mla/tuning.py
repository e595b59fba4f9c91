"""Per-architecture tile tables: Blackwell is a row here, not a rewrite.

Rows are picked by (compute-capability major, cache kind, M rows available). Values for sm_90
are what the H200 runs chose (bench/results/mla_*); sm_100 rows are unverified guesses (no
Blackwell here) with the larger shared memory in mind.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeTile:
    """Tile shape of the absorbed kernel: BLOCK_M query rows × BLOCK_N keys per step.
    swap_ab puts keys / latent columns on the MMA's M axis and query rows on N (see the kernel)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False
    ctas_per_sm: int = 1  # resident CTAs per SM (registers / shared memory): sizes one full wave


@dataclass(frozen=True)
class PrefillTile:
    """Tile shape of the non-absorbed prefill kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# The MMA M tile the folding rule aims to fill (wgmma on Hopper is 64 rows per warpgroup).
MMA_M = {9: 64, 10: 64}

# (arch major, cache kind) -> (tile for >= 64 rows, tile for < 64 rows; its block_m is set per
# batch to 16 or 32). sm_90 rows: candidates kept spill-free (or nearly) by ptxas -v on Triton's
# sm_90a output, then the fastest of the H200 tile sweep (bench/results/mla_*, "tile_sweep"):
# bf16 swaps A/B (Q stays in shared memory as the B operand); fp8 swaps only for 16-32 rows.
_DECODE = {
    (9, "bf16"): (DecodeTile(64, 64, 8, 2, True, 1), DecodeTile(16, 32, 4, 3, True, 2)),
    (9, "fp8"): (DecodeTile(64, 32, 8, 2, False, 1), DecodeTile(16, 32, 4, 2, True, 2)),
    (10, "bf16"): (DecodeTile(64, 64, 8, 2, True, 1), DecodeTile(16, 64, 4, 3, True, 2)),  # unverified
    (10, "fp8"): (DecodeTile(64, 64, 8, 2, False, 1), DecodeTile(16, 64, 4, 2, True, 2)),  # unverified
}
# CPU interpreter: small tiles keep TRITON_INTERPRET tests fast.
_INTERPRET_DECODE = DecodeTile(16, 16, 4, 1)

_PREFILL = {
    9: PrefillTile(128, 64, 8, 3),
    10: PrefillTile(128, 64, 8, 3),  # unverified
}
_INTERPRET_PREFILL = PrefillTile(16, 16, 4, 1)


def decode_tile(arch_major: int | None, cache_kind: str, rows_per_tile_wanted: int) -> DecodeTile:
    """Tile for the absorbed kernel. arch_major None means the CPU interpreter."""
    if arch_major is None:
        return _INTERPRET_DECODE
    big, small = _DECODE.get((min(arch_major, 10), cache_kind), _DECODE[(9, cache_kind)])
    if rows_per_tile_wanted >= big.block_m:
        return big
    # A smaller M tile: 16/32 rows (mma.sync), smallest power of two >= the rows there are.
    block_m = 16 if rows_per_tile_wanted <= 16 else 32
    return DecodeTile(block_m, small.block_n, small.num_warps, small.num_stages, small.swap_ab, small.ctas_per_sm)


def prefill_tile(arch_major: int | None) -> PrefillTile:
    if arch_major is None:
        return _INTERPRET_PREFILL
    return _PREFILL.get(min(arch_major, 10), _PREFILL[9])
