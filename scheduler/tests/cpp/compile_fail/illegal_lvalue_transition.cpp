// Transitions consume their state: passing an lvalue (which would leave a second owner of the
// same pages behind) does not compile.
#include "fsm/transitions.h"

int main() {
  using namespace lightspeed;
  fsm::Decoding decoding;
  auto next = fsm::retract_drop(decoding);
  (void)next;
}
