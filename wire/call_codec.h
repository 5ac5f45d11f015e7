// The calls of wire/call_table.h to and from Cap'n Proto: write_call() fills a proto::Call from
// a call's argument struct, read_call<T>() reads one, and the table's per-call facts are looked
// up by proto::Call::Which.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "wire/call_table.h"
#include "wire/schema/calls.capnp.h"

namespace hiber::wire {
namespace call_codec_detail {

template <typename T>
struct IsHandle : std::false_type {};
template <typename Tag>
struct IsHandle<Handle<Tag>> : std::true_type {};

template <typename T, typename V>
T from_capnp(V value) {
  if constexpr (IsHandle<T>::value) {
    return T(value);
  } else if constexpr (std::is_same_v<T, std::span<const std::byte>>) {
    return std::as_bytes(std::span(value.begin(), value.size()));
  } else if constexpr (std::is_same_v<T, std::string>) {
    return std::string(value.cStr(), value.size());
  } else {
    return value;
  }
}

template <typename T>
auto to_capnp(const T& value) {
  if constexpr (IsHandle<T>::value) {
    return value.value();
  } else if constexpr (std::is_same_v<T, std::span<const std::byte>>) {
    return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(value.data()), value.size());
  } else if constexpr (std::is_same_v<T, std::string>) {
    return capnp::Text::Reader(value.c_str(), value.size());
  } else {
    return value;
  }
}

}  // namespace call_codec_detail

// Reads call T's arguments. REQUIRES: call.which() is T's. Throws kj::Exception where the client
// encoded a field wrongly.
template <typename T>
T read_call(proto::Call::Reader call);

#define HIBER_CALL_READ_FIELD(type, field, Capnp) \
  args.field = call_codec_detail::from_capnp<type>(group.get##Capnp());
#define HIBER_CALL_READ_GROUP(Name, fields) \
  auto group = call.get##Name();            \
  HIBER_CALL_EXPAND fields
#define HIBER_CALL_READ_VOID(Name, fields)
#define HIBER_CALL_READER(Name, name, WHICH, where, timing, shape, handler, fields)      \
  template <>                                                                            \
  inline calls::Name read_call<calls::Name>([[maybe_unused]] proto::Call::Reader call) { \
    calls::Name args;                                                                    \
    HIBER_CALL_READ_##shape(Name, fields) return args;                                   \
  }
HIBER_CALLS(HIBER_CALL_READER, HIBER_CALL_READ_FIELD)
#undef HIBER_CALL_READER
#undef HIBER_CALL_READ_VOID
#undef HIBER_CALL_READ_GROUP
#undef HIBER_CALL_READ_FIELD

// Fills `call` (its union member; not its reply flag) from the arguments.
#define HIBER_CALL_WRITE_FIELD(type, field, Capnp) \
  group.set##Capnp(call_codec_detail::to_capnp(args.field));
#define HIBER_CALL_WRITE_GROUP(Name, fields) \
  auto group = call.init##Name();            \
  HIBER_CALL_EXPAND fields
#define HIBER_CALL_WRITE_VOID(Name, fields) call.set##Name();
#define HIBER_CALL_WRITER(Name, name, WHICH, where, timing, shape, handler, fields)             \
  inline void write_call(proto::Call::Builder call, [[maybe_unused]] const calls::Name& args) { \
    HIBER_CALL_WRITE_##shape(Name, fields)                                                      \
  }
HIBER_CALLS(HIBER_CALL_WRITER, HIBER_CALL_WRITE_FIELD)
#undef HIBER_CALL_WRITER
#undef HIBER_CALL_WRITE_VOID
#undef HIBER_CALL_WRITE_GROUP
#undef HIBER_CALL_WRITE_FIELD

// A call's argument struct, or a function that fills a proto::Call::Builder itself (tests that
// send what no well-behaved client would).
template <typename Fill>
void fill_call(proto::Call::Builder call, Fill&& fill) {
  if constexpr (std::is_invocable_v<Fill&, proto::Call::Builder>) {
    fill(call);
  } else {
    write_call(call, fill);
  }
}

// The schema's name of the call ("memcpyHtoD"); "unknown" for a call newer than this build.
std::string_view call_name(proto::Call::Which which);
// Whether the call puts work on the GPU, so that it runs only under a lease.
bool runs_on_gpu(proto::Call::Which which);
// The same of one call: a library call that only defines the session's state (a cuDNN graph,
// library_ops::defines_session_state) puts no work on the GPU, whatever its stream.
bool runs_on_gpu(proto::Call::Reader call);
// The stagingEnd the call names (docs/wire-format.md), or 0. Reads no field that can throw.
uint64_t staging_end(proto::Call::Reader call);

}  // namespace hiber::wire
