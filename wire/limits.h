// Sizes and limits of the wire. Every limit protects hiberd from a client (docs/wire-format.md).
#pragma once

#include <cstdint>

namespace hiber::wire {

// A handshake or control frame on a socket: 4-byte little-endian length, then a capnp message.
inline constexpr uint32_t kMaxFrameBytes = 64 * 1024;
// A control reply from hiberd (status lists every session); read only by trusted tools.
inline constexpr uint32_t kMaxControlReplyBytes = 16 << 20;

// Cap'n Proto reader limits for anything a peer sent. The traversal limit is per message and
// counted in words read; a message is never read more than a few times over.
inline constexpr uint64_t kTraversalLimitFactor = 4;
inline constexpr int kNestingLimit = 16;

// Segments in one message (as capnp's own stream reader allows). Our builders use one or a few.
inline constexpr uint32_t kMaxSegments = 512;

// The largest max_message_bytes a channel may have: a fragmented message is reassembled in
// memory, so this bounds what one session can make the server allocate.
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 30;

// Calls in one batch. Bounds the server's work per message and the client's builder memory.
inline constexpr uint32_t kMaxCallsPerBatch = 4096;

// Kernel parameters, in bytes (CUDA 12.1+ allows 32764 bytes of parameters).
inline constexpr uint32_t kMaxKernelParamBytes = 32764;

// Kernel and module names.
inline constexpr uint32_t kMaxNameBytes = 4096;

// Devices in a Welcome, and attributes per device (CUdevice_attribute has under 200 values).
inline constexpr uint32_t kMaxDevices = 64;
inline constexpr uint32_t kMaxDeviceAttributes = 1024;

// Function identity and auth token in the handshake.
inline constexpr uint32_t kMaxFunctionIdBytes = 256;
inline constexpr uint32_t kMaxAuthTokenBytes = 256;
// An instance key (Hello.instance, requestArrivedInstance).
inline constexpr uint32_t kMaxInstanceKeyBytes = 64;
// A resume token (Hello.resumeToken, Welcome.resume.token): 32 hex digits from hiberd.
inline constexpr uint32_t kMaxResumeTokenBytes = 64;
// Blocks a resumed session's Welcome lists as restored.
inline constexpr uint32_t kMaxRestoredBlocks = 1u << 16;

// Ring sizes are powers of two in [kMinRingBytes, kMaxRingBytes].
inline constexpr uint64_t kMinRingBytes = 4096;
inline constexpr uint64_t kMaxRingBytes = uint64_t{1} << 30;

// The arena holds copy payloads and the client's pinned memory.
inline constexpr uint64_t kMaxArenaBytes = uint64_t{1} << 40;

// Every region of the channel memfd starts on a page.
inline constexpr uint64_t kPageBytes = 4096;

}  // namespace hiber::wire
