// A session's client streams and events, and the device streams and events behind them on each
// GPU: a client handle names one object, which has a device object on each GPU where a lease put
// it to work, made on first use there.
//
// Also the session's own per-GPU streams: one for event synchronisation, one for the model's
// swap transfers. Every device stream and event of the table is made in the context the
// table's ContextSource names for its GPU (the session's instance context there).
//
// Thread safety: the session thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "server/device/device.h"
#include "server/record_time.h"
#include "wire/call_table.h"

namespace hiber::server {

// Checks that a client-chosen handle can name a new object: not zero (reserved), not in use,
// and the session under `limit` objects of that kind (`held` now). `call` names the call in
// errors.
Status check_new_handle(uint64_t handle, bool in_use, size_t held, size_t limit,
                        std::string_view call);
// The same for a new key of `table`.
template <typename Table>
Status check_new_handle(const Table& table, typename Table::key_type handle, size_t limit,
                        std::string_view call) {
  return check_new_handle(handle.value(), table.count(handle) != 0, table.size(), limit, call);
}

// A client stream: one device stream per GPU it has had work on.
struct ClientStream {
  int32_t priority = 0;
  std::vector<std::optional<device::Stream>> per_gpu;
  std::optional<int> last_gpu;  // where its latest work went
  Status drained_error;         // the first failure of work drained when a lease ended
};

// A client event: one device event per GPU it was recorded on.
struct ClientEvent {
  bool disable_timing = false;
  std::vector<std::optional<device::Event>> per_gpu;
  std::optional<int> last_gpu;  // where it was last recorded; none: never (complete)
  // With timing: when its latest record completed (shared with the device callbacks that stamp
  // it, which may outlive the event).
  std::shared_ptr<RecordTime> completed = std::make_shared<RecordTime>();
};

// The context the session's device objects on a GPU live in.
using ContextSource = std::function<Result<device::Context>(int gpu)>;

class HandleTable {
 public:
  // `device` must outlive the table. Without `contexts`, each GPU's shared context.
  HandleTable(device::Device& device, int gpu_count, ContextSource contexts = {});

  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;

  // The client's stream (handle 0: the default stream) or event; kInvalidHandle if it never
  // made it.
  Result<ClientStream*> stream(wire::StreamHandle handle);
  Result<ClientEvent*> event(wire::EventHandle handle);

  // New client objects, checked as check_new_handle() does.
  Status add_stream(wire::StreamHandle handle, int32_t priority);
  Status add_event(wire::EventHandle handle, bool disable_timing);
  // Forgets a client object and returns it, so the caller can retire its device objects. The
  // default stream cannot be removed.
  Result<ClientStream> remove_stream(wire::StreamHandle handle);
  Result<ClientEvent> remove_event(wire::EventHandle handle);

  // The device stream of a client stream on `gpu`, made on first use; `gpu` becomes where its
  // latest work went.
  Result<device::Stream> work_stream(wire::StreamHandle handle, int gpu);
  // The device event of a client event on `gpu`, made on first use.
  Result<device::Event> event_on(ClientEvent& event, int gpu);
  // The session's own streams on `gpu`, made on first use.
  Result<device::Stream> sync_stream(int gpu);
  Result<device::Stream> swap_stream(int gpu);

  // Every client stream, the default stream first.
  std::vector<ClientStream*> client_streams();
  // The session's own device streams (synchronisation, swaps), on every GPU.
  std::vector<device::Stream> own_streams() const;
  // Every device stream: the client streams' and the session's own.
  std::vector<device::Stream> all_streams() const;

  // Forgets the device streams and events on `gpu` without destroying them (their context was
  // reset, which ended them); client objects stay, and get new ones there when next used. A
  // client stream or event whose latest work was there has none pending now. REQUIRES: no work
  // is left on them.
  void forget_gpu(int gpu);

  // Destroys every device stream and event and forgets every client object. REQUIRES: no work
  // is left on them.
  void destroy_all();

 private:
  using PerGpuStreams = std::vector<std::optional<device::Stream>>;
  // per_gpu[gpu], created with `priority` if it does not exist yet.
  Result<device::Stream> device_stream(PerGpuStreams& per_gpu, int32_t priority, int gpu);

  Result<device::Context> context_on(int gpu) const;

  device::Device& device_;
  const int gpu_count_;
  const ContextSource contexts_;
  ClientStream default_stream_;  // the client's stream 0
  PerGpuStreams sync_streams_;   // per GPU: event synchronisation
  PerGpuStreams swap_streams_;   // per GPU: the model's transfers
  std::unordered_map<wire::StreamHandle, ClientStream> streams_;
  std::unordered_map<wire::EventHandle, ClientEvent> events_;
};

}  // namespace hiber::server
