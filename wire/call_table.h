// The call table: every remoted call (the Call union of wire/schema/calls.capnp), described once.
//
// HIBER_CALLS(X, F) expands X once per call:
//   X(Name, name, WHICH, where, timing, shape, handler, (F(type, field, Capnp) ...))
// - Name: the call's argument struct, wire::calls::Name (below);
// - name: the schema's name of the call, for logs and traces;
// - WHICH: its proto::Call::Which value;
// - where: kGpu if it puts work on the GPU, so it runs only under a lease; kHost otherwise;
// - timing: kSync for a synchronisation, whose reply waits for device work (its handler gets the
//   call's sequence number to post the completion later); kAsync for every other call;
// - shape: GROUP (its arguments are a group) or VOID (it has none);
// - handler: the name of the server's handler (server/session_calls.cc);
// - F(type, field, Capnp): one argument: its C++ type, the struct's member, the schema field
//   (Capnp as in getCapnp/setCapnp).
// From it come the argument structs (here), their Cap'n Proto readers and writers
// (wire/call_codec.h), the shim's request builders and the server's dispatch.
//
// Arguments are listed in the order callers name them (streams before events); the schema's
// ordinals are what fix the wire layout, not this order.
//
// No Cap'n Proto here, so headers that only name calls (server/session.h) do not pull it in.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace hiber::wire {

// A handle the client chose for an object it made. One type per kind of object, so that a
// stream cannot be passed where an event is expected. 0 is reserved (for streams: the default
// stream).
template <typename Tag>
class Handle {
 public:
  constexpr Handle() = default;
  constexpr explicit Handle(uint64_t value) : value_(value) {}
  constexpr uint64_t value() const { return value_; }
  constexpr bool is_zero() const { return value_ == 0; }
  friend constexpr auto operator<=>(Handle, Handle) = default;

 private:
  uint64_t value_ = 0;
};
using StreamHandle = Handle<struct StreamTag>;
using EventHandle = Handle<struct EventTag>;
using ModuleHandle = Handle<struct ModuleTag>;
using FunctionHandle = Handle<struct FunctionTag>;
using LibraryHandle = Handle<struct LibraryTag>;  // a cuBLAS/cuBLASLt or cuDNN handle
using GraphHandle = Handle<struct GraphTag>;      // a graph defined by graphBegin/graphEnd

enum class Where { kHost, kGpu };
enum class Timing { kAsync, kSync };

// clang-format off
#define HIBER_CALLS(X, F)                                                                          \
  X(Ping, ping, PING, kHost, kAsync, GROUP, ping,                                                  \
    (F(uint64_t, value, Value)))                                                                   \
  X(MemAllocate, memAllocate, MEM_ALLOCATE, kHost, kAsync, GROUP, mem_allocate,                    \
    (F(uint64_t, va, Va) F(uint64_t, bytes, Bytes)))                                               \
  X(MemFree, memFree, MEM_FREE, kHost, kAsync, GROUP, mem_free,                                    \
    (F(uint64_t, va, Va)))                                                                         \
  X(MemcpyHtoD, memcpyHtoD, MEMCPY_HTO_D, kGpu, kAsync, GROUP, memcpy_htod,                        \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(uint64_t, dst, Dst)                          \
     F(uint64_t, src_offset, SrcOffset) F(uint64_t, bytes, Bytes)                                  \
     F(uint64_t, staging_end, StagingEnd)))                                                        \
  X(MemcpyDtoH, memcpyDtoH, MEMCPY_DTO_H, kGpu, kAsync, GROUP, memcpy_dtoh,                        \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(uint64_t, dst_offset, DstOffset)             \
     F(uint64_t, src, Src) F(uint64_t, bytes, Bytes) F(uint64_t, staging_end, StagingEnd)))        \
  X(MemcpyDtoD, memcpyDtoD, MEMCPY_DTO_D, kGpu, kAsync, GROUP, memcpy_dtod,                        \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(uint64_t, dst, Dst) F(uint64_t, src, Src)    \
     F(uint64_t, bytes, Bytes)))                                                                   \
  X(Memset, memset, MEMSET, kGpu, kAsync, GROUP, memset,                                           \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(uint64_t, dst, Dst)                          \
     F(uint32_t, value, Value) F(uint8_t, element_bytes, ElementBytes) F(uint64_t, count, Count))) \
  X(StreamCreate, streamCreate, STREAM_CREATE, kHost, kAsync, GROUP, stream_create,                \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(int32_t, priority, Priority)))               \
  X(StreamDestroy, streamDestroy, STREAM_DESTROY, kHost, kAsync, GROUP, stream_destroy,            \
    (F(::hiber::wire::StreamHandle, stream, Stream)))                                              \
  X(StreamSynchronize, streamSynchronize, STREAM_SYNCHRONIZE, kHost, kSync, GROUP,                 \
    stream_synchronize,                                                                            \
    (F(::hiber::wire::StreamHandle, stream, Stream)))                                              \
  X(StreamQuery, streamQuery, STREAM_QUERY, kHost, kAsync, GROUP, stream_query,                    \
    (F(::hiber::wire::StreamHandle, stream, Stream)))                                              \
  X(StreamWaitEvent, streamWaitEvent, STREAM_WAIT_EVENT, kGpu, kAsync, GROUP, stream_wait_event,   \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(::hiber::wire::EventHandle, event, Event)))  \
  X(EventCreate, eventCreate, EVENT_CREATE, kHost, kAsync, GROUP, event_create,                    \
    (F(::hiber::wire::EventHandle, event, Event) F(bool, disable_timing, DisableTiming)))          \
  X(EventDestroy, eventDestroy, EVENT_DESTROY, kHost, kAsync, GROUP, event_destroy,                \
    (F(::hiber::wire::EventHandle, event, Event)))                                                 \
  X(EventRecord, eventRecord, EVENT_RECORD, kGpu, kAsync, GROUP, event_record,                     \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(::hiber::wire::EventHandle, event, Event)))  \
  X(EventSynchronize, eventSynchronize, EVENT_SYNCHRONIZE, kHost, kSync, GROUP, event_synchronize, \
    (F(::hiber::wire::EventHandle, event, Event)))                                                 \
  X(EventQuery, eventQuery, EVENT_QUERY, kHost, kAsync, GROUP, event_query,                        \
    (F(::hiber::wire::EventHandle, event, Event)))                                                 \
  X(EventElapsedTime, eventElapsedTime, EVENT_ELAPSED_TIME, kHost, kAsync, GROUP, event_elapsed,   \
    (F(::hiber::wire::EventHandle, start, Start) F(::hiber::wire::EventHandle, end, End)))         \
  X(DeviceSynchronize, deviceSynchronize, DEVICE_SYNCHRONIZE, kHost, kSync, VOID,                  \
    device_synchronize, ())                                                                        \
  X(ModuleLoad, moduleLoad, MODULE_LOAD, kHost, kAsync, GROUP, module_load,                        \
    (F(::hiber::wire::ModuleHandle, module, Module) F(uint64_t, image_offset, ImageOffset)         \
     F(uint64_t, image_bytes, ImageBytes) F(uint64_t, staging_end, StagingEnd)))                   \
  X(ModuleUnload, moduleUnload, MODULE_UNLOAD, kHost, kAsync, GROUP, module_unload,                \
    (F(::hiber::wire::ModuleHandle, module, Module)))                                              \
  X(FunctionGet, functionGet, FUNCTION_GET, kHost, kAsync, GROUP, function_get,                    \
    (F(::hiber::wire::FunctionHandle, function, Function)                                          \
     F(::hiber::wire::ModuleHandle, module, Module) F(std::string, name, Name)))                   \
  X(LaunchKernel, launchKernel, LAUNCH_KERNEL, kGpu, kAsync, GROUP, launch_kernel,                 \
    (F(::hiber::wire::StreamHandle, stream, Stream)                                                \
     F(::hiber::wire::FunctionHandle, function, Function)                                          \
     F(uint32_t, grid_x, GridX) F(uint32_t, grid_y, GridY) F(uint32_t, grid_z, GridZ)              \
     F(uint32_t, block_x, BlockX) F(uint32_t, block_y, BlockY) F(uint32_t, block_z, BlockZ)        \
     F(uint32_t, shared_mem_bytes, SharedMemBytes)                                                 \
     F(std::span<const std::byte>, params, Params)))                                               \
  X(ModuleLoadCached, moduleLoadCached, MODULE_LOAD_CACHED, kHost, kAsync, GROUP,                  \
    module_load_cached,                                                                            \
    (F(::hiber::wire::ModuleHandle, module, Module) F(std::span<const std::byte>, sha256, Sha256))) \
  X(LibraryHandleCreate, libraryHandleCreate, LIBRARY_HANDLE_CREATE, kHost, kAsync, GROUP,         \
    library_handle_create,                                                                         \
    (F(::hiber::wire::LibraryHandle, handle, Handle) F(uint8_t, library, Library)))                \
  X(LibraryHandleDestroy, libraryHandleDestroy, LIBRARY_HANDLE_DESTROY, kHost, kAsync, GROUP,      \
    library_handle_destroy,                                                                        \
    (F(::hiber::wire::LibraryHandle, handle, Handle)))                                             \
  X(LibraryCall, libraryCall, LIBRARY_CALL, kGpu, kAsync, GROUP, library_call,                     \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(::hiber::wire::LibraryHandle, handle, Handle) \
     F(uint16_t, op, Op) F(std::span<const std::byte>, args, Args)))                               \
  X(LibraryQuery, libraryQuery, LIBRARY_QUERY, kHost, kAsync, GROUP, library_query,                \
    (F(::hiber::wire::LibraryHandle, handle, Handle) F(uint16_t, op, Op)                           \
     F(std::span<const std::byte>, args, Args)))                                                   \
  X(GraphBegin, graphBegin, GRAPH_BEGIN, kHost, kAsync, GROUP, graph_begin,                        \
    (F(::hiber::wire::GraphHandle, graph, Graph)))                                                 \
  X(GraphEnd, graphEnd, GRAPH_END, kHost, kAsync, GROUP, graph_end,                                \
    (F(::hiber::wire::GraphHandle, graph, Graph)))                                                 \
  X(GraphLaunch, graphLaunch, GRAPH_LAUNCH, kGpu, kAsync, GROUP, graph_launch,                     \
    (F(::hiber::wire::StreamHandle, stream, Stream) F(::hiber::wire::GraphHandle, graph, Graph)))  \
  X(GraphDestroy, graphDestroy, GRAPH_DESTROY, kHost, kAsync, GROUP, graph_destroy,                \
    (F(::hiber::wire::GraphHandle, graph, Graph)))
// clang-format on

#define HIBER_CALL_EXPAND(...) __VA_ARGS__
// For expansions of the table that do not look at the arguments.
#define HIBER_CALL_IGNORED(type, field, Capnp)

namespace calls {

// One struct per call, its arguments as members, e.g. calls::MemFree{.va = p}. A span member
// points at the caller's bytes (on the server: into the request message) and lives no longer.
#define HIBER_CALL_MEMBER(type, field, Capnp) type field{};
#define HIBER_CALL_STRUCT(Name, name, WHICH, where, timing, shape, handler, fields) \
  struct Name {                                                                     \
    static constexpr std::string_view kName = #name;                                \
    static constexpr Where kWhere = Where::where;                                   \
    static constexpr Timing kTiming = Timing::timing;                               \
    HIBER_CALL_EXPAND fields                                                        \
  };
HIBER_CALLS(HIBER_CALL_STRUCT, HIBER_CALL_MEMBER)
#undef HIBER_CALL_STRUCT
#undef HIBER_CALL_MEMBER

}  // namespace calls
}  // namespace hiber::wire

template <typename Tag>
struct std::hash<hiber::wire::Handle<Tag>> {
  size_t operator()(hiber::wire::Handle<Tag> h) const { return std::hash<uint64_t>()(h.value()); }
};
