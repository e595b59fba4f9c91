"""Emulates launches of mla_decode_sm90 (cuda/mla_decode_sm90_*.cu) on the CPU at the level of shared-memory
bytes, to check its layout arithmetic without a GPU: TMA boxes land 128B-swizzled (address bits 4-6 ^= bits
7-9), wgmma operands are read through the canonical descriptor layouts (K-major: 8-row groups 1 KB apart;
MN-major V: 64-column blocks LBO apart, 8-key groups 1 KB apart), accumulators map to threads by the m64nN
fragment layout, and the index expressions are the kernel's. Prints the error against mla_decode_reference.
It mirrors the kernel by hand: edit both together.

    python mla/scripts/sm90_emulate.py bf16 | fp8 [fp8qk]   (a third argument: the e4m3-scores variant)
    python mla/scripts/sm90_emulate.py fp8mma                (both products on e4m3: mla_decode_sm90_fp8mma)
    python mla/scripts/sm90_emulate.py afrag                 (fp8mma's P V A fragments, load_v_frags, alone)
"""
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lightspeed_mla import mla_decode_reference, sm90  # noqa: E402
from lightspeed_mla.decode import decode_workspace_bytes  # noqa: E402
from lightspeed_mla.reference import quantize_q_latent_e4m3  # noqa: E402
from mla_helpers import make_paged_cache, query_start, rel_err  # noqa: E402

KB = 8192
FP8MMA_MAX_REL = 0.03  # the emulated fp8mma against the quantised-Q reference


def swz(off):
    return off ^ (((off >> 7) & 7) << 4)


def so(row, col):  # swizzled_offset (bf16)
    return (col >> 6) * KB + row * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4) + (col & 7) * 2


def so8(row, col):
    return (col >> 7) * KB + row * 128 + ((((col & 127) >> 4) ^ (row & 7)) << 4) + (col & 15)


def bf16_bytes(x):  # float32 array -> bf16 bytes (round to nearest)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).view(torch.uint8).numpy()


def bf16_vals(b):  # bytes -> float32
    return torch.from_numpy(np.ascontiguousarray(b)).view(torch.bfloat16).float().numpy()


def tma_box(smem, dst, src_rows_bytes):  # src_rows_bytes: [R, 128] uint8
    R = src_rows_bytes.shape[0]
    for r in range(R):
        for b in range(0, 128, 16):
            phys = swz(dst + r * 128 + b)
            smem[phys:phys + 16] = src_rows_bytes[r, b:b + 16]


def read_kmajor(smem, start, rows, kbytes, elem):  # [rows, kbytes/elem] via SBO=1024 canonical layout
    out = np.zeros((rows, kbytes), np.uint8)
    for m in range(rows):
        for b in range(kbytes):
            out[m, b] = smem[swz(start + (m // 8) * 1024 + (m % 8) * 128 + b)]
    return out


def read_mn_major_bf16(smem, start, k_rows, n, lbo):  # B[k, n] bf16
    out = np.zeros((k_rows, n * 2), np.uint8)
    for k in range(k_rows):
        for nn in range(n):
            for byte in range(2):
                out[k, nn * 2 + byte] = smem[swz(start + (nn // 64) * lbo + (k // 8) * 1024 + (k % 8) * 128 + (nn % 64) * 2 + byte)]
    return bf16_vals(out.reshape(-1)).reshape(k_rows, n)


def widen(smem, stage_off, voff, key, col):
    x = smem[stage_off + so8(key, col): stage_off + so8(key, col) + 16].copy()
    out = np.zeros(32, np.uint8)
    for e in range(16):
        byte = int(x[e])
        bits = ((byte & 0x80) << 8) | ((byte & 0x7F) << 4)
        out[2 * e] = bits & 0xFF
        out[2 * e + 1] = bits >> 8
    o1, o2 = voff + so(key, col), voff + so(key, col + 8)
    smem[o1:o1 + 16] = out[:16]
    smem[o2:o2 + 16] = out[16:]


def frag(tid):
    wg, lane = tid // 128, tid % 32
    r_lo = 16 * ((tid % 128) // 32) + lane // 4
    return wg, lane, r_lo, r_lo + 8


def acc_entries(tid, n=16):
    """(register i, row half h, row, column) of each of thread tid's first n fp32 registers of an m64nN wgmma
    accumulator (the layout every S, P and O fragment of the kernels follows)."""
    _, lane, rl, rh = frag(tid)
    for i in range(n):
        h = (i >> 1) & 1
        yield i, h, rh if h else rl, 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)


def tile_row_max(s):
    """[128] each (warpgroup, row)'s max score: a thread's row half h over its quad's four lanes (the kernel's
    shfl reduction); the two warpgroups' halves are combined by the caller, as through shared memory."""
    red_max = np.full(128, -np.inf, np.float32)
    for tid in range(256):
        wg, _, rl, rh = frag(tid)
        for h, r in enumerate((rl, rh)):
            vals = [s[t2, i] for t2 in range(tid - tid % 4, tid - tid % 4 + 4) for i in range(16) if ((i >> 1) & 1) == h]
            red_max[wg * 64 + r] = max(red_max[wg * 64 + r], max(vals))
    return red_max


def online_max(m_run, red_max, tid):
    """Thread tid's two rows: the running max moved to this tile's (m_run updated in place); returns the max the
    exponentials subtract (0 for a row with nothing valid yet) and the factor that rescales the older sums."""
    _, _, rl, rh = frag(tid)
    m_use, alpha = [0, 0], [0, 0]
    for h, r in enumerate((rl, rh)):
        m_new = max(m_run[tid, h], red_max[r], red_max[64 + r])
        m_use[h] = 0.0 if m_new == -np.inf else m_new
        alpha[h] = np.exp2(m_run[tid, h] - m_use[h])
        m_run[tid, h] = m_new
    return m_use, alpha


def e4m3_vals(b):
    return torch.from_numpy(np.ascontiguousarray(b)).view(torch.float8_e4m3fn).float().numpy()


def emulate(kind, page_size, lens, q_len, H, num_splits, seed=0, fp8_scores=False):
    FS = fp8_scores
    QROPE = 32768 if FS else 65536
    STAGE0 = QROPE + KB
    STB = 40960
    VOFF = STAGE0 + 2 * STB
    POFF = VOFF + 65536
    SCOFF = POFF + 8192
    g = torch.Generator().manual_seed(seed)
    cache, table = make_paged_cache(kind, page_size, lens, generator=g)
    B = len(lens)
    qsl = query_start([q_len] * B)
    T = int(qsl[-1])
    q = torch.randn(T, H, 576, generator=g).to(torch.bfloat16)
    ws = torch.empty(decode_workspace_bytes(B, T, H, num_splits), dtype=torch.uint8)
    plan = sm90.plan(ws, qsl, lens, H, page_size=page_size, softmax_scale=192 ** -0.5, cache_kind=kind,
                     num_splits=num_splits)
    S = plan.num_splits
    scale_log2 = plan.softmax_scale * 1.4426950408889634
    qf = q.float().numpy()
    if kind == "bf16":
        tok_bytes = cache.packed.reshape(-1, 576).contiguous().view(torch.uint8).numpy().reshape(-1, 1152)
    else:
        lat_bytes = cache.latent.reshape(-1, 512).view(torch.uint8).numpy()
        rope_bytes = cache.rope.reshape(-1, 64).contiguous().view(torch.uint8).numpy().reshape(-1, 128)
        kscale_all = cache.scale.reshape(-1).numpy()
    part_o = np.zeros((T, H, S, 512), np.float32)
    part_lse = np.zeros((T, H, S), np.float32)
    pt = table.numpy()
    for b in range(B):
        q_start, ql, kv_len = int(qsl[b]), int(qsl[b + 1] - qsl[b]), lens[b]
        for tile_m in range(plan.row_tiles):
            row0, rows_total = tile_m * 64, ql * H
            if row0 >= rows_total:
                continue
            for split in range(S):
                last_q = min((row0 + 63) // H, ql - 1)
                tile_end = kv_len - ql + last_q + 1
                per_split = ((kv_len + S - 1) // S + 63) // 64 * 64
                start = split * per_split
                end = min(start + per_split, tile_end)
                n_tiles = (end - start + 63) // 64 if end > start else 0
                smem = np.zeros(240 * 1024, np.uint8)
                # Q
                if kind == "bf16":
                    for r in range(64):
                        row = row0 + r
                        vals = qf[q_start + row // H, row % H] if row < rows_total else np.zeros(576, np.float32)
                        vb = bf16_bytes(vals)
                        for c8 in range(72):
                            o = so(r, c8 * 8)
                            smem[o:o + 16] = vb[c8 * 16:c8 * 16 + 16]
                    qscale = None
                elif not FS:
                    for r in range(64):
                        row = row0 + r
                        vals = qf[q_start + row // H, row % H] if row < rows_total else np.zeros(576, np.float32)
                        vb = bf16_bytes(vals)
                        for c8 in range(72):
                            o = so(r, c8 * 8)
                            smem[o:o + 16] = vb[c8 * 16:c8 * 16 + 16]
                else:
                    qscale = np.zeros(64, np.float32)
                    for r in range(64):
                        row = row0 + r
                        vals = qf[q_start + row // H, row % H] if row < rows_total else np.zeros(576, np.float32)
                        amax = np.abs(vals[:512]).max()
                        inv = np.float32(448.0) / amax if amax > 0 else 0.0
                        qscale[r] = amax / np.float32(448.0)
                        q8 = torch.from_numpy((vals[:512] * inv).astype(np.float32)).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
                        for c in range(32):
                            o = so8(r, c * 16)
                            smem[o:o + 16] = q8[c * 16:c * 16 + 16]
                        rb = bf16_bytes(vals[512:])
                        for c8 in range(8):
                            o = QROPE + so(r, c8 * 8)
                            smem[o:o + 16] = rb[c8 * 16:c8 * 16 + 16]
                acc = np.zeros((256, 128), np.float32)
                m_run = np.full((256, 2), -np.inf, np.float32)
                l_run = np.zeros((256, 2), np.float32)
                limit = np.zeros((256, 2), np.int64)
                for tid in range(256):
                    wg, lane, rl, rh = frag(tid)
                    for h, r in enumerate((rl, rh)):
                        limit[tid, h] = min(end, kv_len - ql + (row0 + r) // H + 1)
                box_rows = min(page_size, 64)
                last_page = (kv_len - 1) // page_size
                for it in range(n_tiles):
                    key0 = start + it * 64
                    stage_off = (73728 + (it % 2) * 73728) if kind == "bf16" else (STAGE0 + (it % 2) * STB)
                    # producer
                    for j in range(64 // box_rows):
                        key = key0 + j * box_rows
                        page = pt[b, min(key // page_size, last_page)]
                        row = page * page_size + (key & (page_size - 1))
                        if kind == "bf16":
                            for c in range(9):
                                tma_box(smem, stage_off + c * KB + j * box_rows * 128,
                                        tok_bytes[row:row + box_rows, c * 128:(c + 1) * 128])
                        else:
                            for c in range(4):
                                tma_box(smem, stage_off + c * KB + j * box_rows * 128,
                                        lat_bytes[row:row + box_rows, c * 128:(c + 1) * 128])
                            tma_box(smem, stage_off + 32768 + j * box_rows * 128, rope_bytes[row:row + box_rows])
                            so_ = SCOFF + (it % 2) * 256 + j * box_rows * 4
                            smem[so_:so_ + box_rows * 4] = kscale_all[row:row + box_rows].view(np.uint8)
                    # S per warpgroup
                    S_wg = []
                    for wg in range(2):
                        if kind == "bf16":
                            Sg = np.zeros((64, 32), np.float32)
                            for k in range(36):
                                koff = (k >> 2) * KB + (k & 3) * 32
                                A = bf16_vals(read_kmajor(smem, 0 + koff, 64, 32, 2).reshape(-1)).reshape(64, 16)
                                Bm = bf16_vals(read_kmajor(smem, stage_off + wg * 32 * 128 + koff, 32, 32, 2).reshape(-1)).reshape(32, 16)
                                Sg += A @ Bm.T
                            S_wg.append((Sg, None, None))
                        else:
                            if not FS and wg == 0:  # widen keys 32g.. (all 512 columns), both warpgroups
                                for wg2 in range(2):
                                    for u in range(32 * 32):
                                        widen(smem, stage_off, VOFF, 32 * wg2 + u // 32, (u % 32) * 16)
                            Sl = np.zeros((64, 32), np.float32)
                            if FS:
                                for k in range(16):
                                    koff = (k >> 2) * KB + (k & 3) * 32
                                    A = e4m3_vals(read_kmajor(smem, koff, 64, 32, 1))
                                    Bm = e4m3_vals(read_kmajor(smem, stage_off + wg * 4096 + koff, 32, 32, 1))
                                    Sl += A @ Bm.T
                            else:
                                for k in range(32):
                                    koff = (k >> 2) * KB + (k & 3) * 32
                                    A = bf16_vals(read_kmajor(smem, koff, 64, 32, 2).reshape(-1)).reshape(64, 16)
                                    Bm = bf16_vals(read_kmajor(smem, VOFF + wg * 4096 + koff, 32, 32, 2).reshape(-1)).reshape(32, 16)
                                    Sl += A @ Bm.T
                            Sr = np.zeros((64, 32), np.float32)
                            for k in range(4):
                                A = bf16_vals(read_kmajor(smem, QROPE + k * 32, 64, 32, 2).reshape(-1)).reshape(64, 16)
                                Bm = bf16_vals(read_kmajor(smem, stage_off + 32768 + wg * 4096 + k * 32, 32, 32, 2).reshape(-1)).reshape(32, 16)
                                Sr += A @ Bm.T
                            S_wg.append((Sl, Sr, None))
                    if kind == "fp8" and FS:  # widen V: each warpgroup its 256 columns
                        for wg in range(2):
                            for u in range(64 * 16):
                                widen(smem, stage_off, VOFF, u // 16, 256 * wg + (u % 16) * 16)
                    if kind == "fp8":
                        kscale = smem[SCOFF + (it % 2) * 256: SCOFF + (it % 2) * 256 + 256].copy().view(np.float32)
                    # per-thread scores
                    s = np.zeros((256, 16), np.float32)
                    pmul = np.zeros((256, 16), np.float32)
                    for tid in range(256):
                        wg = tid // 128
                        for i, h, r, col in acc_entries(tid):
                            key = 32 * wg + col
                            valid = key0 + key < limit[tid, h]
                            if kind == "bf16":
                                v = S_wg[wg][0][r, col]
                                s[tid, i] = v * scale_log2 if valid else -np.inf
                            else:
                                ks = kscale[key]
                                qm = qscale[r] if FS else np.float32(2.0 ** 120)
                                v = S_wg[wg][0][r, col] * (qm * ks) + S_wg[wg][1][r, col]
                                s[tid, i] = v * scale_log2 if valid else -np.inf
                                pmul[tid, i] = ks * np.float32(2.0 ** 120) if valid else 0.0
                    # row max exchange
                    red_max = tile_row_max(s)
                    p_off = 221184 if kind == "bf16" else POFF
                    for tid in range(256):
                        wg, lane, rl, rh = frag(tid)
                        m_use, alpha = online_max(m_run, red_max, tid)
                        psum = [0.0, 0.0]
                        for i in range(0, 16, 2):
                            h = (i >> 1) & 1
                            p0, p1 = np.exp2(s[tid, i] - m_use[h]), np.exp2(s[tid, i + 1] - m_use[h])
                            psum[h] += p0 + p1
                            if kind == "fp8":
                                p0, p1 = p0 * pmul[tid, i], p1 * pmul[tid, i + 1]
                            key = 32 * wg + 8 * (i >> 2) + 2 * (lane & 3)
                            o = p_off + so(rh if h else rl, key)
                            smem[o:o + 4] = bf16_bytes(np.array([p0, p1], np.float32))
                        for h in range(2):
                            l_run[tid, h] = l_run[tid, h] * alpha[h] + psum[h]
                        for i in range(128):
                            acc[tid, i] *= alpha[(i >> 1) & 1]
                    if kind == "bf16":
                        valid = end - key0
                        if valid < 64:
                            for wg in range(2):
                                for v in range((64 - valid) * 32):
                                    r, blk, c16 = valid + v // 32, 4 * wg + (v // 8) % 4, v % 8
                                    o = stage_off + blk * KB + r * 128 + c16 * 16
                                    smem[o:o + 16] = 0
                    # PV
                    for wg in range(2):
                        o_tile = np.zeros((64, 256), np.float32)
                        vb = (stage_off + 4 * wg * KB) if kind == "bf16" else (VOFF + 4 * wg * KB)
                        for k in range(4):
                            A = bf16_vals(read_kmajor(smem, p_off + k * 32, 64, 32, 2).reshape(-1)).reshape(64, 16)
                            Bv = read_mn_major_bf16(smem, vb + k * 2048, 16, 256, KB)
                            o_tile += A @ Bv
                        for t in range(128):
                            tid = wg * 128 + t
                            for i, _, r, col in acc_entries(tid, 128):
                                acc[tid, i] += o_tile[r, col]
                # epilogue
                red_sum = np.zeros(128, np.float32)
                for tid in range(256):
                    wg, lane, rl, rh = frag(tid)
                    if lane % 4 == 0:
                        for h, r in enumerate((rl, rh)):
                            red_sum[wg * 64 + r] = sum(l_run[t2, h] for t2 in range(tid, tid + 4))
                for tid in range(256):
                    wg, lane, rl, rh = frag(tid)
                    for h, r in enumerate((rl, rh)):
                        row = row0 + r
                        if row >= rows_total:
                            continue
                        lsum = red_sum[r] + red_sum[64 + r]
                        inv = 1 / lsum if lsum > 0 else 0
                        lse2 = m_run[tid, h] + np.log2(lsum) if lsum > 0 else -np.inf
                        tok, head = q_start + row // H, row % H
                        col0 = 256 * wg + 2 * (lane & 3)
                        for j in range(32):
                            i = 4 * j + 2 * h
                            part_o[tok, head, split, col0 + 8 * j] = acc[tid, i] * inv
                            part_o[tok, head, split, col0 + 8 * j + 1] = acc[tid, i + 1] * inv
                        if wg == 0 and lane % 4 == 0:
                            part_lse[tok, head, split] = lse2
    # combine
    m = part_lse.max(-1, keepdims=True)
    m = np.where(np.isinf(m), 0, m)
    w = np.exp2(part_lse - m)
    den = w.sum(-1)
    out = (part_o * w[..., None]).sum(2) / np.where(den == 0, 1, den)[..., None]
    lse = (m[..., 0] + np.log2(den)) * np.log(2)
    ref, ref_lse = mla_decode_reference(q.float(), cache, table, torch.tensor(lens), qsl, 192 ** -0.5)
    err = rel_err(torch.from_numpy(out), ref)
    lse_err = (torch.from_numpy(lse) - ref_lse).abs().max().item()
    print(f"{kind}{' fp8-scores' if FS else ''} page {page_size} lens {lens} q_len {q_len} H {H} splits {S}: rel {err:.3e} lse {lse_err:.3e}")
    return err


# ---- mla_decode_sm90_fp8mma: both products on e4m3 wgmma --------------------------------------------
# Shared memory as fp8mma:: has it; the 64B-swizzled K-major P tile, the key-slot order, P V's A fragments
# built lane by lane through ldmatrix.trans and byte permutes, the O^T accumulator and its write-out are the
# kernel's.

M_QROPE, M_STAGE0, M_STB, M_RING = 32768, 40960, 40960, 3
M_P = M_STAGE0 + M_RING * M_STB
M_SC = M_P + 2 * 4096  # two P tiles: tile i + 1's softmax writes one while P V of tile i reads the other


def swz64(off):  # 64B swizzle: address bits 4-5 ^= bits 7-8
    return off ^ (((off >> 7) & 3) << 4)


def so64(row, byte):  # swizzled_offset_64b
    return row * 64 + ((((byte >> 4) ^ (row >> 1)) & 3) << 4) + (byte & 15)


def read_kmajor64(smem, start, rows, kbytes):  # the 64B-swizzle descriptor: 8-row groups 512 B apart
    out = np.zeros((rows, kbytes), np.uint8)
    for m in range(rows):
        for b in range(kbytes):
            out[m, b] = smem[swz64(start + (m // 8) * 512 + (m % 8) * 64 + b)]
    return out


def e4m3_bytes(x):  # cvt.rn.satfinite.e4m3
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).clamp(-448, 448)
    return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def byte_perm(x, y, sel):  # __byte_perm on 4-byte arrays
    b = list(x) + list(y)
    return np.array([b[(sel >> (4 * i)) & 0xF] for i in range(4)], np.uint8)


def load_v_frags(smem, lat, valid):
    """load_v_frags of the kernel, lane by lane: frags[tid][c][ks][reg] = the 4 bytes of A register reg of
    M-chunk c and k-step ks. ldmatrix.trans: lane 8m + r addresses row r of matrix m (key 32 ks + 8m + r, the
    warp's 16 dims of chunk c); thread t gets rows 2 (t % 4) and 2 (t % 4) + 1, 16-bit element t / 4, of each
    matrix."""
    frags = np.zeros((256, 4, 2, 4, 4), np.uint8)
    for wg in range(2):
        for warp in range(4):
            for c in range(4):
                for ks in range(2):
                    col = 256 * wg + 64 * c + 16 * warp
                    rows = [smem[lat + so8(32 * ks + lane, col):][:16] for lane in range(32)]
                    for t in range(32):
                        q, e = t % 4, t // 4
                        d = [np.concatenate([rows[8 * m + 2 * q + h][2 * e:2 * e + 2] for h in range(2)])
                             for m in range(4)]
                        tid = 128 * wg + 32 * warp + t
                        frags[tid, c, ks] = [byte_perm(d[0], d[1], 0x6240), byte_perm(d[0], d[1], 0x7351),
                                             byte_perm(d[2], d[3], 0x6240), byte_perm(d[2], d[3], 0x7351)]
    if valid < 64:  # the split's last tile: keys 16 k16 + 2q, + 8, + 1, + 9 of registers 2 (k16 % 2) ..
        for tid in range(256):
            for k16 in range(4):
                key = 16 * k16 + 2 * (tid % 4)
                keep = np.array([key < valid, key + 8 < valid, key + 1 < valid, key + 9 < valid])
                for c in range(4):
                    for reg in (2 * (k16 % 2), 2 * (k16 % 2) + 1):
                        frags[tid, c, k16 // 2, reg] *= keep
    return frags


def pow2_floor(x):  # tile_multiplier's rounding: keep a float's exponent, clear its mantissa
    return (np.float32(x).view(np.uint32) & np.uint32(0x7F800000)).view(np.float32)


def key_of_slot(slot):  # the P V key order: slot 16j + 2i + h holds key 16j + i + 8h
    return 16 * (slot // 16) + (slot % 16) // 2 + 8 * (slot % 2)


def check_frags(frags, smem, lat, valid):
    """Every thread's A fragments are V^T of the wgmma register layout (a warp's rows 16w + lane / 4 and + 8,
    K 4 (lane % 4) .. + 3 and + 16), keys in slot order, fragment row r = dim 2r and row r + 8 = dim 2r + 1 of
    the warp's 16 in its chunk, keys past `valid` zero."""
    for tid in range(256):
        wg, warp, lane = tid // 128, (tid % 128) // 32, tid % 32
        for c in range(4):
            for ks in range(2):
                for reg in range(4):
                    frag_row, k0 = lane // 4 + 8 * (reg & 1), 4 * (lane % 4) + 16 * (reg >> 1)
                    dim = 256 * wg + 64 * c + 16 * warp + 2 * (frag_row % 8) + frag_row // 8
                    keys = [32 * ks + key_of_slot(k0 + b) for b in range(4)]
                    want = [smem[lat + so8(k, dim)] if k < valid else 0 for k in keys]
                    assert (frags[tid, c, ks, reg] == want).all(), (tid, c, ks, reg)


def issue_pv_e4m3(acc, frags, smem, pb):
    """acc (O^T, [256 threads, 4 chunks x 32]) += V^T P'^T: per warpgroup and M-chunk two wgmma m64n64k32
    e4m3, A assembled from the threads' fragments by the register layout, B = the P tile read by its K-major
    descriptor; the [64 dims, 64 rows] product back to the threads by the accumulator layout (element i:
    fragment row 16 warp + lane / 4 + 8 ((i >> 1) & 1), query row 8 (i >> 2) + 2 (lane % 4) + (i & 1))."""
    for wg in range(2):
        for c in range(4):
            d = np.zeros((64, 64), np.float32)
            for ks in range(2):
                a = np.zeros((64, 32), np.uint8)
                for t in range(128):
                    warp, lane = t // 32, t % 32
                    for reg in range(4):
                        m, k0 = 16 * warp + lane // 4 + 8 * (reg & 1), 4 * (lane % 4) + 16 * (reg >> 1)
                        a[m, k0:k0 + 4] = frags[128 * wg + t, c, ks, reg]
                d += e4m3_vals(a) @ e4m3_vals(read_kmajor64(smem, pb + 32 * ks, 64, 32)).T
            for t in range(128):
                warp, lane = t // 32, t % 32
                for i in range(32):
                    m, n = 16 * warp + lane // 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane % 4) + (i & 1)
                    acc[128 * wg + t, 32 * c + i] += d[m, n]


def check_p(smem, pb, s, ks, c, red_max, m_run):
    """P as the PV descriptor reads it is e4m3(p * ks * c) of each row's keys in slot order."""
    got = read_kmajor64(smem, pb, 64, 64)
    want = np.zeros((64, 64), np.float32)
    for tid in range(256):
        for i, h, r, col in acc_entries(tid):
            m_use = 0.0 if m_run[tid, h] == -np.inf else m_run[tid, h]
            want[r, 32 * (tid // 128) + col] = np.exp2(s[tid, i] - m_use) * ks[tid, i] * c
    want_slots = np.stack([want[:, key_of_slot(slot)] for slot in range(64)], 1)
    assert (got == e4m3_bytes(want_slots)).all(), "P layout"


def check_register_pv_fragments(seed=0):
    """The register-operand P V's fragments (load_v_frags): `ldmatrix.x4.trans` on a random latent tile plus
    `__byte_perm(x, y, 0x6240 / 0x7351)` give every thread's e4m3 wgmma A fragments of V^T in the key-slot
    order, fragment row r being dim 2r and row r + 8 dim 2r + 1 of the warp's 16-dim column group; on a whole
    tile and on a last tile of 37 keys (the rest zeroed)."""
    smem = np.random.default_rng(seed).integers(0, 256, 64 * 1024, dtype=np.uint8)
    for valid in (64, 37):
        check_frags(load_v_frags(smem, 0, valid), smem, 0, valid)
    print("register-operand P V: the A fragments hold V^T in key-slot order")


def emulate_fp8mma(page_size, lens, q_len, H, num_splits, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache, table = make_paged_cache("fp8", page_size, lens, generator=g)
    B = len(lens)
    qsl = query_start([q_len] * B)
    T = int(qsl[-1])
    q = torch.randn(T, H, 576, generator=g).to(torch.bfloat16)
    ws = torch.empty(decode_workspace_bytes(B, T, H, num_splits), dtype=torch.uint8)
    plan = sm90.plan(ws, qsl, lens, H, page_size=page_size, softmax_scale=192 ** -0.5, cache_kind="fp8",
                     num_splits=num_splits)
    S = plan.num_splits
    scale_log2 = plan.softmax_scale * 1.4426950408889634
    qf = q.float().numpy()
    lat_bytes = cache.latent.reshape(-1, 512).view(torch.uint8).numpy()
    rope_bytes = cache.rope.reshape(-1, 64).contiguous().view(torch.uint8).numpy().reshape(-1, 128)
    kscale_all = cache.scale.reshape(-1).numpy()
    part_o = np.zeros((T, H, S, 512), np.float32)
    part_lse = np.zeros((T, H, S), np.float32)
    pt = table.numpy()
    for b in range(B):
        q_start, ql, kv_len = int(qsl[b]), int(qsl[b + 1] - qsl[b]), lens[b]
        for tile_m in range(plan.row_tiles):
            row0, rows_total = tile_m * 64, ql * H
            if row0 >= rows_total:
                continue
            for split in range(S):
                last_q = min((row0 + 63) // H, ql - 1)
                tile_end = kv_len - ql + last_q + 1
                per_split = ((kv_len + S - 1) // S + 63) // 64 * 64
                start = split * per_split
                end = min(start + per_split, tile_end)
                n_tiles = (end - start + 63) // 64 if end > start else 0
                smem = np.zeros(240 * 1024, np.uint8)
                qscale = np.zeros(64, np.float32)
                for r in range(64):  # quantize_q_latent + the rope tile
                    row = row0 + r
                    vals = qf[q_start + row // H, row % H] if row < rows_total else np.zeros(576, np.float32)
                    amax = np.abs(vals[:512]).max()
                    inv = np.float32(448.0) / amax if amax > 0 else 0.0
                    qscale[r] = amax / np.float32(448.0)
                    q8 = e4m3_bytes(vals[:512] * inv)
                    for c in range(32):
                        o = so8(r, c * 16)
                        smem[o:o + 16] = q8[c * 16:c * 16 + 16]
                    rb = bf16_bytes(vals[512:])
                    for c8 in range(8):
                        o = M_QROPE + so(r, c8 * 8)
                        smem[o:o + 16] = rb[c8 * 16:c8 * 16 + 16]
                acc = np.zeros((256, 128), np.float32)
                m_run = np.full((256, 2), -np.inf, np.float32)
                l_run = np.zeros((256, 2), np.float32)
                c_prev = np.float32(1.0)
                red_rescale, moved = np.ones(64, np.float32), np.zeros(4, bool)
                limit = np.zeros((256, 2), np.int64)
                for tid in range(256):
                    wg, lane, rl, rh = frag(tid)
                    for h, r in enumerate((rl, rh)):
                        limit[tid, h] = min(end, kv_len - ql + (row0 + r) // H + 1)
                box_rows = min(page_size, 64)
                last_page = (kv_len - 1) // page_size
                for it in range(n_tiles):
                    key0 = start + it * 64
                    st = M_STAGE0 + (it % M_RING) * M_STB
                    sc = M_SC + (it % M_RING) * 256
                    pb = M_P + (it % 2) * 4096
                    for j in range(64 // box_rows):  # the loads
                        key = key0 + j * box_rows
                        page = pt[b, min(key // page_size, last_page)]
                        row = page * page_size + (key & (page_size - 1))
                        for c in range(4):
                            tma_box(smem, st + c * KB + j * box_rows * 128, lat_bytes[row:row + box_rows, c * 128:(c + 1) * 128])
                        tma_box(smem, st + 32768 + j * box_rows * 128, rope_bytes[row:row + box_rows])
                        so_ = sc + j * box_rows * 4
                        smem[so_:so_ + box_rows * 4] = kscale_all[row:row + box_rows].view(np.uint8)
                    valid = end - key0
                    frags = load_v_frags(smem, st, valid)
                    check_frags(frags, smem, st, valid)
                    kscale = smem[sc:sc + 256].copy().view(np.float32)
                    mx = max([abs(kscale[k]) for k in range(min(valid, 64))] + [0.0])
                    c = pow2_floor(np.float32(448.0) / np.float32(mx)) if mx > 1e-30 else np.float32(1.0)
                    S_wg = []
                    for wg in range(2):
                        Sl = np.zeros((64, 32), np.float32)
                        for k in range(16):
                            koff = (k >> 2) * KB + (k & 3) * 32
                            Sl += e4m3_vals(read_kmajor(smem, koff, 64, 32, 1)) @ \
                                e4m3_vals(read_kmajor(smem, st + wg * 4096 + koff, 32, 32, 1)).T
                        Sr = np.zeros((64, 32), np.float32)
                        for k in range(4):
                            A = bf16_vals(read_kmajor(smem, M_QROPE + k * 32, 64, 32, 2).reshape(-1)).reshape(64, 16)
                            Bm = bf16_vals(read_kmajor(smem, st + 32768 + wg * 4096 + k * 32, 32, 32, 2).reshape(-1)).reshape(32, 16)
                            Sr += A @ Bm.T
                        S_wg.append((Sl, Sr))
                    s = np.zeros((256, 16), np.float32)
                    ks = np.zeros((256, 16), np.float32)
                    for tid in range(256):
                        wg = tid // 128
                        for i, h, r, col in acc_entries(tid):
                            valid_k = key0 + 32 * wg + col < limit[tid, h]
                            v = S_wg[wg][0][r, col] * (qscale[r] * kscale[32 * wg + col]) + S_wg[wg][1][r, col]
                            s[tid, i] = v * scale_log2 if valid_k else -np.inf
                            ks[tid, i] = kscale[32 * wg + col] if valid_k else 0.0
                    red_max = tile_row_max(s)
                    for tid in range(256):  # tile_probs_e4m3
                        wg, lane, rl, rh = frag(tid)
                        m_use, alpha = online_max(m_run, red_max, tid)
                        pv, psum = np.zeros(16, np.float32), [0.0, 0.0]
                        for i in range(16):
                            h = (i >> 1) & 1
                            pr = np.exp2(s[tid, i] - m_use[h])
                            psum[h] += pr
                            pv[i] = pr * ks[tid, i] * c
                        q4 = lane & 3
                        for h in range(2):
                            for gg in (0, 2):
                                four = [pv[4 * gg + 2 * h], pv[4 * gg + 4 + 2 * h], pv[4 * gg + 2 * h + 1], pv[4 * gg + 5 + 2 * h]]
                                o = pb + so64(rh if h else rl, 32 * wg + 8 * gg + 4 * q4)
                                smem[o:o + 4] = e4m3_bytes(np.array(four, np.float32))
                        for h in range(2):
                            l_run[tid, h] = l_run[tid, h] * alpha[h] + psum[h]
                        ratio = c / c_prev
                        if wg == 0:  # publish_rescale
                            for h, r in enumerate((rl, rh)):
                                red_rescale[r] = alpha[h] * ratio
                    for w4 in range(4):
                        moved[w4] = any(red_rescale[16 * w4:16 * w4 + 16] != 1)
                    c_prev = c
                    check_p(smem, pb, s, ks, c, red_max, m_run)
                    if it > 0 and moved.any():  # rescale_acc: a chunk's element 4j + e (+ 2): row 8j + 2q + e
                        for tid in range(256):
                            for i in range(128):
                                acc[tid, i] *= red_rescale[8 * ((i % 32) >> 2) + 2 * (tid % 4) + (i & 1)]
                    issue_pv_e4m3(acc, frags, smem, pb)
                red_sum = np.zeros(128, np.float32)
                for tid in range(256):
                    wg, lane, rl, rh = frag(tid)
                    if lane % 4 == 0:
                        for h, r in enumerate((rl, rh)):
                            red_sum[wg * 64 + r] = sum(l_run[t2, h] for t2 in range(tid, tid + 4))
                out_mul = np.float32(1.0) / c_prev
                for tid in range(256):  # write_out_t: the LSE from the softmax's rows
                    wg, lane, rl, rh = frag(tid)
                    if wg == 0 and lane % 4 == 0:
                        for h, r in enumerate((rl, rh)):
                            row = row0 + r
                            lsum = red_sum[r] + red_sum[64 + r]
                            if row < rows_total:
                                part_lse[q_start + row // H, row % H, split] = (m_run[tid, h] + np.log2(lsum)
                                                                                if lsum > 0 else -np.inf)
                for tid in range(256):  # ... and O^T's dim pairs of 16 rows a thread
                    wg, warp, lane = tid // 128, (tid % 128) // 32, tid % 32
                    dim0 = 256 * wg + 16 * warp + 2 * (lane // 4)
                    for i in range(0, 32, 4):
                        for e in range(2):
                            r = i // 4 * 8 + 2 * (lane % 4) + e
                            row = row0 + r
                            if row >= rows_total:
                                continue
                            lsum = red_sum[r] + red_sum[64 + r]
                            inv = out_mul / lsum if lsum > 0 else 0
                            dst = part_o[q_start + row // H, row % H, split]
                            for c4 in range(4):
                                pair = acc[tid, [32 * c4 + i + e, 32 * c4 + i + 2 + e]]
                                dst[dim0 + 64 * c4:dim0 + 64 * c4 + 2] = pair * inv
    m = part_lse.max(-1, keepdims=True)
    m = np.where(np.isinf(m), 0, m)
    w = np.exp2(part_lse - m)
    den = w.sum(-1)
    out = (part_o * w[..., None]).sum(2) / np.where(den == 0, 1, den)[..., None]
    lse = (m[..., 0] + np.log2(den)) * np.log(2)
    qr = q.float()  # the reference on Q as the kernel quantises it (its floor), and on the true Q
    q_quant = quantize_q_latent_e4m3(q)
    out_t = torch.from_numpy(out)
    errs = {}
    for name, qq in (("quantised-Q", q_quant), ("true", qr)):
        ref, ref_lse = mla_decode_reference(qq, cache, table, torch.tensor(lens), qsl, 192 ** -0.5)
        errs[name] = rel_err(out_t, ref)
        lse_err = (torch.from_numpy(lse) - ref_lse).abs().max().item()
        print(f"fp8mma page {page_size} lens {lens} q_len {q_len} H {H} splits {S} vs {name} reference: "
              f"rel {errs[name]:.3e} lse {lse_err:.3e}")
    return errs["quantised-Q"]


if __name__ == "__main__":
    kind = sys.argv[1]
    if kind == "afrag":
        check_register_pv_fragments()
        sys.exit(0)
    if kind == "fp8mma":
        worst = max(emulate_fp8mma(16, [150], 4, 16, 1), emulate_fp8mma(64, [70, 4], 4, 16, 2, seed=1),
                    emulate_fp8mma(32, [100], 3, 32, 1, seed=2))
        # P's e4m3 rounding costs 1.4-2.5% against the quantised-Q reference; a layout slip costs 35-100%
        sys.exit(0 if worst < FP8MMA_MAX_REL else f"fp8mma: rel {worst:.3e} over {FP8MMA_MAX_REL}")
    fs = len(sys.argv) > 2
    emulate(kind, 16, [150], 4, 16, 1, fp8_scores=fs)
    emulate(kind, 64, [70, 4], 4, 16, 2, seed=1, fp8_scores=fs)
    emulate(kind, 32, [100], 3, 32, 1, seed=2, fp8_scores=fs)
