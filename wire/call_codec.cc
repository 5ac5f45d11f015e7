#include "wire/call_codec.h"

#include "library_ops/library_ops.h"

namespace hiber::wire {
namespace {

template <typename Group>
uint64_t staging_end_of(Group group) {
  if constexpr (requires { group.getStagingEnd(); }) {
    return group.getStagingEnd();
  } else {
    return 0;
  }
}

}  // namespace

std::string_view call_name(proto::Call::Which which) {
  switch (which) {
#define HIBER_CALL_NAME(Name, name, WHICH, where, timing, shape, handler, fields) \
  case proto::Call::WHICH: return calls::Name::kName;
    HIBER_CALLS(HIBER_CALL_NAME, HIBER_CALL_IGNORED)
#undef HIBER_CALL_NAME
  }
  return "unknown";
}

bool runs_on_gpu(proto::Call::Which which) {
  switch (which) {
#define HIBER_CALL_WHERE(Name, name, WHICH, where, timing, shape, handler, fields) \
  case proto::Call::WHICH: return calls::Name::kWhere == Where::kGpu;
    HIBER_CALLS(HIBER_CALL_WHERE, HIBER_CALL_IGNORED)
#undef HIBER_CALL_WHERE
  }
  return false;
}

bool runs_on_gpu(proto::Call::Reader call) {
  if (call.which() == proto::Call::LIBRARY_CALL &&
      library_ops::defines_session_state(
          static_cast<library_ops::LibraryOp>(call.getLibraryCall().getOp()))) {
    return false;
  }
  return runs_on_gpu(call.which());
}

uint64_t staging_end(proto::Call::Reader call) {
  switch (call.which()) {
#define HIBER_CALL_STAGING(Name, name, WHICH, where, timing, shape, handler, fields) \
  case proto::Call::WHICH: return staging_end_of(call.get##Name());
    HIBER_CALLS(HIBER_CALL_STAGING, HIBER_CALL_IGNORED)
#undef HIBER_CALL_STAGING
  }
  return 0;
}

}  // namespace hiber::wire
