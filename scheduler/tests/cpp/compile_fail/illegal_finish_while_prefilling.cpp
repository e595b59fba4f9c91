// A request cannot finish before its prompt is computed: Prefilling has no finish event.
#include "fsm/transitions.h"

int main() {
  using namespace lightspeed;
  fsm::Prefilling prefilling;
  auto next = fsm::finish(std::move(prefilling), fsm::FinishReason::kStop);
  (void)next;
}
