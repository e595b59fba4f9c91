// Request events as functions from a state (taken by rvalue) to the states it may become.
//
// A transition that the lifecycle does not allow has no overload, so it does not compile (the
// compile-fail test checks one). Resources move from the old state into the new one or are
// released by the old state's destructor; nothing is copied, so no page can be owned twice.
#pragma once

#include <concepts>
#include <utility>
#include <variant>

#include "fsm/states.h"

namespace lightspeed::fsm {

// ---- admission -------------------------------------------------------------------------------
// The whole matched prefix is on device (or nothing matched): compute the rest.
inline Prefilling admit(Waiting&&, kv::PageList device_pages, int32_t num_cached) {
  return Prefilling{std::move(device_pages), num_cached};
}
// Part of the prefix is on host: wait for host->device copies first.
inline LoadingPrefix admit_loading(Waiting&&, kv::PageList device_pages, kv::PageList host_pages,
                                   int32_t num_cached) {
  return LoadingPrefix{std::move(device_pages), std::move(host_pages), num_cached};
}
// Part of the prefix is on disk only: read it to host first (and load the host part meanwhile).
inline ReadingDisk admit_reading_disk(Waiting&&, kv::PageList device_pages, kv::PageList host_pages,
                                      kv::PageList disk_slots, int32_t num_cached, int32_t num_disk_pages,
                                      int32_t first_read_row) {
  return ReadingDisk{std::move(device_pages), std::move(host_pages), std::move(disk_slots), num_cached,
                     num_disk_pages, first_read_row};
}
// A swapped-out request loads its KV back; its host pages stay pinned until the copy is acked.
inline LoadingPrefix readmit(Retracted&& state, kv::PageList device_pages) {
  return LoadingPrefix{std::move(device_pages), std::move(state.host_pages), state.num_saved};
}

// ---- copies acknowledged ---------------------------------------------------------------------
inline Prefilling copy_done(LoadingPrefix&& state) {
  kv::PageList host_pins = std::move(state.host_pages);  // released on return: the copy landed
  return Prefilling{std::move(state.device_pages), state.num_computed};
}
// The disk reads landed; the first `num_verified` disk pages passed their checks. The pages after
// the first failed one are dropped (recomputed): a prefix cannot skip a page.
inline DiskLanded disk_read_done(ReadingDisk&& state, int32_t num_verified, int32_t page_size) {
  const int32_t dropped = state.num_disk_pages - num_verified;
  state.host_pages.truncate(state.host_pages.size() - static_cast<size_t>(dropped));
  kv::PageList disk_pins = std::move(state.disk_slots);  // released on return: the reads landed
  return DiskLanded{std::move(state.device_pages), std::move(state.host_pages),
                    state.num_computed - dropped * page_size, num_verified};
}
// The pages read from disk are being copied to the device (the caller grew device_pages).
inline LoadingPrefix load_landed(DiskLanded&& state) {
  return LoadingPrefix{std::move(state.device_pages), std::move(state.host_pages), state.num_computed};
}
// Nothing left to copy: no page read from disk passed its checks.
inline Prefilling nothing_to_load(DiskLanded&& state) {
  kv::PageList host_pins = std::move(state.host_pages);  // released on return
  return Prefilling{std::move(state.device_pages), state.num_computed};
}
inline Retracted copy_done(Retracting&& state) {
  return Retracted{std::move(state.host_pages), state.num_saved};
}

// ---- compute progress ------------------------------------------------------------------------
// A prefill chunk was scheduled: it stays Prefilling, or becomes Decoding when the chunk reaches
// the end of the known tokens (that chunk samples the first new token).
inline std::variant<Prefilling, Decoding> chunk_scheduled(Prefilling&& state, int32_t chunk,
                                                          int32_t num_tokens) {
  state.num_computed += chunk;
  if (state.num_computed < num_tokens) return std::move(state);
  return Decoding{std::move(state.device_pages), state.num_computed};
}

// ---- retraction ------------------------------------------------------------------------------
// KV goes to host: device pages are released now (the copies run before the next forward).
template <class S>
  requires std::same_as<S, Prefilling> || std::same_as<S, Decoding>
inline Retracting retract_to_host(S&& state, kv::PageList host_pages, int32_t num_saved) {
  state.device_pages.clear();
  return Retracting{std::move(host_pages), num_saved};
}
// No room on host: KV is dropped and will be recomputed (the prefix cache may still hold it).
template <class S>
  requires std::same_as<S, Prefilling> || std::same_as<S, Decoding>
inline Waiting retract_drop(S&& state) {
  [[maybe_unused]] S consumed = std::move(state);  // its pages are released on return
  return Waiting{};
}

// ---- finishing -------------------------------------------------------------------------------
// A request finishes outright. Besides Decoding, a request retracted while its last sample was
// still in flight (overlap) can learn it finished in any of the retraction states.
template <class S>
  requires std::same_as<S, Decoding> || std::same_as<S, Retracting> || std::same_as<S, Retracted> ||
           std::same_as<S, Waiting>
inline Finished finish(S&& state, FinishReason reason) {
  [[maybe_unused]] S consumed = std::move(state);  // its pages are released on return
  return Finished{reason};
}

// ---- abort -----------------------------------------------------------------------------------
// Any live state: everything it owns is released at once.
template <class S>
  requires(!std::same_as<S, Finished> && !std::same_as<S, Aborted> && std::is_rvalue_reference_v<S &&>)
inline Aborted abort(S&& state) {
  [[maybe_unused]] S consumed = std::move(state);  // everything it owns is released on return
  return Aborted{};
}

// Assigns a narrower variant's alternative into the full RequestState.
template <class... Ts>
inline void assign(RequestState& state, std::variant<Ts...>&& next) {
  std::visit([&](auto&& alternative) { state = std::move(alternative); }, std::move(next));
}

}  // namespace lightspeed::fsm
