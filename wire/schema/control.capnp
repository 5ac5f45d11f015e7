# hiberd's control socket: requests from the node router and operators (hiberctl).
# Each request is one framed message and gets one framed reply (docs/wire-format.md). Replies come
# in order; requestStart's and drain's replies wait until what they ask for has happened, so a
# caller with several requests in flight uses one connection per waiting request.
@0xb3a7c94e5f1d2a61;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("hiber::wire::proto");

using Handshake = import "handshake.capnp";

struct ControlRequest {
  version @0 :Handshake.ProtocolVersion;
  union {
    status @1 :Void;               # reply: status
    ping @2 :Void;                 # reply: pong (is hiberd alive and answering?)
    # (1.2) Late binding: the node router's calls (docs/hiberd.md, "Requests").
    registerFunction @3 :FunctionRegistration;  # reply: ok
    unregisterFunction @4 :Text;   # function id; reply: ok (refused while a request runs)
    requestArrived @5 :Text;       # function id; reply: accepted, with the request's id
    requestStart @6 :UInt64;       # request id; reply: started, once the model is resident or
                                   # streaming onto the GPU that runs the request
    requestDone @7 :RequestDone;   # reply: ok; the GPU is released once the function's work
                                   # on it has drained
    drain @8 :Drain;               # reply: ok, once nothing runs or waits (see Drain)
    # (1.13) requestArrived and requestStart in one round trip: function id (the instance in
    # requestArrivedInstance); reply: started, with the request's id, once it has its GPU. If it
    # fails, hiberd has ended the request itself: there is nothing to send requestDone for.
    requestBegin @13 :Text;
  }
  # (1.4) The control token (hiberd's --control_token_file). Required on every request, over TCP
  # (--control_tcp_listen) and (from 1.5) on the Unix socket too, whose peers must also have an
  # allowed uid. The functions' auth token is not a control token.
  token @9 :Text;
  # (1.5) status: a page of the functions list, for nodes with thousands of functions. The reply
  # lists at most statusFunctionLimit functions (0: all of them, as before 1.5) from the
  # statusFunctionOffset-th on, and says how many there are (NodeStatus.functionCount).
  statusFunctionOffset @10 :UInt64;
  statusFunctionLimit @11 :UInt32;
  # (1.7) requestArrived (and requestBegin): the instance that will serve the request (its
  # Hello's instance), when the function has several. "": any of them (the one with the fewest
  # open requests).
  requestArrivedInstance @12 :Text;
}

struct FunctionRegistration {
  functionId @0 :Text;             # what the function's processes send in their Hello
  sloMs @1 :Float64;               # deadline from arrival to done
  tailPercentile @2 :Float64;      # share of requests that must meet it, in (0, 1); 0 = 0.98
  quotaBytes @3 :UInt64;           # device memory the function may hold; 0 = hiberd's default
  stateful @4 :Bool;               # swap every block both ways (KV caches and the like)
  heavyHint @5 :Heaviness;         # until measurements exist (scheduler/heaviness.h)
  execMsHint @6 :Float64;          # expected execution time with the model resident; 0 = unknown
}

enum Heaviness {
  unknown @0;
  light @1;
  heavy @2;
}

struct RequestDone {
  requestId @0 :UInt64;
  failed @1 :Bool;                 # the function gave no answer (counts as a missed deadline)
}

struct Drain {
  # -1: the whole node: new arrivals are refused from now on, and the reply comes when no request
  # runs or waits. A GPU ordinal: that GPU takes no new requests and gives up its models; the
  # reply comes when its running request is done. `resume` undoes either.
  gpu @0 :Int32 = -1;
  resume @1 :Bool;
}

struct ControlReply {
  union {
    status @0 :NodeStatus;
    error @1 :Handshake.Rejection;  # its code is never 0 (success); readers refuse one that is
    pong @2 :Void;
    ok @3 :Void;                   # (1.2)
    accepted @4 :UInt64;           # (1.2) requestArrived: the request's id
    started @5 :Started;           # (1.2)
  }
}

struct Started {
  gpu @0 :UInt32;                  # the node's GPU that runs the request
  source @1 :Text;                 # where its model comes from: "resident", "peer" or "host"
  sourceGpu @2 :Int32;             # for "peer"; -1 otherwise
  rule @3 :Text;                   # which rule of the placement policy chose the GPU
  queuedMs @4 :Float64;            # from arrival to start
  link @5 :Text;                   # the link the model came over: "nvlink" or "pcie" (peer, by
                                   # the node's topology), "host" (host to GPU), "" (resident)
  requestId @6 :UInt64;            # (1.13) requestBegin: the request's id; 0 for requestStart
}

struct NodeStatus {
  serverVersion @0 :Handshake.ProtocolVersion;
  backend @1 :Text;                # "sim" or "cuda"
  nodeName @2 :Text;
  uptimeSeconds @3 :Float64;
  devices @4 :List(DeviceStatus);
  sessions @5 :List(SessionStatus);
  counters @6 :Counters;
  # (1.2) Late binding.
  functions @7 :List(FunctionStatus);
  scheduler @8 :SchedulerStatus;
  # Metrics (hiberd's /metrics maps this report; docs/hiberd.md, "Metrics").
  swapsByLink @9 :List(LinkSwaps);  # finished swaps, by the link they came over
  swapDuration @10 :Histogram;     # seconds per finished swap, first copy to last group done
  # (1.5) `functions` is a page: the functionOffset-th to the functionOffset+len-th of
  # functionCount functions in all (0 from a hiberd before 1.5, which lists every one).
  functionCount @11 :UInt64;
  functionOffset @12 :UInt64;
  # (1.11) A random number drawn at each start of hiberd (never 0; 0 from a hiberd before 1.11):
  # a status with another one than the last comes from a hiberd that restarted and forgot every
  # registration.
  incarnation @13 :UInt64;
  # (1.12) Instance keys of clients whose session this hiberd could not resume (kept at most
  # 1024, the latest): their processes cannot use the GPU any more, and a router replaces them.
  refusedResumes @14 :List(Text);
}

# Counts of observations in buckets, as Prometheus histograms have them.
struct Histogram {
  upperBounds @0 :List(Float64);   # ascending; a last bucket (+Inf) follows
  counts @1 :List(UInt64);         # per bucket, not cumulative: one more than upperBounds
  sum @2 :Float64;
  count @3 :UInt64;
}

struct LinkSwaps {
  link @0 :Text;                   # "nvlink", "pcie" (peer copies) or "host" (host to GPU)
  swaps @1 :UInt64;
  bytes @2 :UInt64;
}

struct ReasonCount {
  reason @0 :Text;
  count @1 :UInt64;
}

struct DeviceStatus {
  ordinal @0 :UInt32;
  name @1 :Text;
  totalBytes @2 :UInt64;
  sessionBytes @3 :UInt64;         # device memory backing sessions' blocks on this GPU
  # (1.2) The GPU's executor and its pool.
  healthy @4 :Bool;
  drained @5 :Bool;
  runningFunction @6 :Text;        # empty when idle
  poolBytes @7 :UInt64;            # reserved at start
  poolAllocatedBytes @8 :UInt64;
  poolLargestFreeBytes @9 :UInt64;
  poolFragmentation @10 :Float64;  # 1 - largest free block / free bytes
  swapsIn @11 :UInt64;             # models brought here (host or peer)
  swapInBytes @12 :UInt64;
  evictions @13 :UInt64;
  swapInSeconds @14 :Float64;      # time those swaps took, first copy to last group done
  # Evictions from this GPU by why: "placement" (room for a model placed here), "memory"
  # (a running function needed more than was free), "drain" (the GPU was drained).
  evictionsByReason @15 :List(ReasonCount);
}

struct SessionStatus {
  id @0 :UInt64;
  functionId @1 :Text;
  pid @2 :Int32;
  uid @3 :UInt32;
  gpu @4 :UInt32;                  # (before 1.2) the GPU it was bound to; now = boundGpu, or 0
  allocatedBytes @5 :UInt64;
  quotaBytes @6 :UInt64;
  batches @7 :UInt64;
  calls @8 :UInt64;
  failedCalls @9 :UInt64;
  connectedSeconds @10 :Float64;
  boundGpu @11 :Int32;             # (1.2) the GPU its calls execute on now; -1 between requests
  instance @12 :Text;              # (1.7) its Hello's instance key; "" when it gave none
}

struct FunctionStatus {
  functionId @0 :Text;
  registered @1 :Bool;             # by the router (false: a process that connected on its own)
  stateful @2 :Bool;
  heavy @3 :Bool;
  modelBytes @4 :UInt64;           # 0 until its first request fixed the model
  hostCopyBytes @5 :UInt64;        # in the pinned host pool
  residentGpus @6 :List(UInt32);
  requests @7 :UInt64;
  onTime @8 :UInt64;
  rrc @9 :Float64;
  instances @10 :UInt32;           # (1.7) connected instances (sessions) of the function
}

struct SchedulerStatus {
  placement @0 :Text;
  eviction @1 :Text;
  queue @2 :Text;
  queued @3 :UInt64;
  arrivals @4 :UInt64;
  completed @5 :UInt64;
  onTime @6 :UInt64;
  residentStarts @7 :UInt64;
  peerSwaps @8 :UInt64;
  hostSwaps @9 :UInt64;
  evictions @10 :UInt64;
  swapGroupBytes @11 :UInt64;      # the elbow hiberd measured (or loaded) for its swaps
  hostPoolBytes @12 :UInt64;
  hostPoolUsedBytes @13 :UInt64;
  drainingNode @14 :Bool;
  background @15 :UInt64;          # background requests (implicit leases: a function's GPU calls
                                   # outside any request); in the starts, not in arrivals
  # (1.6) What the scheduler did to requests (0 from a hiberd before 1.6).
  shed @16 :UInt64;                # requests answered "overloaded" (--shed), never started; in
                                   # arrivals, not in completed
  preemptions @17 :UInt64;         # background leases ended at their slice (--lease_slice_ms)
                                   # because another function waited for the GPU
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
  # Remoted calls: every session's, those that ended included.
  remotedCalls @10 :UInt64;        # calls executed or failed
  remotedBatches @11 :UInt64;      # batches (messages of calls) received
  batchSize @12 :Histogram;        # calls per batch
}
