# The handshake between a client (libhibercuda, or any program using wire/client_channel.h) and
# hiberd, over hiberd's Unix socket. Framing and limits are in docs/wire-format.md.
@0xd8e36a3138302802;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("hiber::wire::proto");

using Config = import "/common/node_config.capnp";

# Major: an incompatible change; the server refuses a client of another major.
# Minor: additions only (new calls, new fields). Both sides accept any minor of their major. A call
# the server does not know fails with CUDA_ERROR_NOT_SUPPORTED and a message naming it.
const protocolMajor :UInt16 = 1;
const protocolMinor :UInt16 = 13;  # 1.1: moduleLoadCached; 1.2: late-binding control calls;
                                  # 1.3: library handles, calls and queries (wire/library.h);
                                  # 1.4: control token (TCP), Started.link, metrics in NodeStatus;
                                  # 1.5: control token on the Unix socket, paged status;
                                  # 1.6: shed requests and lease preemptions in status;
                                  # 1.7: instances (Hello.instance, requestArrivedInstance)
                                  # 1.8: Grant.largestAllocation
                                  # 1.9: graphs (graphBegin/End/Launch/Destroy)
                                  # 1.10: cuDNN execute carries by-value tensors
                                  # 1.11: NodeStatus.incarnation
                                  # 1.12: resuming a session (Hello.resumeToken, Welcome.resume)
                                  # 1.13: requestBegin (control), Started.requestId

struct ProtocolVersion {
  major @0 :UInt16;
  minor @1 :UInt16;
}

# Client -> server: the first and only message the client sends on the socket. The socket then
# stays open, idle, as the session's lifeline: when it closes, the session ends.
struct Hello {
  version @0 :ProtocolVersion;
  functionId @1 :Text;             # the function this process serves
  authToken @2 :Data;              # the node's shared secret, compared in constant time
  requestedQuotaBytes @3 :UInt64;  # device memory wanted; 0 = the server's default
  # (1.7) Which instance of the function this process is: the key its launcher gave it
  # (HIBER_INSTANCE_ID; the router's worker number), printable, unique among the function's
  # connected instances. requestArrived names it so the right process gets the lease. "": none.
  instance @4 :Text;
  # (1.12) Resume the session this token names (a Welcome's resume.token from an earlier hiberd
  # on this node): the same address range, and the model blocks hiberd kept. Empty: a new session.
  resumeToken @5 :Text;
}

# Server -> client: the answer to Hello. A Welcome arrives with the channel's memfd attached
# (SCM_RIGHTS); a Rejection arrives alone and the server closes the socket.
struct HelloReply {
  union {
    welcome @0 :Welcome;
    rejected @1 :Rejection;
  }
}

struct Rejection {
  code @0 :UInt32;                 # a CUresult value (hiber::ErrorCode)
  message @1 :Text;
  serverVersion @2 :ProtocolVersion;
}

struct Welcome {
  version @0 :ProtocolVersion;     # the server's
  sessionId @1 :UInt64;
  grant @2 :Grant;
  channel @3 :ChannelLayout;       # how the attached memfd is laid out
  devices @4 :List(DeviceInfo);    # the devices the function sees
  node @5 :Config.NodeConfig;      # the physical node, for information
  resume @6 :Resume;               # (1.12)
}
# (1.12) How the session can come back after hiberd restarts, and what came back this time.
struct Resume {
  # The token a later Hello presents to resume this session; empty: hiberd keeps no state
  # (--state_dir=""), so a session cannot be resumed.
  token @0 :Text;
  resumed @1 :Bool;                # this Welcome answers a resumeToken: the session is back
  restored @2 :List(Range);        # the blocks hiberd brought back with their contents
}
struct Range {
  va @0 :UInt64;
  bytes @1 :UInt64;
}

# Device memory the function may use. The client places its allocations itself inside
# [vaBase, vaBase + vaBytes) and tells the server (memAllocate); allocations are rounded up to
# allocationGranularity, and their sum may not exceed quotaBytes.
struct Grant {
  vaBase @0 :UInt64;
  vaBytes @1 :UInt64;
  quotaBytes @2 :UInt64;
  allocationGranularity @3 :UInt64;
  # The largest single allocation the session can be served (its quota, and no more than the
  # smallest GPU's pool holds): a larger memAllocate cannot be, and the client refuses it at
  # once. 0: not told.
  largestAllocation @4 :UInt64;
}

struct ChannelLayout {
  memfdBytes @0 :UInt64;
  requestRingOffset @1 :UInt64;    # ring header; data follows one page later
  requestRingBytes @2 :UInt64;     # data capacity, a power of two
  completionRingOffset @3 :UInt64;
  completionRingBytes @4 :UInt64;
  arenaOffset @5 :UInt64;          # bulk data: copy payloads and the client's pinned memory
  arenaBytes @6 :UInt64;
  maxMessageBytes @7 :UInt64;      # largest message either side may send
}

struct DeviceInfo {
  ordinal @0 :UInt32;
  name @1 :Text;
  uuid @2 :Data;                   # 16 bytes
  pciBusId @3 :Text;
  totalMemoryBytes @4 :UInt64;
  attributes @5 :List(Int32);      # indexed by CUdevice_attribute; 0 where not known
}
