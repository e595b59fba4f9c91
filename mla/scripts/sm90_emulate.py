"""Emulates launches of mla_decode_sm90 (cuda/mla_decode_sm90.cu) on the CPU at the level of shared-memory
bytes, to check its layout arithmetic without a GPU: TMA boxes land 128B-swizzled (address bits 4-6 ^= bits
7-9), wgmma operands are read through the canonical descriptor layouts (K-major: 8-row groups 1 KB apart;
MN-major V: 64-column blocks LBO apart, 8-key groups 1 KB apart), accumulators map to threads by the m64nN
fragment layout, and the index expressions are the kernel's. Prints the error against mla_decode_reference.
It mirrors the kernel by hand: edit both together.

    python mla/scripts/sm90_emulate.py bf16 | fp8 [fp8qk]   (a third argument: the e4m3-scores variant)
"""
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lightspeed_mla import mla_decode_reference, sm90  # noqa: E402
from lightspeed_mla.decode import decode_workspace_bytes  # noqa: E402
from mla_helpers import make_paged_cache, query_start, rel_err  # noqa: E402

KB = 8192


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
                        wg, lane, rl, rh = frag(tid)
                        for i in range(16):
                            h = (i >> 1) & 1
                            r = rh if h else rl
                            col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)
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
                    red_max = np.full(128, -np.inf, np.float32)
                    for tid in range(256):
                        wg, lane, rl, rh = frag(tid)
                        for h, r in enumerate((rl, rh)):
                            vals = [s[t2, i] for t2 in range(tid - tid % 4, tid - tid % 4 + 4) for i in range(16) if ((i >> 1) & 1) == h]
                            red_max[wg * 64 + r] = max(red_max[wg * 64 + r], max(vals))
                    p_off = 221184 if kind == "bf16" else POFF
                    for tid in range(256):
                        wg, lane, rl, rh = frag(tid)
                        m_use, alpha = [0, 0], [0, 0]
                        for h, r in enumerate((rl, rh)):
                            mxh = max(red_max[r], red_max[64 + r])
                            m_new = max(m_run[tid, h], mxh)
                            m_use[h] = 0.0 if m_new == -np.inf else m_new
                            alpha[h] = np.exp2(m_run[tid, h] - m_use[h])
                            m_run[tid, h] = m_new
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
                            _, lane, rl, rh = frag(tid)
                            for i in range(128):
                                r = rh if (i >> 1) & 1 else rl
                                col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)
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


if __name__ == "__main__":
    kind = sys.argv[1]
    fs = len(sys.argv) > 2
    emulate(kind, 16, [150], 4, 16, 1, fp8_scores=fs)
    emulate(kind, 64, [70, 4], 4, 16, 2, seed=1, fp8_scores=fs)
    emulate(kind, 32, [100], 3, 32, 1, seed=2, fp8_scores=fs)
