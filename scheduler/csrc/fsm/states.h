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
// copies were planned: the same plan runs its copies before its forward may reuse them.
struct Retracting {
  kv::PageList host_pages;  // destinations of the copies
  int32_t num_saved = 0;    // tokens whose KV the host pages will hold
};

// Swapped out to host; waits for readmission.
struct Retracted {
  kv::PageList host_pages;
  int32_t num_saved = 0;
};

// Finished; its prefix pages are being copied to the host tier of the prefix cache.
struct WritingBack {
  kv::PageList device_pages;  // sources of the copies, held until the copy is acked
  FinishReason reason = FinishReason::kStop;
};

struct Finished {
  FinishReason reason = FinishReason::kStop;
};

struct Aborted {};

using RequestState = std::variant<Waiting, LoadingPrefix, Prefilling, Decoding, Retracting, Retracted,
                                  WritingBack, Finished, Aborted>;

// Stable lower-case names, used by request_stats() in Python.
inline const char* state_name(const RequestState& state) {
  static constexpr const char* kNames[] = {"waiting",    "loading_prefix", "prefilling",
                                           "decoding",   "retracting",     "retracted",
                                           "writing_back", "finished",     "aborted"};
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
