#include "sim/mechanism.h"

#include "sim/baselines.h"
#include "sim/laissez_mechanism.h"
#include "sim/oracle.h"

namespace laissez::sim {

std::vector<std::string> MechanismNames() {
  return {"laissez", "ondemand", "ondemand-sf", "ondemand-retry", "spot", "spot-capacity", "srpt", "fcfs", "fcfsp",
          "oracle"};
}

Result<std::unique_ptr<Mechanism>> MakeMechanism(std::string_view name) {
  std::unique_ptr<Mechanism> m;
  if (name == "laissez") m = std::make_unique<LaissezMechanism>();
  else if (name == "ondemand") m = std::make_unique<BaselineMechanism>(BaselinePolicy::kOnDemand);
  else if (name == "ondemand-sf") m = std::make_unique<BaselineMechanism>(BaselinePolicy::kOnDemandSmallest);
  else if (name == "ondemand-retry") m = std::make_unique<BaselineMechanism>(BaselinePolicy::kOnDemandRetry);
  else if (name == "spot") m = std::make_unique<BaselineMechanism>(BaselinePolicy::kSpot);
  else if (name == "spot-capacity") m = std::make_unique<BaselineMechanism>(BaselinePolicy::kSpotCapacity);
  else if (name == "srpt") m = std::make_unique<BaselineMechanism>(BaselinePolicy::kSrpt);
  else if (name == "fcfs") m = std::make_unique<BaselineMechanism>(BaselinePolicy::kFcfs);
  else if (name == "fcfsp") m = std::make_unique<BaselineMechanism>(BaselinePolicy::kFcfsP);
  else if (name == "oracle") m = std::make_unique<OracleBound>();
  else
    return InvalidArgument("mechanism: unknown '" + std::string(name) +
                           "' (laissez, ondemand, ondemand-sf, ondemand-retry, spot, spot-capacity, srpt, fcfs, "
                           "fcfsp, oracle or all)");
  return m;
}

}  // namespace laissez::sim
