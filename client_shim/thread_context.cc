#include "client_shim/thread_context.h"

namespace hiber::shim {
namespace {

PrimaryContext primary_contexts[kMaxDevices];

struct ThreadState {
  std::vector<CUcontext> stack;
  int runtime_device = 0;  // cudaSetDevice's; the current device while the stack is empty
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

}  // namespace

CUcontext primary_context(int device) {
  return reinterpret_cast<CUcontext>(&primary_contexts[device]);
}

PrimaryContext* as_primary(CUcontext context) {
  auto* primary = reinterpret_cast<PrimaryContext*>(context);
  if (primary < primary_contexts || primary >= primary_contexts + kMaxDevices) return nullptr;
  return primary;
}

int device_of(CUcontext context) {
  return static_cast<int>(as_primary(context) - primary_contexts);
}

std::vector<CUcontext>& context_stack() { return thread_state().stack; }

void push_context(CUcontext context) { thread_state().stack.push_back(context); }

CUcontext pop_context() {
  std::vector<CUcontext>& stack = thread_state().stack;
  if (stack.empty()) return nullptr;
  const CUcontext top = stack.back();
  stack.pop_back();
  return top;
}

void set_current_context(CUcontext context) {
  std::vector<CUcontext>& stack = thread_state().stack;
  if (context == nullptr) {
    if (!stack.empty()) stack.pop_back();
  } else if (stack.empty()) {
    stack.push_back(context);
  } else {
    stack.back() = context;
  }
}

CUcontext current_context() {
  const ThreadState& state = thread_state();
  return state.stack.empty() ? primary_context(state.runtime_device) : state.stack.back();
}

int current_device() { return device_of(current_context()); }

void set_current_device(int device) {
  ThreadState& state = thread_state();
  state.runtime_device = device;
  if (!state.stack.empty()) state.stack.back() = primary_context(device);
}

}  // namespace hiber::shim
