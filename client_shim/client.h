// The shim's client core: one session with hiberd per process, shared by the CUDA runtime and
// driver front-ends (runtime_api.cc, driver_api.cc, registration.cc).
//
// Everything here speaks hiber::Status, whose codes are CUresult values; the front-ends turn
// them into cudaError_t or CUresult. The core decides what is asynchronous:
//  - calls whose result the host does not need (launches, memsets, copies from captured
//    sources, event records, stream waits, frees) are appended to the batch and not waited for;
//  - the batch goes out at N calls, at B bytes, after T microseconds of quiet (a background
//    flusher), or at any synchronous call, which then waits for its reply;
//  - a failure of an asynchronous call is the session's sticky error, reported at the next
//    synchronisation point and by cudaGetLastError.
// Handles (streams, events, modules, kernels) and device addresses are chosen here, so creating
// them costs no round trip.
//
// Thread safety: every public method locks the core's mutex; the API may be called from any
// thread. A child process after fork() cannot use its parent's session: every call fails with
// kNotInitialized there, as CUDA fails after fork.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

#include "client_shim/library_client.h"
#include "client_shim/range_allocator.h"
#include "common/kernel_info.h"
#include "common/status.h"
#include "wire/call_client.h"

namespace hiber::shim {

// What the environment says (docs/shim.md lists the variables).
struct ShimConfig {
  bool batching = true;              // HIBER_BATCH (0 = every call is sent at once)
  uint32_t batch_calls = 64;         // HIBER_BATCH_CALLS: N
  uint64_t batch_bytes = 256 << 10;  // HIBER_BATCH_BYTES: B
  uint32_t quiet_us = 50;            // HIBER_BATCH_QUIET_US: T
  bool trace = false;                // HIBER_TRACE=1 (entry_support.h traces each call)
  // HIBER_STATS=1 or HIBER_TRACE=summary: at exit, one line on stderr with the calls, batches
  // and synchronous round trips the process made.
  bool stats = false;
  // HIBER_REPLY_TIMEOUT_MS: how long a synchronous call waits for hiberd's reply. Long: under
  // late binding a call may wait in hiberd's queue for a GPU, and a hiberd that dies closes the
  // socket, which ends the wait at once; only a hung hiberd meets this limit.
  uint64_t reply_timeout_ms = 600000;
  // HIBER_CONNECT_TIMEOUT_MS: the deadline for connecting to hiberd and for its answer to the
  // Hello. A wedged hiberd (its listen queue full, or silent after accepting) then fails the
  // first call with "no device" instead of hanging it. Not shorter: under load (many sessions
  // opening at once, sanitizers) hiberd's answer takes seconds.
  uint64_t connect_timeout_ms = 10000;
  static ShimConfig from_environment();
};

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

struct CaptureObj;

// A stream made by the client. Its address is the cudaStream_t / CUstream the program holds.
struct StreamObj {
  wire::StreamHandle wire;  // the session's handle; 0 is the legacy default stream
  unsigned flags = 0;       // cudaStreamNonBlocking = 1
  int priority = 0;
  bool blocking() const { return (flags & 1) == 0; }
  // Legacy default-stream semantics (kept by the core with internal events):
  bool has_unjoined_work = false;  // work since the legacy stream last waited for this one
  uint64_t legacy_generation_seen = 0;
  wire::EventHandle join_event;   // internal event recorded on this stream for the joins
  CaptureObj* capture = nullptr;  // the capture this stream's work goes into, while one is
};

struct EventObj {
  wire::EventHandle wire;
  unsigned flags = 0;  // cudaEventDisableTiming = 2
  // Recorded in a capture (its id): a stream that waits for it joins that capture.
  std::optional<uint64_t> captured_in;
};

struct ModuleObj;

// A stream-ordered memory pool (cudaMemPool_t / CUmemoryPool; its address is the handle): the
// device's default pool or one the program created. Its memory is segments of the function's
// memory, each a block in hiberd like a cudaMalloc's, sub-allocated here; a freed range stays in
// the pool for reuse and counts against the quota until the pool is trimmed (at a
// synchronisation when the pool holds more than its release threshold, by cudaMemPoolTrimTo, or
// when a cudaMalloc finds the quota short).
struct MemPoolObj {
  std::map<uint64_t, RangeAllocator> segments;  // segment start -> its sub-allocator
  uint64_t release_threshold = 0;               // cudaMemPoolAttrReleaseThreshold
  // The reuse policy as the program set it (cudaMemPoolReuse*). Reuse always follows the
  // frees' stream order through inserted waits, which orders more than CUDA may, never less.
  int reuse_follow_event_dependencies = 1;
  int reuse_allow_opportunistic = 1;
  int reuse_allow_internal_dependencies = 1;
  uint64_t reserved_bytes = 0, reserved_high = 0, used_bytes = 0, used_high = 0;
  // Per stream that freed into the pool: an event recorded after its latest free, and how many
  // frees it has recorded; per (allocating, freeing) stream, the count the allocating stream
  // has waited for. An allocation waits for the frees of every other stream it has not waited
  // for yet, so memory freed on one stream is reused on another only after the free.
  struct StreamFrees {
    wire::EventHandle event;
    uint64_t count = 0;
  };
  std::map<wire::StreamHandle, StreamFrees> frees;
  std::map<std::pair<wire::StreamHandle, wire::StreamHandle>, uint64_t> waited;
  bool destroyed = false;  // cudaMemPoolDestroy with allocations outstanding
};

// ---- Graphs (client_graphs.cc; docs/shim.md, "Graphs") ----

// The calls a graph may hold (server/session_graphs.cc keeps the same ones).
template <typename Call>
inline constexpr bool kGraphCall =
    std::is_same_v<Call, wire::calls::LaunchKernel> ||
    std::is_same_v<Call, wire::calls::MemcpyHtoD> ||
    std::is_same_v<Call, wire::calls::MemcpyDtoH> ||
    std::is_same_v<Call, wire::calls::MemcpyDtoD> || std::is_same_v<Call, wire::calls::Memset> ||
    std::is_same_v<Call, wire::calls::LibraryCall>;

// A call a graph node stands for, with the bytes its span points at (a kernel's parameters, a
// library call's arguments) owned here. Its stream is a placeholder: a launch names the stream.
struct RecordedCall {
  std::variant<std::monostate, wire::calls::LaunchKernel, wire::calls::MemcpyHtoD,
               wire::calls::MemcpyDtoH, wire::calls::MemcpyDtoD, wire::calls::Memset,
               wire::calls::LibraryCall>
      call;
  std::vector<std::byte> owned;
  RecordedCall() = default;
  template <typename Call>
  requires kGraphCall<Call>
  explicit RecordedCall(const Call& c) { set(c); }
  RecordedCall(const RecordedCall& other) { *this = other; }
  RecordedCall& operator=(const RecordedCall& other);
  template <typename Call>
  void set(const Call& c);
};

struct GraphObj;
struct KernelObj;
// A node (cudaGraphNode_t: its address): a call hiberd runs, a host function, or nothing.
struct GraphNodeObj {
  enum class Kind { kCall, kHost, kEmpty };
  Kind kind = Kind::kEmpty;
  GraphObj* graph = nullptr;
  RecordedCall call;
  KernelObj* kernel = nullptr;              // a kernel node's kernel
  std::function<void(const Status&)> host;  // a host node's function
  std::vector<GraphNodeObj*> dependencies;
};

// A graph (cudaGraph_t / CUgraph): captured from streams, or built node by node.
struct GraphObj {
  std::vector<std::unique_ptr<GraphNodeObj>> nodes;  // in creation order
};

// An executable graph (cudaGraphExec_t): the graph's nodes in an order that keeps every
// dependency, cut at host functions into pieces; each run of calls between them is a graph
// defined in hiberd once (graphBegin ... graphEnd), launched with one call.
struct GraphExecObj {
  std::vector<GraphNodeObj> nodes;                     // copies, in launch order
  std::unordered_map<const GraphNodeObj*, size_t> at;  // source node -> index in nodes
  struct Piece {
    size_t first = 0, count = 0;             // nodes[first, first + count)
    std::optional<wire::GraphHandle> graph;  // calls: the graph in hiberd
    bool host = false;                       // one host node
  };
  std::vector<Piece> pieces;
};

// A stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture): work on its streams goes
// into `graph` in submission order, each node after the one before (an order of the streams'
// work that keeps every dependency between them).
struct CaptureObj {
  uint64_t id = 0;
  int mode = 0;  // cudaStreamCaptureMode: 0 global, 1 thread-local, 2 relaxed
  std::thread::id thread;
  StreamObj* origin = nullptr;
  std::vector<StreamObj*> streams;  // the origin and the streams that joined it
  std::unique_ptr<GraphObj> graph;
  GraphNodeObj* last = nullptr;
  Status invalidated;  // the first call that could not be captured
};

// Client virtual memory management (cuMemCreate / cuMemMap). A physical allocation's contents
// are a block in hiberd at the address it is mapped at; unmapped, the block stays where it was
// (parked) until it is mapped again (at the same address: nothing moves; elsewhere: it is
// copied there) or released.
struct PhysicalObj {
  uint64_t bytes = 0;
  std::optional<uint64_t> mapped_at;  // mapped at this address now
  std::optional<uint64_t> block_at;   // its block in hiberd: mapped_at, or parked there
  // Handles the program holds (cuMemCreate, cuMemRetainAllocationHandle; cuMemRelease drops
  // one). At 0 the allocation is freed, once unmapped.
  int references = 1;
  bool own_segment = false;  // block_at is a segment of its own (moved out of a freed range)
};

// A kernel: a __global__ function registered by a fatbin, or one a program got from a module
// it loaded itself (cuModuleGetFunction). Its address is the cudaKernel_t / CUfunction.
struct KernelObj {
  ModuleObj* module = nullptr;
  std::string name;           // mangled
  wire::FunctionHandle wire;  // the session's function handle; 0 until first launch
  KernelInfo info;            // the parameter layout, known once `wire` is set
  // cudaFuncAttributeMaxDynamicSharedMemorySize as the program set it; std::nullopt: the
  // device's default per-block limit (48 KiB). Launches are checked against it, as CUDA does;
  // hiberd raises the real function's limit itself before a launch that needs more.
  std::optional<int> max_dynamic_shared;
  int preferred_carveout = -1;  // cudaFuncAttributePreferredSharedMemoryCarveout (a hint)
  int cache_config = 0;         // CUfunc_cache (a hint)
};

// A code image: a fatbin the program's binaries registered, or a module it loaded.
struct ModuleObj {
  std::vector<std::byte> image;  // owned copy (registered fatbins point into the binary)
  std::span<const std::byte> bytes;
  wire::ModuleHandle wire;         // the session's module handle; 0 until first needed
  std::vector<KernelInfo> parsed;  // kernels found in the image by the client, if it could
  bool parse_failed = false;
  std::vector<std::unique_ptr<KernelObj>> kernels;
};

enum class PointerKind { kDevice, kArena, kHost };

struct PointerInfo {
  PointerKind kind = PointerKind::kHost;
  bool pinned = false;        // cudaMallocHost / cudaHostAlloc / cudaHostRegister memory
  uint64_t arena_offset = 0;  // for kArena
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost, kDefault };

// The allocation a pointer lies in, for cuPointerGetAttribute(s), cuMemGetAddressRange and
// cudaPointerGetAttributes.
struct PointerRange {
  PointerKind kind = PointerKind::kHost;  // kDevice, or kArena / kHost for pinned host memory
  uint64_t start = 0;
  uint64_t bytes = 0;
};

struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

// What the session made in hiberd, by handle, kept so that a new session after a hiberd restart
// can be given the same (client_resume.cc; docs/shim.md, "When hiberd restarts"). Every call
// that creates or destroys one of these goes through the core, which notes it here.
struct SessionJournal {
  std::map<uint64_t, uint64_t> blocks;  // memAllocate: va -> bytes
  std::map<wire::StreamHandle, wire::calls::StreamCreate> streams;
  std::map<wire::EventHandle, wire::calls::EventCreate> events;
  std::map<wire::ModuleHandle, ModuleObj*> modules;
  std::map<wire::FunctionHandle, wire::calls::FunctionGet> functions;
  std::map<wire::LibraryHandle, wire::calls::LibraryHandleCreate> library_handles;
  // Library calls that leave state in hiberd (a cuDNN graph's definition), in order.
  struct LibraryState {
    wire::LibraryHandle handle;
    uint16_t op = 0;
    std::vector<std::byte> args;
  };
  std::vector<LibraryState> library_state;

  template <typename Call>
  void note(const Call& call);
};

class Client {
 public:
  // The process's client. The session opens on first use; if that fails, every call returns
  // the reason (logged once).
  static Client& get();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ShimConfig& config() const { return config_; }

  // The session, once open: kNoDevice (or hiberd's own reason) if it could not be.
  Status ready();
  const wire::SessionInfo* session();
  int device_count();

  // ---- Errors ----
  // The sticky error of asynchronous calls, collected without waiting; take clears it.
  Status peek_async_error();
  Status take_async_error();

  // ---- Device memory ----
  Result<uint64_t> malloc_device(uint64_t bytes);
  Status free_device(uint64_t address);
  MemoryInfo memory_info();
  // Attribute `attr` (a CUdevice_attribute, which cudaDeviceAttr mirrors) of a device the
  // session sees, from the handshake; 0 where unknown or for a device that does not exist.
  int device_attribute(int device, int attr);

  // ---- Stream-ordered allocation (client_pools.cc) ----
  Result<MemPoolObj*> mem_pool(const void* handle);
  // The device's default pool and its current pool (cudaDeviceGetMemPool, cudaDeviceSetMemPool).
  Result<MemPoolObj*> default_mem_pool(int device);
  Result<MemPoolObj*> current_mem_pool(int device);
  Status set_current_mem_pool(int device, MemPoolObj* pool);
  Result<MemPoolObj*> create_mem_pool();
  // Frees the pool's unused memory; one with allocations outstanding goes once they are freed.
  Status destroy_mem_pool(MemPoolObj* pool);
  // `pool` nullptr: the current pool of the device.
  Result<uint64_t> malloc_async(uint64_t bytes, MemPoolObj* pool, StreamObj* stream);
  Status free_async(uint64_t address, StreamObj* stream);
  // Frees unused segments until the pool reserves at most `keep_bytes` (cudaMemPoolTrimTo).
  Status trim_mem_pool(MemPoolObj* pool, uint64_t keep_bytes);
  // cudaMemPoolAttr / CUmemPool_attribute `attr` (the same values): reads into or sets from
  // `value` (an int for the reuse flags, a uint64_t for the rest).
  Status mem_pool_attribute(MemPoolObj* pool, int attr, void* value, bool set);

  // ---- Client virtual memory management (client_vmm.cc) ----
  // cuMemAddressReserve: `alignment` 0 or a power of two up to the granularity.
  Result<uint64_t> reserve_address(uint64_t bytes, uint64_t alignment);
  Status free_address(uint64_t address, uint64_t bytes);
  // cuMemCreate: counted against the quota at once. Its handle is the object's address.
  Result<PhysicalObj*> create_physical(uint64_t bytes);
  Result<PhysicalObj*> physical(uint64_t handle);
  Status release_physical(PhysicalObj* physical);
  // cuMemMap of the whole of `physical` (offset 0) at `address`, inside a reservation.
  Status map_physical(uint64_t address, uint64_t bytes, uint64_t offset, PhysicalObj* physical);
  // cuMemUnmap of whole mappings.
  Status unmap_range(uint64_t address, uint64_t bytes);
  // cuMemSetAccess / cuMemGetAccess: mapped ranges are read-write from the function's device.
  Status check_mapped(uint64_t address, uint64_t bytes, const char* what);
  // The physical allocation mapped at `address` (cuMemRetainAllocationHandle).
  Result<PhysicalObj*> physical_at(uint64_t address);
  uint64_t allocation_granularity();

  // ---- Graphs and stream capture (client_graphs.cc) ----
  // `mode`: cudaStreamCaptureMode. The legacy default stream cannot capture.
  Status begin_capture(StreamObj* stream, int mode);
  Result<GraphObj*> end_capture(StreamObj* stream);
  struct CaptureState {
    int status = 0;  // cudaStreamCaptureStatus: 0 none, 1 active, 2 invalidated
    uint64_t id = 0;
    GraphObj* graph = nullptr;
    GraphNodeObj* last = nullptr;
  };
  // Answered here, with no round trip (PyTorch asks often).
  Result<CaptureState> capture_state(StreamObj* stream);
  // The calling thread's capture mode (cudaThreadExchangeStreamCaptureMode).
  static int& thread_capture_mode();
  GraphObj* create_graph();
  Result<GraphObj*> graph(const void* handle);
  Status destroy_graph(GraphObj* graph);
  Result<GraphNodeObj*> graph_node(const void* handle);
  Result<GraphNodeObj*> add_kernel_node(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                        KernelObj* kernel, Dim3 grid, Dim3 block,
                                        uint32_t shared_bytes, void** args);
  Result<GraphNodeObj*> add_memcpy_node(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                        void* dst, const void* src, uint64_t bytes, CopyKind kind);
  Result<GraphNodeObj*> add_memset_node(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                        uint64_t dst, uint32_t value, int element_bytes,
                                        uint64_t count);
  Result<GraphNodeObj*> add_host_node(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                      std::function<void(const Status&)> run);
  Result<GraphNodeObj*> add_empty_node(GraphObj* graph, std::span<GraphNodeObj* const> after);
  // A kernel node's parameters, in the graph or (set_exec_kernel_params) in an executable
  // graph, whose later launches use them.
  Status set_kernel_params(GraphNodeObj* node, KernelObj* kernel, Dim3 grid, Dim3 block,
                           uint32_t shared_bytes, void** args);
  Status set_exec_kernel_params(GraphExecObj* exec, GraphNodeObj* node, KernelObj* kernel,
                                Dim3 grid, Dim3 block, uint32_t shared_bytes, void** args);
  Result<GraphExecObj*> instantiate(GraphObj* graph);
  Result<GraphExecObj*> graph_exec(const void* handle);
  Status destroy_graph_exec(GraphExecObj* exec);
  // cudaGraphExecUpdate: `graph` must have the nodes `exec` was made from, in kind and order.
  Status update_exec(GraphExecObj* exec, GraphObj* graph);
  Status launch_graph(GraphExecObj* exec, StreamObj* stream);

  // ---- Host memory ----
  Result<void*> malloc_host(uint64_t bytes);
  Status free_host(void* pointer);
  Status register_host(void* pointer, uint64_t bytes);
  Status unregister_host(void* pointer);
  PointerInfo classify(const void* pointer, uint64_t bytes = 1);
  // The device allocation or pinned host range holding `pointer`; std::nullopt for any other
  // address (pageable host memory, freed or foreign memory).
  std::optional<PointerRange> pointer_range(const void* pointer);

  // ---- Copies and memsets (stream nullptr = legacy default stream) ----
  Status memcpy(void* dst, const void* src, uint64_t bytes, CopyKind kind, StreamObj* stream,
                bool async);
  Status memset(uint64_t dst, uint32_t value, int element_bytes, uint64_t count, StreamObj* stream,
                bool async);

  // ---- Streams and events ----
  // Resolves a program's stream value: 0 and cudaStreamLegacy/PerThread (1, 2) are the default
  // stream (returned as nullptr); anything else must be a live stream or kInvalidHandle.
  Result<StreamObj*> stream(const void* handle);
  Result<StreamObj*> create_stream(unsigned flags, int priority);
  Status destroy_stream(StreamObj* stream);
  Status synchronize_stream(StreamObj* stream);
  Status query_stream(StreamObj* stream);
  Status wait_event(StreamObj* stream, EventObj* event);
  Result<EventObj*> event(const void* handle);
  Result<EventObj*> create_event(unsigned flags);
  Status destroy_event(EventObj* event);
  Status record_event(EventObj* event, StreamObj* stream);
  Status synchronize_event(EventObj* event);
  Status query_event(EventObj* event);
  Result<float> elapsed_ms(EventObj* start, EventObj* end);
  Status synchronize_device();
  // cudaDeviceReset: waits for the device, then frees every allocation, stream and event and
  // unloads every module (registered fatbins load again when next used). Pinned host memory
  // stays valid.
  Status reset_device();
  std::pair<int, int> stream_priority_range() const { return {0, -5}; }  // least, greatest

  // ---- Host functions in stream order (cudaLaunchHostFunc, cudaStreamAddCallback) ----
  // `run` runs on the client's host-call thread once all earlier work on `stream` is done; it
  // gets that work's status (an error of the stream's work, or of the session). Later work on
  // the stream (and, by the legacy default stream's rules, on the streams it orders) is held in
  // the client, blocking the thread that submits it, until `run` has returned; so nothing
  // submitted after the host function runs before it. Host functions run one at a time, in the
  // order they were submitted.
  using HostCall = std::function<void(const Status&)>;
  Status launch_host_function(StreamObj* stream, HostCall run);

  // ---- Code ----
  // Fatbins registered by binaries (__cudaRegisterFatBinary) and their kernels.
  Result<ModuleObj*> register_fatbin(const void* fatbin_wrapper);
  void unregister_fatbin(ModuleObj* module);
  void register_function(ModuleObj* module, const void* host_function, const char* name);
  // The kernel a host stub stands for; kInvalidDeviceFunction-like kNotFound if none.
  Result<KernelObj*> kernel_for_host_function(const void* host_function);
  Result<KernelObj*> kernel(const void* handle);
  // Modules a program loads itself (cuModuleLoadData).
  Result<ModuleObj*> load_module(std::span<const std::byte> image);
  Result<ModuleObj*> module(const void* handle);
  Status unload_module(ModuleObj* module);
  Result<KernelObj*> module_function(ModuleObj* module, const std::string& name);
  // The parameter layout (loads the module and resolves the kernel on first use).
  Result<const KernelInfo*> kernel_info(KernelObj* kernel);
  // Blocks of `block_size` threads with `dynamic_shared` bytes each that one multiprocessor of
  // `device` holds at once, from the device's limits (an upper bound: register and static
  // shared memory use are not known to the client).
  int max_active_blocks(int device, int block_size, uint64_t dynamic_shared);
  // `args[i]` points at parameter i, as cudaLaunchKernel's args.
  Status launch(KernelObj* kernel, Dim3 grid, Dim3 block, uint32_t shared_bytes, StreamObj* stream,
                void** args);

  // For __cudaPushCallConfiguration / __cudaPopCallConfiguration (per thread, nested).
  struct CallConfiguration {
    Dim3 grid, block;
    size_t shared_bytes = 0;
    void* stream = nullptr;
  };
  static std::vector<CallConfiguration>& call_configurations();

  // ---- Remoted libraries (client_shim/library_client.h) ----
  Result<LibraryHandleObj*> create_library_handle(library_ops::Library library);
  Status destroy_library_handle(LibraryHandleObj* handle);
  Result<LibraryHandleObj*> library_handle(const void* handle, library_ops::Library library);
  Status set_library_stream(LibraryHandleObj* handle, void* stream);
  Status library_call(LibraryHandleObj* handle, library_ops::LibraryOp op,
                      std::span<const std::byte> args);
  Status library_call_on(LibraryHandleObj* handle, void* stream, library_ops::LibraryOp op,
                         std::span<const std::byte> args);
  Result<std::vector<std::byte>> library_query(LibraryHandleObj* handle, library_ops::LibraryOp op,
                                               std::span<const std::byte> args);

  // Sends what is batched (for the flusher and for tests of the policy).
  Status flush();
  // At exit: flushes, and with HIBER_STATS reports what the session sent and waited for.
  void finish_at_exit();

 private:
  struct Slab {
    RangeAllocator space;
  };

  Client();
  ~Client();  // never runs: the client lives until the process ends (see get())

  Status ensure_open_locked();
  void reserve_grant_locked();
  // A segment of `size` bytes (whole granules) of the function's memory: an address range in the
  // grant and a block in hiberd, counted against the quota. `asked` and `what` are for errors.
  Result<uint64_t> allocate_segment_locked(uint64_t size, uint64_t asked, const char* what);
  Status release_segment_locked(uint64_t segment);
  Status free_device_locked(uint64_t address, const char* what);
  // Stream-ordered pools: returns a pool allocation (ordered: after the work on `stream`).
  Status free_to_pool_locked(uint64_t address, StreamObj* stream, bool ordered);
  // Frees empty segments of pools holding more than their release threshold (`all`: every
  // empty segment) after a queued device synchronisation; whether any was freed.
  bool trim_pools_locked(bool all);
  Status trim_pool_locked(MemPoolObj* pool, uint64_t keep_bytes);
  // cudaDeviceReset: every pool's memory goes; the pools stay, empty.
  Status reset_pools_locked();
  MemPoolObj* default_pool_locked();
  void open_locked();
  // Appends an asynchronous call and applies the flush policy. A call of a capturing stream is
  // recorded in its capture instead.
  template <typename Fill>
  Status enqueue_locked(Fill&& fill);
  // Capture: the capture `stream` records into, or nullptr.
  CaptureObj* capture_of_locked(wire::StreamHandle stream) const {
    if (capturing_.empty()) return nullptr;
    auto it = capturing_.find(stream);
    return it == capturing_.end() ? nullptr : it->second;
  }
  CaptureObj* capture_of_locked(const StreamObj* stream) const {
    return stream ? stream->capture : nullptr;
  }
  template <typename Call>
  Status capture_call_locked(CaptureObj& capture, const Call& call);
  Status add_captured_node_locked(CaptureObj& capture, std::unique_ptr<GraphNodeObj> node);
  // A call that cannot be captured on a capturing stream: the capture is invalidated, and the
  // call fails with cudaErrorStreamCaptureUnsupported.
  Status refuse_in_capture_locked(CaptureObj& capture, const char* what);
  // A "potentially unsafe" call (cudaMalloc, a synchronisation, ...) while a capture forbids
  // it (CUDA's capture modes): each such capture is invalidated and the call fails.
  Status check_unsafe_in_capture_locked(const char* what);
  void end_capture_of_streams_locked(CaptureObj& capture);
  Result<RecordedCall> kernel_call_locked(KernelObj* kernel, Dim3 grid, Dim3 block,
                                          uint32_t shared_bytes, void** args);
  GraphNodeObj* new_node_locked(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                GraphNodeObj::Kind kind);
  Status define_pieces_locked(GraphExecObj* exec);
  Status define_piece_locked(GraphExecObj* exec, GraphExecObj::Piece& piece);
  Status launch_host_function_locked(StreamObj* stream, HostCall run);
  // Checks a launch of `kernel` and packs its arguments into `params`.
  Status prepare_launch_locked(KernelObj* kernel, uint32_t shared_bytes, void** args,
                               std::vector<std::byte>* params);
  // A call whose reply the host waits for.
  template <typename Fill>
  Result<wire::CallResult> call_locked(Fill&& fill);
  Status sync_point_locked(Status call_status);
  void flusher_main();

  // Legacy default-stream ordering: called before work is added to `stream`.
  // Unless `hold_for_host_calls` is false, it first waits for pending host functions that the
  // work must follow (releasing the mutex meanwhile).
  Status order_for_work_locked(StreamObj* stream, bool hold_for_host_calls = true);
  wire::StreamHandle stream_wire(const StreamObj* stream) const {
    return stream ? stream->wire : wire::StreamHandle();
  }
  // A handle not yet used in the session, of any kind.
  template <typename Handle>
  Handle new_handle_locked() {
    return Handle(next_handle_++);
  }

  Status load_module_locked(ModuleObj* module);
  // Loads `module` under `handle` (a new one, or its own again after a restart).
  Status load_module_as_locked(ModuleObj* module, wire::ModuleHandle handle);

  // ---- After hiberd restarts (client_resume.cc) ----
  // The session is gone (hiberd died or restarted) when a call finds its socket closed. A
  // session with nothing in flight (every stream that got work has been synchronised since)
  // resumes at once, unseen by the program: it reconnects with the session's resume token,
  // gets its address range and its model blocks back, and replays the journal. Work in flight
  // is lost: the program gets one kDeviceUnavailable for it, at its next synchronisation (or
  // from the call that was waiting), and the calls after it run in the resumed session. When
  // the session cannot be resumed, every later call fails with why.
  // Called where work is about to be queued or waited for: notices a lost session while idle.
  Status check_session_locked();
  // `call` puts work on its stream (not a definition of session state): the stream is unsynced.
  template <typename Call>
  void note_gpu_work_locked(const Call& call);
  // Waits (without the lock) for the session's socket to hang up, then resumes the session.
  void watcher_main();
  // Waits for hiberd until `deadline` (default: HIBER_RESUME_TIMEOUT_MS from now).
  Status resume_locked(std::optional<std::chrono::steady_clock::time_point> deadline = {});
  Status reconnect_locked(std::chrono::steady_clock::time_point deadline);
  Status replay_locked(SessionJournal old);
  // The status a call that found the session gone (`why` is kDeinitialized) returns, noting the
  // loss; any other `why` as it is. `answer_lost`: the call waited for an answer, which is lost.
  Status lost_session_locked(const Status& why, bool answer_lost = false);
  Status resolve_kernel_locked(KernelObj* kernel);
  Status copy_to_device_locked(uint64_t dst, const void* src, uint64_t bytes, StreamObj* stream,
                               bool async);
  Status copy_from_device_locked(void* dst, uint64_t src, uint64_t bytes, StreamObj* stream,
                                 bool async);
  int attribute_locked(int device, int attr) const;
  Status check_device_range_locked(uint64_t address, uint64_t bytes, const char* what);
  PointerInfo classify_locked(const void* pointer, uint64_t bytes);
  // The live allocation holding `address` ({start, bytes asked for}), or nullptr.
  const std::pair<const uint64_t, uint64_t>* allocation_holding(uint64_t address) const;
  // The slab holding `address`, or slabs_.end().
  std::map<uint64_t, Slab>::iterator slab_holding(uint64_t address);
  Result<wire::EventHandle> create_wire_event_locked(bool disable_timing);
  // Host functions: waits (releasing mu_) until no host function that work on `stream` must
  // follow is pending; `all` waits for every pending one.
  void wait_host_calls_locked(const StreamObj* stream, bool all);
  bool host_calls_pending_locked(const StreamObj* stream, bool all) const;
  void host_caller_main();

  ShimConfig config_;
  std::mutex mu_;
  bool opened_ = false;
  // How the session was opened, for resuming it.
  wire::ClientOptions connect_options_;
  wire::CallClientOptions call_options_;
  SessionJournal journal_;
  // Streams (0: the legacy default stream) given work since their last synchronisation: what a
  // lost session loses.
  std::set<wire::StreamHandle> unsynced_streams_;
  bool session_lost_ = false;  // a call found hiberd gone; the next one resumes
  // Set by the watcher (without the lock) as soon as the socket hangs up: 1 + the
  // sessions_resumed_ of the session found gone (a resume since makes it stale).
  std::atomic<uint64_t> gone_session_{0};
  // When an idle call last asked the socket itself (check_session_locked).
  std::chrono::steady_clock::time_point last_socket_check_;
  uint64_t sessions_resumed_ = 0;  // also tells the watcher the channel it waits on is old
  Status resume_failed_;       // the session could not be resumed: every call fails with it
  bool forked_child_ = false;
  Status open_status_;
  std::unique_ptr<wire::CallClient> calls_;
  uint64_t next_handle_ = 1;
  std::vector<std::byte> launch_params_;  // scratch: a launch's packed parameters

  // Device memory: segments of whole granules in the grant, and small allocations packed into
  // one-granule slabs.
  RangeAllocator segments_;
  uint64_t quota_used_ = 0;
  std::map<uint64_t, Slab> slabs_;            // slab start -> its sub-allocator
  std::map<uint64_t, uint64_t> allocations_;  // start -> bytes asked for, every live one

  // Stream-ordered pools: the device's default pool (made on first use), the current one, the
  // ones the program created, and the pool of each live allocation from one.
  std::unique_ptr<MemPoolObj> default_pool_;
  MemPoolObj* current_pool_ = nullptr;
  std::unordered_map<const void*, std::unique_ptr<MemPoolObj>> pools_;  // created, live
  std::unordered_map<uint64_t, MemPoolObj*> pool_allocations_;
  bool pools_over_threshold_ = false;  // some pool may hold more than its release threshold

  // Graphs: captures in progress (and the streams recording into each), graphs and executable
  // graphs by handle.
  std::unordered_map<uint64_t, std::unique_ptr<CaptureObj>> captures_;  // by id
  std::unordered_map<wire::StreamHandle, CaptureObj*> capturing_;
  uint64_t next_capture_id_ = 0;
  std::unordered_map<const void*, std::unique_ptr<GraphObj>> graphs_;
  std::unordered_map<const void*, std::unique_ptr<GraphExecObj>> graph_execs_;
  std::unordered_map<const void*, GraphNodeObj*> graph_nodes_;  // of every live graph
  bool defining_graph_ = false;  // sending a graph's calls to hiberd: not captured again

  // Client virtual memory: reserved ranges (start -> bytes), physical allocations, and what is
  // mapped where (start -> the allocation; each mapping is also in allocations_).
  std::map<uint64_t, uint64_t> reservations_;
  std::unordered_map<uint64_t, std::unique_ptr<PhysicalObj>> physicals_;  // by handle
  std::map<uint64_t, PhysicalObj*> mappings_;
  // The reservation holding `address` ({start, bytes}), or nullptr.
  const std::pair<const uint64_t, uint64_t>* reservation_holding_locked(uint64_t address) const;
  // The mappings of one reservation back to back around `address`: a copy may span them.
  bool in_adjacent_mappings_locked(uint64_t address, uint64_t bytes) const;
  // Moves the block of a parked physical allocation out of [address, address + bytes).
  Status move_parked_out_locked(uint64_t address, uint64_t bytes);
  Status move_block_locked(PhysicalObj* physical, uint64_t to);

  // Host memory: the pinned heap in the arena, and other pinned ranges (registered, or
  // malloc'd when the heap is full), copied through staging like pageable memory.
  RangeAllocator arena_heap_;
  std::map<uint64_t, uint64_t> pinned_ranges_;  // start -> bytes
  std::map<uint64_t, uint64_t> host_allocs_;    // malloc'd cudaMallocHost fallbacks

  std::unordered_map<const void*, std::unique_ptr<StreamObj>> streams_;
  std::unordered_map<const void*, std::unique_ptr<EventObj>> events_;
  std::unordered_map<const void*, std::unique_ptr<ModuleObj>> modules_;
  std::unordered_map<const void*, KernelObj*> kernels_;         // every live kernel
  std::unordered_map<const void*, KernelObj*> host_functions_;  // host stub -> kernel
  std::unordered_map<const void*, std::unique_ptr<LibraryHandleObj>> library_handles_;
  uint64_t legacy_generation_ = 0;  // bumps with each piece of work on the legacy stream
  // A stream known to be idle: a synchronous reply showed all of its work done, and no call of
  // any kind has been enqueued since (enqueued_ unchanged). Synchronizing it again then needs no
  // round trip: the program's usual copy-back-then-synchronize costs one, not two.
  uint64_t enqueued_ = 0;  // asynchronous calls ever enqueued
  const StreamObj* idle_stream_ = nullptr;
  std::optional<uint64_t> idle_as_of_;  // enqueued_ when idle_stream_ was seen idle
  void note_idle_locked(const StreamObj* stream) {
    idle_stream_ = stream;
    idle_as_of_ = enqueued_;
    unsynced_streams_.erase(stream_wire(stream));
  }
  bool known_idle_locked(const StreamObj* stream) const {
    return idle_as_of_ == enqueued_ && idle_stream_ == stream && calls_->batched_calls() == 0;
  }
  wire::EventHandle legacy_join_event_;

  // Host functions waiting for their stream (host_caller_main runs them in order), and how many
  // are pending per stream (by the session's handle; 0 is the legacy default stream), counted
  // until each has returned.
  struct PendingHostCall {
    wire::StreamHandle stream;
    wire::EventHandle marker;  // recorded on the stream after the work the call follows
    HostCall run;
  };
  std::deque<PendingHostCall> host_calls_;
  std::unordered_map<wire::StreamHandle, int> host_calls_pending_;
  std::condition_variable_any host_calls_cv_;
  bool host_caller_started_ = false;
  std::thread::id host_caller_id_;

  // The background flusher.
  std::condition_variable flusher_cv_;
  std::chrono::steady_clock::time_point last_enqueue_;
  // When the flusher wakes next (max: not before it is notified).
  std::chrono::steady_clock::time_point flusher_wakes_at_ =
      std::chrono::steady_clock::time_point::max();
  bool stopping_ = false;
  std::thread flusher_;
};

template <typename Fill>
Status Client::enqueue_locked(Fill&& fill) {
  using Call = std::decay_t<Fill>;
  if constexpr (requires(const Call& c) { c.stream; }) {
    if (!defining_graph_) {
      if (CaptureObj* capture = capture_of_locked(fill.stream)) {
        return capture_call_locked(*capture, fill);
      }
    }
  }
  ++enqueued_;
  const bool was_empty = calls_->batched_calls() == 0;
  if constexpr (requires { Call::kWhere; }) {
    // A graph's calls being defined run only when it is launched.
    if (!defining_graph_) note_gpu_work_locked(fill);
    journal_.note(fill);
  }
  if (Status queued = calls_->enqueue(std::forward<Fill>(fill)); !queued.ok()) {
    return lost_session_locked(queued);
  }
  if (!config_.batching || calls_->batched_bytes() >= config_.batch_bytes) {
    return lost_session_locked(calls_->flush());
  }
  last_enqueue_ = std::chrono::steady_clock::now();
  if (was_empty && calls_->batched_calls() != 0 &&
      flusher_wakes_at_ > last_enqueue_ + std::chrono::microseconds(config_.quiet_us)) {
    flusher_cv_.notify_one();
  }
  return Status();
}

template <typename Call>
Status Client::capture_call_locked(CaptureObj& capture, const Call& call) {
  if constexpr (kGraphCall<Call>) {
    if (!capture.invalidated.ok()) return capture.invalidated;
    auto node = std::make_unique<GraphNodeObj>();
    node->kind = GraphNodeObj::Kind::kCall;
    node->call = RecordedCall(call);
    return add_captured_node_locked(capture, std::move(node));
  } else if constexpr (std::is_same_v<Call, wire::calls::EventRecord> ||
                       std::is_same_v<Call, wire::calls::StreamWaitEvent>) {
    // Orderings inside the capture: the graph's nodes follow one another already.
    return Status();
  } else {
    return refuse_in_capture_locked(capture, "this call");
  }
}

template <typename Call>
void RecordedCall::set(const Call& c) {
  Call copy = c;
  copy.stream = wire::StreamHandle();
  if constexpr (std::is_same_v<Call, wire::calls::LaunchKernel>) {
    owned.assign(c.params.begin(), c.params.end());
    copy.params = owned;
  } else if constexpr (std::is_same_v<Call, wire::calls::LibraryCall>) {
    owned.assign(c.args.begin(), c.args.end());
    copy.args = owned;
  }
  call = copy;
}

template <typename Fill>
Result<wire::CallResult> Client::call_locked(Fill&& fill) {
  using Call = std::decay_t<Fill>;
  HIBER_RETURN_IF_ERROR(check_session_locked());
  note_gpu_work_locked(fill);
  auto reply = calls_->call(fill);
  if (!reply.ok()) return lost_session_locked(reply.status(), /*answer_lost=*/true);
  // A reply shows the work before it on the stream done.
  if constexpr (std::is_same_v<Call, wire::calls::DeviceSynchronize>) {
    unsynced_streams_.clear();
  } else if constexpr (requires { fill.stream; }) {
    if constexpr (!std::is_same_v<Call, wire::calls::StreamQuery>) unsynced_streams_.erase(fill.stream);
  }
  return reply;
}

template <typename Call>
void Client::note_gpu_work_locked(const Call& call) {
  if constexpr (requires { Call::kWhere; }) {
    if constexpr (Call::kWhere == wire::Where::kGpu) {
      if constexpr (std::is_same_v<Call, wire::calls::LibraryCall>) {
        if (library_ops::defines_session_state(static_cast<library_ops::LibraryOp>(call.op))) {
          return;
        }
      }
      unsynced_streams_.insert(call.stream);
    }
  }
}

template <typename Call>
void SessionJournal::note(const Call& call) {
  if constexpr (std::is_same_v<Call, wire::calls::MemAllocate>) {
    blocks[call.va] = call.bytes;
  } else if constexpr (std::is_same_v<Call, wire::calls::MemFree>) {
    blocks.erase(call.va);
  } else if constexpr (std::is_same_v<Call, wire::calls::StreamCreate>) {
    streams[call.stream] = call;
  } else if constexpr (std::is_same_v<Call, wire::calls::StreamDestroy>) {
    streams.erase(call.stream);
  } else if constexpr (std::is_same_v<Call, wire::calls::EventCreate>) {
    events[call.event] = call;
  } else if constexpr (std::is_same_v<Call, wire::calls::EventDestroy>) {
    events.erase(call.event);
  } else if constexpr (std::is_same_v<Call, wire::calls::ModuleUnload>) {
    modules.erase(call.module);
    std::erase_if(functions, [&](const auto& f) { return f.second.module == call.module; });
  } else if constexpr (std::is_same_v<Call, wire::calls::FunctionGet>) {
    functions[call.function] = call;
  } else if constexpr (std::is_same_v<Call, wire::calls::LibraryHandleCreate>) {
    library_handles[call.handle] = call;
  } else if constexpr (std::is_same_v<Call, wire::calls::LibraryHandleDestroy>) {
    library_handles.erase(call.handle);
    std::erase_if(library_state, [&](const LibraryState& l) { return l.handle == call.handle; });
  } else if constexpr (std::is_same_v<Call, wire::calls::LibraryCall>) {
    if (library_ops::defines_session_state(static_cast<library_ops::LibraryOp>(call.op))) {
      library_state.push_back(
          LibraryState{call.handle, call.op, std::vector<std::byte>(call.args.begin(), call.args.end())});
    }
  }
}

// The size of a code image given only its start, as cuModuleLoadData gets it: a fatbin's
// header says it, an ELF file ends at its section header table, PTX text at its NUL.
uint64_t code_image_size(const void* image);

// The last error of the calling thread (cudaGetLastError), set by every failing runtime call.
int& thread_last_error();
// Its message: hiberd's reason (or the shim's), which the API's error code cannot carry.
std::string& thread_last_error_message();

}  // namespace hiber::shim
