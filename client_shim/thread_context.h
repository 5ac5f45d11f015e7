// One device state per thread, shared by the runtime and the driver front-ends as CUDA's are.
//
// The shim has one context per device, the device's primary context (cuCtxCreate hands it out
// too; docs/shim.md, "Contexts"). A thread's state is its driver context stack, whose top is the
// current context, and the runtime's device for when the stack is empty:
//   - cudaSetDevice(d) makes d's primary context current: it replaces the top of the stack (as
//     cuCtxSetCurrent does), or, on an empty stack, becomes the implicit one;
//   - the runtime's device (cudaGetDevice, and every runtime call that takes the current device)
//     is the current context's, so cuCtxSetCurrent, cuCtxPushCurrent and cuCtxPopCurrent move
//     the runtime too;
//   - with nothing pushed, the current context is the primary context of the runtime's device:
//     device 0's on a new thread, as CUDA's runtime binds on a thread's first call.
#pragma once

#include <cuda.h>

#include <atomic>
#include <vector>

namespace hiber::shim {

inline constexpr int kMaxDevices = 64;

struct PrimaryContext {
  std::atomic<unsigned> flags{0};  // cuDevicePrimaryCtxSetFlags / cuCtxCreate / cuCtxSetFlags
  std::atomic<int> created{0};     // cuCtxCreate calls not yet destroyed
};

// `device`'s primary context, 0 <= device < kMaxDevices (the caller checks the device).
CUcontext primary_context(int device);
// The primary context a handle names; nullptr for any other value.
PrimaryContext* as_primary(CUcontext context);
// The device whose primary context `context` is; `context` must be one (as_primary).
int device_of(CUcontext context);

// The calling thread's context stack, bottom first.
std::vector<CUcontext>& context_stack();
// cuCtxPushCurrent.
void push_context(CUcontext context);
// cuCtxPopCurrent: the top of the stack, removed; nullptr when it is empty.
CUcontext pop_context();
// cuCtxSetCurrent: `context` replaces the top (or becomes it); nullptr pops the top, leaving
// the implicit context of the runtime's device.
void set_current_context(CUcontext context);
// The calling thread's current context: the top of its stack, else its runtime device's.
CUcontext current_context();
// The device of current_context(): the runtime's current device.
int current_device();
// cudaSetDevice: `device`'s primary context becomes the thread's current context.
void set_current_device(int device);

}  // namespace hiber::shim
