// FaultInjectingFabric: a TpFabric whose remote fetches fail as a FaultPlan says (the
// semantics are in backend/fault_backend.h: FetchFromHome returns kIo, with `partial` after
// the first k entries landed; with delay > 0 every fetch sleeps before it returns).
// Collectives (AllTrue, Barrier, AllGather, AllToAllV, Expose) pass through untouched: a
// failed collective is a broken job, not a recoverable error.
#pragma once

#include <memory>

#include "backend/fault_backend.h"
#include "ula/tp_fabric.h"

namespace ula {

class FaultInjectingFabric : public TpFabric {
 public:
  virtual FaultStats stats() const = 0;
  virtual void set_armed(bool armed) = 0;
};

// REQUIRES: inner outlives the result. kInvalidArgument for a plan that fails Validate.
Result<std::unique_ptr<FaultInjectingFabric>> MakeFaultInjectingFabric(TpFabric& inner, const FaultPlan& plan);

}  // namespace ula
