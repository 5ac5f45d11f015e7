#include "scheduler/types.h"

namespace hiber::scheduler {

const char* source_name(Source source) {
  switch (source) {
    case Source::kResident: return "resident";
    case Source::kPeer: return "peer";
    case Source::kHost: return "host";
  }
  return "unknown";
}

}  // namespace hiber::scheduler
