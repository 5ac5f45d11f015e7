# hiberd's control socket: requests from the node router and operators (hiberctl).
# Each request is one framed message and gets one framed reply (docs/wire-format.md).
@0xb3a7c94e5f1d2a61;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("hiber::wire::proto");

using Handshake = import "handshake.capnp";

struct ControlRequest {
  version @0 :Handshake.ProtocolVersion;
  union {
    status @1 :Void;               # reply: status
    ping @2 :Void;                 # reply: pong (is hiberd alive and answering?)
  }
}

struct ControlReply {
  union {
    status @0 :NodeStatus;
    error @1 :Handshake.Rejection;
    pong @2 :Void;
  }
}

struct NodeStatus {
  serverVersion @0 :Handshake.ProtocolVersion;
  backend @1 :Text;                # "sim" or "cuda"
  nodeName @2 :Text;
  uptimeSeconds @3 :Float64;
  devices @4 :List(DeviceStatus);
  sessions @5 :List(SessionStatus);
  counters @6 :Counters;
}

struct DeviceStatus {
  ordinal @0 :UInt32;
  name @1 :Text;
  totalBytes @2 :UInt64;
  sessionBytes @3 :UInt64;         # device memory backing sessions' allocations
}

struct SessionStatus {
  id @0 :UInt64;
  functionId @1 :Text;
  pid @2 :Int32;
  uid @3 :UInt32;
  gpu @4 :UInt32;
  allocatedBytes @5 :UInt64;
  quotaBytes @6 :UInt64;
  batches @7 :UInt64;
  calls @8 :UInt64;
  failedCalls @9 :UInt64;
  connectedSeconds @10 :Float64;
}

struct Counters {
  sessionsOpened @0 :UInt64;
  sessionsClosed @1 :UInt64;
  handshakesRejected @2 :UInt64;
  malformedMessages @3 :UInt64;    # handshakes, batches and control requests we could not read
  controlRequests @4 :UInt64;
  # (1.1) The module cache (server/module_cache.h): code images loaded once for every session.
  cachedModules @5 :UInt64;        # images loaded now
  cachedModuleBytes @6 :UInt64;    # the size of those images
  moduleCacheHits @7 :UInt64;      # module loads served by an image already loaded
  moduleCacheMisses @8 :UInt64;    # module loads that loaded an image
  moduleCacheUnknownHashes @9 :UInt64;  # moduleLoadCached of a hash hiberd did not hold
}
