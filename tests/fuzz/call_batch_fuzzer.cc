// A call batch as a session takes it off its request ring (server/session.cc): the message is
// read with read_message<proto::Batch> and the session's batch limit; each call's name, where it
// runs and its staging end are looked up; its arguments are read with read_call (a throw fails
// that call only, as Session::execute catches it); library handle, compute and query calls go
// through LibraryCalls, the session's own checks (server/library_calls.h, blas_checks.cc,
// dnn_checks.cc). The device is left out: this is the decode and validation path, with no
// threads.
//
// Promises checked: nothing crashes, leaks or hangs; every call's arguments re-encode
// (write_call) to a call whose decoding encodes to the same bytes; LibraryCalls agrees with a
// plain model of the handles made and destroyed, and never passes a call on a handle the
// session does not hold.
#include <capnp/message.h>
#include <kj/exception.h>

#include <map>

#include "server/library_calls.h"
#include "tests/fuzz/fuzz_support.h"
#include "wire/call_codec.h"
#include "wire/library.h"
#include "wire/limits.h"
#include "wire/message.h"

namespace hiber {
namespace {

namespace proto = wire::proto;
namespace calls = wire::calls;

struct Checker {
  server::LibraryCalls libraries;
  std::map<uint64_t, uint8_t> model;  // the handles the session holds, by the calls that succeeded

  template <typename T>
  void call(proto::Call::Reader call) {
    const T args = wire::read_call<T>(call);
    check_round_trip(args);
    library(args);
  }

  template <typename T>
  static void check_round_trip(const T& args) {
    capnp::MallocMessageBuilder once;
    wire::write_call(once.initRoot<proto::Call>(), args);
    const T back = wire::read_call<T>(once.getRoot<proto::Call>().asReader());
    capnp::MallocMessageBuilder twice;
    wire::write_call(twice.initRoot<proto::Call>(), back);
    CHECK(fuzz::same_bytes(wire::frame_bytes(once), wire::frame_bytes(twice)))
        << T::kName << " changed through decode and encode";
  }

  template <typename T>
  void library(const T& c) {
    if constexpr (std::is_same_v<T, calls::LibraryHandleCreate>) {
      const bool made = libraries.create_handle(c.handle, c.library).ok();
      const bool fresh = !model.contains(c.handle.value());
      CHECK(!made || fresh) << "handle " << c.handle.value() << " made twice";
      if (made) model.emplace(c.handle.value(), c.library);
    } else if constexpr (std::is_same_v<T, calls::LibraryHandleDestroy>) {
      const bool destroyed = libraries.destroy_handle(c.handle).ok();
      CHECK_EQ(destroyed, model.erase(c.handle.value()) == 1);
    } else if constexpr (std::is_same_v<T, calls::LibraryCall>) {
      Result<server::LibraryAccess> access = libraries.check_call(c.handle, c.op, c.args);
      CHECK(!access.ok() || model.contains(c.handle.value()))
          << "a library call on a handle the session does not hold passed";
      if (access.ok()) {
        for (const server::LibraryOperand& operand : access->operands) CHECK(operand.what);
      }
    } else if constexpr (std::is_same_v<T, calls::LibraryQuery>) {
      const bool passed = libraries.check_query(c.handle, c.op, c.args).ok();
      CHECK(!passed || model.contains(c.handle.value()))
          << "a library query on a handle the session does not hold passed";
    }
  }
};

void check_batch(const wire::Message& message) {
  Checker checker;
  (void)wire::read_message<proto::Batch>(message, "batch",
                                         [&](proto::Batch::Reader batch) -> Status {
                                           auto list = batch.getCalls();
                                           if (list.size() > wire::kMaxCallsPerBatch)
                                             return Status(ErrorCode::kInvalidValue, "");
                                           (void)batch.getFirstSeq();
                                           // Refused batches give back their staging: staging_end
                                           // reads no field that can throw.
                                           for (auto call : list) (void)wire::staging_end(call);
                                           for (auto call : list) {
                                             (void)wire::call_name(call.which());
                                             (void)wire::runs_on_gpu(call.which());
                                             (void)call.getReply();
                                             (void)kj::runCatchingExceptions([&] {
                                               switch (call.which()) {
#define HIBER_FUZZ_CALL(Name, name, WHICH, where, timing, shape, handler, fields) \
  case proto::Call::WHICH:                                                        \
    checker.call<calls::Name>(call);                                              \
    break;
                                                 HIBER_CALLS(HIBER_FUZZ_CALL, HIBER_CALL_IGNORED)
#undef HIBER_FUZZ_CALL
                                               }
                                             });
                                           }
                                           return Status();
                                         });
}

}  // namespace
}  // namespace hiber

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hiber::fuzz::quiet_logging();
  return 0;
}

// The input is the message as the ring delivers it (the ring's own framing is fuzzed nowhere
// here: wire/ring.h checks it, and tests/unit/wire_ring_test.cc covers it).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hiber::wire::Message message;
  auto out = message.resize(size);
  std::copy(data, data + size, reinterpret_cast<uint8_t*>(out.data()));
  hiber::check_batch(message);
  return 0;
}
