// Request lifecycle states. Each state owns exactly the resources valid in it, as move-only
// PageLists; a request's state is a std::variant of these, so resources move with the state.
#pragma once

#include <cstdint>
#include <variant>

#include "kv/page_pool.h"

namespace lightspeed::fsm {

enum class FinishReason : uint8_t { kStop, kLength, kAbort };

// Queued; owns nothing. Also where a retracted request lands when its KV was dropped (recompute).
struct Waiting {};

// Part of the matched prefix is on disk only: disk->host reads of it are in flight (and host->device
// copies of the part already on host, if any). Its disk part reaches the device in a second step
// (DiskLanded), once the reads have been verified.
struct ReadingDisk {
  kv::PageList device_pages;  // shared device hits, then the destinations of the host part's loads
  kv::PageList host_pages;    // the host part (load sources), then the disk reads' destinations
  kv::PageList disk_slots;    // the reads' sources, kept from eviction until the reads are acked
  int32_t num_computed = 0;   // tokens the whole prefix holds, disk part included
  int32_t num_disk_pages = 0; // trailing entries of host_pages filled from disk (staging pages)
  int32_t first_read_row = 0; // its reads are rows [first_read_row, + num_disk_pages) of the plan's disk_read
};

// The disk reads landed and were verified: the prefix is on device, then on host. The next plan that
// has room copies the pages read from disk to device pages of the request's own (-> LoadingPrefix).
struct DiskLanded {
  kv::PageList device_pages;  // as in ReadingDisk, all landed
  kv::PageList host_pages;    // as in ReadingDisk, the disk part cut at its first page that failed
  int32_t num_computed = 0;   // tokens of the verified prefix
  int32_t num_disk_pages = 0; // trailing entries of host_pages not yet on the device
};

// Host->device copies of a matched prefix (or of a retracted request's KV) are in flight.
struct LoadingPrefix {
  kv::PageList device_pages;  // prefix pages: shared device hits, then the copies' destinations
  kv::PageList host_pages;    // the copies' sources, kept from eviction until the copy is acked
  int32_t num_computed = 0;   // tokens whose KV the prefix holds once the copies land
};

// Admitted; prompt chunks are being computed.
struct Prefilling {
  kv::PageList device_pages;  // covers num_computed tokens (plus the scheduled chunk)
  int32_t num_computed = 0;   // tokens whose KV is written or scheduled in a plan
};

// Prompt done; one token (or 1 + k draft tokens) per step.
struct Decoding {
  kv::PageList device_pages;  // covers kv_len tokens
  int32_t kv_len = 0;         // tokens whose KV is written or scheduled in a plan
};

// Device->host copies of the request's KV are in flight. Its device pages were given up when the
// copies were planned, so that the same plan's forward can reuse them: that plan is marked
// forward_waits_for_copies and its forward starts only once the copies have read them.
struct Retracting {
  kv::PageList host_pages;  // destinations of the copies
  int32_t num_saved = 0;    // tokens whose KV the host pages will hold
};

// Swapped out to host; waits for readmission.
struct Retracted {
  kv::PageList host_pages;
  int32_t num_saved = 0;
};

struct Finished {
  FinishReason reason = FinishReason::kStop;
};

struct Aborted {};

// A finished request owns nothing: its prefix pages live on in the prefix cache, whose nodes own
// them while they are written through to host (see RadixCache::begin_write_back).
using RequestState = std::variant<Waiting, ReadingDisk, DiskLanded, LoadingPrefix, Prefilling, Decoding,
                                  Retracting, Retracted, Finished, Aborted>;

// Stable lower-case names, used by request_stats() in Python.
inline const char* state_name(const RequestState& state) {
  static constexpr const char* kNames[] = {"waiting",    "reading_disk", "disk_landed", "loading_prefix",
                                           "prefilling", "decoding",     "retracting",  "retracted",
                                           "finished",   "aborted"};
  return kNames[state.index()];
}

inline const char* reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
  }
  return "abort";
}

}  // namespace lightspeed::fsm
