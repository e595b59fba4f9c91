// A decode has no copy in flight: acknowledging one is not a transition of Decoding.
#include "fsm/transitions.h"

int main() {
  using namespace lightspeed;
  fsm::Decoding decoding;
  auto next = fsm::copy_done(std::move(decoding));
  (void)next;
}
