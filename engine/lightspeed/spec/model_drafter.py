"""Model drafters on the device: DeepSeek-V3's MTP module and EAGLE-3 heads for Llama-3.

Design note. Both are next-token predictors over the target's hidden states: at position i a
draft module reads the token at i+1 and a feature of position i (MTP: the target's final hidden
state; EAGLE-3: three of its intermediate ones) and predicts the token at i+2, caching its own
layer's KV (one layer past the target's in the same pool). After a step's verification, still in
the same launch and with no host sync:
  1. catch-up: one pass over all the step's tokens, each fed the token that follows it (for a
     decode row: the target's sample at that position, right wherever it was accepted), so the
     draft layer's KV covers every accepted position; its output at each row's last kept token
     predicts the first draft;
  2. k - 1 single-token passes, each fed the previous draft and the module's own hidden state,
     writing KV past the row (the scheduler reserves num_lookahead_tokens = k there).
The drafts land in `drafts[slot, :k]`, and the next plan's draft slots are filled from them
(spec/inputs.py). They continue the true accepted tokens, so no chain check is needed. Draft
KV positions past a row's pages (a prompt's first decode) are skipped: fewer drafts accepted,
never a wrong token. Drafts are the module's argmax (a deterministic proposal; see spec/step.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..layers.attention import AttentionMetadata, decode_query_bound
from ..runner.inputs import StepTensors, upload
from .config import SpeculativeConfig


class ModelDrafter:
    on_device = True
    needs_hidden = True

    def __init__(self, head: torch.nn.Module, *, method: str, target: torch.nn.Module, k: int, max_num_seqs: int,
                 device: torch.device, kv_cache, page_size: int, max_model_len: int):
        self.head, self.method, self.target, self.k = head, method, target, k
        self.kv_cache, self.page_size, self.max_model_len = kv_cache, page_size, max_model_len
        self.lookahead = k
        self.drafts = torch.zeros(max_num_seqs, k, dtype=torch.int64, device=device)  # [slots, k]
        self.enabled = np.zeros(max_num_seqs, dtype=bool)
        self._counts = np.zeros(max_num_seqs, dtype=np.int32)
        self.token_at: Callable[[int, int], int] | None = None  # (req_id, position) -> known token

    def bind(self, slot: int, prompt, outputs, group: int, enabled: bool) -> None:
        self.enabled[slot] = enabled

    def release(self, slot: int) -> None:
        self.enabled[slot] = False

    def plan_args(self) -> dict:
        np.multiply(self.enabled, self.k, out=self._counts, casting="unsafe")
        return {"num_draft_tokens": self._counts}

    def _feature(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.model.aux_hidden_states if self.method == "eagle3" else hidden

    def _step(self, ids, positions, feature, meta) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head.draft(ids, positions, feature, meta) if self.method == "mtp" else \
            self.head(ids, positions, feature, meta)

    def _meta(self, query_start_loc, seq_lens, page_table, slot_mapping, num_decodes, num_decode_tokens,
              max_query_len, max_decode_query_len=None) -> AttentionMetadata:
        pool = self.kv_cache.device_pool
        return AttentionMetadata(query_start_loc=query_start_loc, seq_lens=seq_lens, page_table=page_table,
                                 slot_mapping=slot_mapping, num_decodes=num_decodes,
                                 num_decode_tokens=num_decode_tokens, max_query_len=max_query_len,
                                 max_decode_query_len=max_decode_query_len,
                                 kv_caches=pool.kv_caches, k_scale=pool.k_scale, v_scale=pool.v_scale)

    def _next_tokens(self, plan, t: StepTensors, tokens: torch.Tensor) -> torch.Tensor:
        """[T]: the token after each input (the draft module's input there)."""
        ndt = int(plan.num_decode_tokens)
        ids = t.input_ids
        following = torch.cat([ids[1:], ids.new_zeros(1)])
        following[:ndt] = tokens[:ndt].to(following.dtype)
        nd, qsl = int(plan.num_decodes), plan.query_start_loc
        prefills = np.arange(nd, plan.req_ids.shape[0])
        if prefills.size == 0:
            return following
        last = qsl[prefills + 1] - 1
        sampled_rows = plan.sample_batch_rows[ndt:]
        samples = np.full(plan.req_ids.shape[0], -1, dtype=np.int64)
        samples[sampled_rows] = np.arange(ndt, plan.sample_batch_rows.shape[0])
        completes = samples[prefills] >= 0
        if completes.any():
            following[upload(last[completes].astype(np.int64), ids.device)] = \
                tokens[upload(samples[prefills][completes], ids.device)].to(following.dtype)
        if (~completes).any():  # a mid-prompt chunk: the next token is known on the host
            rows = prefills[~completes]
            known = [self.token_at(int(plan.req_ids[r]), int(plan.seq_lens[r])) for r in rows.tolist()]
            following[upload(last[~completes].astype(np.int64), ids.device)] = \
                upload(np.asarray(known, np.int64), ids.device).to(following.dtype)
        return following

    def run(self, plan, t: StepTensors, tokens: torch.Tensor, accepted: torch.Tensor | None,
            keep: torch.Tensor | None, hidden: torch.Tensor | None = None) -> None:
        """Draft for every request the step sampled (see the module note); returns None (every
        draft slot is filled with a prediction: no match counts to report)."""
        nd, ndt = int(plan.num_decodes), int(plan.num_decode_tokens)
        if plan.sample_batch_rows.shape[0] == 0:
            return None
        device = hidden.device
        meta = self._meta(t.query_start_loc, t.seq_lens, t.page_table, t.slot_mapping, nd, ndt,
                          int(plan.max_query_len), decode_query_bound(plan))
        normed, prenorm = self._step(self._next_tokens(plan, t, tokens), t.positions, self._feature(hidden), meta)
        # Each sampling row's last kept token: decode rows at start + accepted - 1, prompts at their end.
        prefill_last = plan.logits_indices[ndt:].astype(np.int64)
        rows = np.concatenate([np.arange(nd), plan.sample_batch_rows[ndt:]]).astype(np.int64)
        packed = upload(np.concatenate([plan.query_start_loc[:nd].astype(np.int64), prefill_last, rows]), device)
        kept = packed[:nd] + (accepted - 1 if accepted is not None else 0)
        idx = torch.cat([kept, packed[nd:nd + prefill_last.shape[0]]])
        dev_rows = packed[nd + prefill_last.shape[0]:]
        draft = self.head.compute_logits(normed[idx]).argmax(dim=-1)
        drafts = [draft]
        feature, position = prenorm[idx], t.positions[idx]
        page_table = t.page_table[dev_rows].long()
        num = idx.shape[0]
        qsl = torch.arange(num + 1, dtype=torch.int32, device=device)
        width, ps = page_table.shape[1], self.page_size
        for _ in range(1, self.k):
            position = position + 1
            page_index = position // ps
            pos = position.clamp(max=self.max_model_len - 1)
            page = page_table.gather(1, page_index.clamp(max=width - 1)[:, None])[:, 0]
            valid = (page_index < width) & (position < self.max_model_len) & (page > 0)
            slots = torch.where(valid, page * ps + position % ps, torch.full_like(position, -1))
            # Keys past the row's page-table entries do not exist for the kernels: attend to fewer.
            seq_lens = torch.clamp(pos + 1, max=width * ps).to(torch.int32)
            meta = self._meta(qsl, seq_lens, page_table.to(torch.int32), slots, num, num, 1)
            normed, feature = self._step(draft, pos, feature, meta)
            draft = self.head.compute_logits(normed).argmax(dim=-1)
            drafts.append(draft)
        slot_ids = upload(plan.req_slots[rows].astype(np.int64), device)
        self.drafts[slot_ids] = torch.stack(drafts, dim=1)


def build_model_drafter(config: SpeculativeConfig, *, model, model_config, max_num_seqs: int, device: torch.device,
                        page_size: int, kv_cache, model_path: str | None, load_format: str, max_model_len: int,
                        seed: int) -> ModelDrafter:
    """Load the draft module for `model`; ValueError when it cannot draft for it."""
    if config.method == "mtp":
        from ..loader import load_mtp

        if getattr(model_config, "num_nextn_predict_layers", 0) < 1:
            raise ValueError(f'speculative_config method "mtp": model {model_config.name!r} has no MTP module '
                             f"(num_nextn_predict_layers=0)")
        source = config.model or model_path
        head = load_mtp(source, model, load_format="dummy" if load_format == "dummy" else "auto", seed=seed + 1,
                        progress=False)
    else:
        from ..loader import load_eagle3

        head = load_eagle3(config.model, model, load_format="dummy" if load_format == "dummy" else "auto",
                           seed=seed + 1)
    if kv_cache.device_pool.layout.num_layers <= model_config.num_hidden_layers:
        raise ValueError("the KV pool has no layer for the draft module (build it with one extra layer)")
    return ModelDrafter(head, method=config.method, target=model, k=config.num_speculative_tokens,
                        max_num_seqs=max_num_seqs, device=device, kv_cache=kv_cache, page_size=page_size,
                        max_model_len=max_model_len)
