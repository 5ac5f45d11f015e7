# The call stream: batches of calls on the request ring, completions on the completion ring.
# Ring framing is in docs/wire-format.md.
@0xed29bd3b79246b5c;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("hiber::wire::proto");

# One message on the request ring. Calls execute in order; call i has sequence number
# firstSeq + i. A session's sequence numbers start at 1 and grow by one per call, with no gaps
# across batches.
struct Batch {
  firstSeq @0 :UInt64;
  calls @1 :List(Call);
}

# Handles (stream, event, module, function) are chosen by the client: any non-zero 64-bit value
# not already in use in the session. Stream 0 is the session's default stream. Device addresses
# are the client's own, inside its grant. Arena ranges are byte offsets into the arena.
#
# Staging: when the client copied data into the arena only for one call (a pageable source),
# it sets stagingEnd to its staging position just after that data. The server advances the
# channel's stagingReleased counter past it once the call no longer needs the bytes, so the client
# can reuse the space without waiting. stagingEnd = 0 means the range is client-owned (pinned
# memory) and the server never reports it.
struct Call {
  reply @0 :Bool;   # post a Completion even on success: the client waits for this call

  union {
    ping :group {                  # a round trip; the completion echoes value
      value @1 :UInt64;
    }
    memAllocate :group {           # back [va, va + bytes) with device memory
      va @2 :UInt64;
      bytes @3 :UInt64;
    }
    memFree :group {               # va of a memAllocate
      va @4 :UInt64;
    }
    memcpyHtoD :group {
      dst @5 :UInt64;
      srcOffset @6 :UInt64;
      bytes @7 :UInt64;
      stagingEnd @8 :UInt64;
      stream @9 :UInt64;
    }
    memcpyDtoH :group {
      dstOffset @10 :UInt64;
      src @11 :UInt64;
      bytes @12 :UInt64;
      stagingEnd @13 :UInt64;
      stream @14 :UInt64;
    }
    memcpyDtoD :group {
      dst @15 :UInt64;
      src @16 :UInt64;
      bytes @17 :UInt64;
      stream @18 :UInt64;
    }
    memset :group {                # count elements of elementBytes (1, 2 or 4) set to value
      dst @19 :UInt64;
      value @20 :UInt32;
      elementBytes @21 :UInt8;
      count @22 :UInt64;
      stream @23 :UInt64;
    }
    streamCreate :group {
      stream @24 :UInt64;
      priority @25 :Int32;         # lower is higher priority, as in CUDA
    }
    streamDestroy :group {
      stream @26 :UInt64;
    }
    streamSynchronize :group {     # completes when all earlier work on the stream has
      stream @27 :UInt64;
    }
    streamQuery :group {           # CUDA_ERROR_NOT_READY while work is pending
      stream @28 :UInt64;
    }
    streamWaitEvent :group {       # later work on stream waits for event's latest record
      stream @29 :UInt64;
      event @30 :UInt64;
    }
    eventCreate :group {
      event @31 :UInt64;
      disableTiming @32 :Bool;
    }
    eventDestroy :group {
      event @33 :UInt64;
    }
    eventRecord :group {
      event @34 :UInt64;
      stream @35 :UInt64;
    }
    eventSynchronize :group {
      event @36 :UInt64;
    }
    eventQuery :group {
      event @37 :UInt64;
    }
    eventElapsedTime :group {      # result: elapsedMs
      start @38 :UInt64;
      end @39 :UInt64;
    }
    deviceSynchronize @40 :Void;   # completes when all of the session's streams are idle
    moduleLoad :group {            # a fatbin, cubin or PTX image in the arena
      module @41 :UInt64;
      imageOffset @42 :UInt64;
      imageBytes @43 :UInt64;
      stagingEnd @44 :UInt64;
    }
    moduleUnload :group {
      module @45 :UInt64;
    }
    functionGet :group {           # result: kernel (the parameter layout)
      function @46 :UInt64;
      module @47 :UInt64;
      name @48 :Text;              # the mangled name
    }
    launchKernel :group {
      function @49 :UInt64;
      gridX @50 :UInt32;
      gridY @51 :UInt32;
      gridZ @52 :UInt32;
      blockX @53 :UInt32;
      blockY @54 :UInt32;
      blockZ @55 :UInt32;
      sharedMemBytes @56 :UInt32;
      stream @57 :UInt64;
      params @58 :Data;            # the packed parameter buffer, laid out as functionGet says
    }
    moduleLoadCached :group {      # (1.1) load the image hiberd already holds under this content
      module @59 :UInt64;          # hash, so a client ships each image at most once per node;
      sha256 @60 :Data;            # CUDA_ERROR_NOT_FOUND if hiberd holds none: send moduleLoad
    }
    libraryHandleCreate :group {   # (1.3) a cuBLAS/cuBLASLt (library 1) or cuDNN (2) handle
      handle @61 :UInt64;
      library @62 :UInt8;
    }
    libraryHandleDestroy :group {
      handle @63 :UInt64;
    }
    libraryCall :group {           # a library's compute call (wire/library.h), ordered on stream
      stream @64 :UInt64;
      handle @65 :UInt64;
      op @66 :UInt16;
      args @67 :Data;              # the operation's argument struct
    }
    libraryQuery :group {          # result: library (the answer's bytes)
      handle @68 :UInt64;
      op @69 :UInt16;
      args @70 :Data;
    }
    graphBegin :group {            # (1.9) the calls up to graphEnd define graph `graph` (a CUDA
      graph @71 :UInt64;           # graph the client captured or built): they are kept, not
    }                              # run. Only memcpyHtoD/DtoH (pinned: stagingEnd 0), memcpyDtoD,
    graphEnd :group {              # memset, launchKernel and libraryCall may be kept; any other
      graph @72 :UInt64;           # call fails, and so does the graphEnd.
    }
    graphLaunch :group {           # runs the graph's calls in order on `stream`, whatever stream
      stream @73 :UInt64;          # each named when it was kept
      graph @74 :UInt64;
    }
    graphDestroy :group {
      graph @75 :UInt64;
    }
  }
}

struct KernelParam {
  offset @0 :UInt32;
  bytes @1 :UInt32;
}

struct KernelInfo {
  name @0 :Text;
  params @1 :List(KernelParam);
}

# The server's answer for one call: every call with reply = true, and every call that failed.
# A failure of a call without reply is the session's sticky error: the client reports it at its
# next synchronisation point, with this code.
struct Completion {
  seq @0 :UInt64;
  code @1 :UInt32;                 # a CUresult value; 0 = success
  message @2 :Text;                # on failure: what failed and why
  result :union {
    none @3 :Void;
    ping @4 :UInt64;
    elapsedMs @5 :Float32;
    kernel @6 :KernelInfo;
    library @7 :Data;              # a libraryQuery's answer
  }
}

# One message on the completion ring.
struct ServerMessage {
  union {
    completions @0 :List(Completion);
    closing @1 :Closing;           # the server is ending the session; nothing follows
  }
}

struct Closing {
  code @0 :UInt32;
  message @1 :Text;
}
