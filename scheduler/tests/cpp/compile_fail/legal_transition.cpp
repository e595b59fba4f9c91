// Control for the compile-fail cases: the same harness compiles a legal transition.
#include "fsm/transitions.h"

int main() {
  using namespace lightspeed;
  kv::PagePool pool(4);
  fsm::LoadingPrefix loading{kv::PageList(pool, 1), kv::PageList(pool, 1), 0};
  fsm::Prefilling prefilling = fsm::copy_done(std::move(loading));
  return prefilling.num_computed;
}
