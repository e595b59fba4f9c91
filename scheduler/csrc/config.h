// Scheduler configuration and request description: plain values, validated in one place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lightspeed {

enum class Policy : uint8_t {
  kDecodeFirst,   // every running decode gets its tokens; prefill chunks fill the remaining budget
  kPrefillFirst,  // a step with prefill work runs only prefill chunks; decodes run in the others
};

struct SchedulerConfig {
  int32_t page_size = 16;                 // tokens per KV page
  int32_t num_device_pages = 1024;        // device pool size, page 0 (padding) included
  int32_t num_host_pages = 4096;          // host pool size, page 0 included; 2+ pages, or 0: no host tier
  int32_t max_num_seqs = 256;             // rows per step, and running requests
  int32_t max_num_batched_tokens = 8192;  // tokens per step
  int32_t chunked_prefill_size = 2048;    // prefill tokens per request per step
  int32_t max_model_len = 32768;          // prompt + output tokens
  std::string policy = "decode_first";    // "decode_first" or "prefill_first"
  bool enable_prefix_cache = true;
  int32_t max_num_draft_tokens = 15;      // largest RequestSpec.num_draft_tokens accepted
  // Copies are acknowledged by copies_done(step) when the engine sees them land (an event query),
  // not by advance(): the engine runs them on their own stream and never waits for them.
  bool async_copies = false;
  // Most prefix pages being written through to host at once (unacknowledged): bounds the bytes in
  // flight and so the PCIe share the background write-through takes.
  int32_t max_write_through_pages = 256;
  // Disk tier under the host tier: slots of one page each, slot 0 included (never used); 0: no disk
  // tier. Needs a host tier: a disk hit is read into host pages, then loaded to the device.
  int32_t num_disk_pages = 0;
  // Most host pages being written to disk at once (unacknowledged): bounds the disk write bytes in
  // flight, so background writes never hold a disk read back for long.
  int32_t max_disk_write_pages = 64;
  // Decode rows also reserve KV pages (and page-table entries) this many tokens past their last
  // position: a draft model run on the device after the step writes its own layer's KV there.
  int32_t num_lookahead_tokens = 0;
  // Request slots beyond max_num_seqs. With overlap, a request sure to finish with the plan in
  // flight keeps its slot until advance(); a waiting request takes a spare slot and its row in the
  // next plan instead of waiting a step for the finished one's. 0: slots = max_num_seqs.
  int32_t num_spare_slots = 0;
  // Prefix-cache eviction order. "queue": least recently used, except that the cached prefixes of
  // waiting requests go last, the next to be admitted very last (scheduler_eviction.cpp). "lru":
  // least recently used only.
  std::string eviction_policy = "queue";

  // Throws std::invalid_argument with a message naming the bad field.
  void validate() const;
  Policy parsed_policy() const;
  int32_t max_pages_per_seq() const;
  int32_t num_slots() const { return max_num_seqs + num_spare_slots; }
};

// Bound of RequestSpec::retention: a hint must not pin pages for ever.
inline constexpr int32_t kMaxRetention = 16;

struct RequestSpec {
  std::string rid;                      // caller's id; unique among live requests
  std::vector<int32_t> token_ids;       // prompt
  int32_t max_new_tokens = 16;
  std::vector<int32_t> eos_token_ids;   // stop unless ignore_eos
  std::vector<int32_t> stop_token_ids;  // stop always
  bool ignore_eos = false;
  int32_t priority = 0;                 // larger runs first and is retracted last
  int32_t num_draft_tokens = 0;         // speculative tokens per decode step (0: none)
  // Retention hint of a request that names its session: the prefix-cache pages it uses survive
  // this many extra eviction sweeps beyond plain LRU (0: plain LRU). See RadixCache::touch.
  int32_t retention = 0;
};

}  // namespace lightspeed
