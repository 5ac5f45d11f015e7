# What hiberd keeps of a session in its state directory (--state_dir) so that a restarted hiberd
# can resume it (server/session_store.h): one record per session, written atomically.
@0xb6f1e02c9a4d7e13;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("hiber::server::proto");

struct SessionRecord {
  version @0 :UInt32;       # 1
  tokenSha256 @1 :Data;     # the resume token's SHA-256 (the token itself is not kept)
  functionId @2 :Text;
  instance @3 :Text;
  vaBase @4 :UInt64;
  vaBytes @5 :UInt64;
  quotaBytes @6 :UInt64;
  stateful @7 :Bool;        # its blocks' contents lived on the GPU: it cannot be resumed
  blocks @8 :List(Block);   # the model blocks, each with its host copy
  savedAtUnixMs @9 :UInt64;

  struct Block {
    va @0 :UInt64;
    bytes @1 :UInt64;       # the block's bytes (its host copy holds exactly these)
    file @2 :Text;          # the repository file holding the copy (a name in repository/)
    offset @3 :UInt64;
    sha256 @4 :Data;        # of the copy's bytes
  }
}

# A function the router registered (control.capnp FunctionRegistration, as hiberd keeps it),
# so that a restarted hiberd knows it before its sessions resume: one file per function.
struct RegistrationRecord {
  version @0 :UInt32;       # 1
  functionId @1 :Text;
  sloNs @2 :Int64;
  tailPercentile @3 :Float64;
  quotaBytes @4 :UInt64;
  stateful @5 :Bool;
  hasHeavyHint @6 :Bool;
  heavyHint @7 :Bool;
  execHintNs @8 :Int64;
}
