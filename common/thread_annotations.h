// Clang's thread-safety attributes (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), so
// that "guarded by" is a checked fact rather than a comment: built with clang and
// -Wthread-safety, touching a GUARDED_BY member without its mutex is a compile-time warning.
// GCC has no such analysis, so there every macro expands to nothing.
//
// The standard library's std::mutex carries no attributes (libstdc++), so annotated code locks
// a hiber::Mutex (common/mutex.h) instead.
#pragma once

#if defined(__clang__)
#define HIBER_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define HIBER_THREAD_ANNOTATION_(x)
#endif

// A type that is a lock (a "capability"): CAPABILITY("mutex").
#define CAPABILITY(x) HIBER_THREAD_ANNOTATION_(capability(x))
// An RAII type that holds a capability for its lifetime.
#define SCOPED_CAPABILITY HIBER_THREAD_ANNOTATION_(scoped_lockable)

// A member read or written only with the given mutex held.
#define GUARDED_BY(x) HIBER_THREAD_ANNOTATION_(guarded_by(x))
// A pointer member whose pointee is read or written only with the given mutex held.
#define PT_GUARDED_BY(x) HIBER_THREAD_ANNOTATION_(pt_guarded_by(x))

// A function called with the given mutexes held (and returning with them held).
#define REQUIRES(...) HIBER_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) HIBER_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
// A function called without the given mutexes held (it takes them itself).
#define EXCLUDES(...) HIBER_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// A function that takes, or releases, the given mutexes (none named: `this`, for a lock type).
#define ACQUIRE(...) HIBER_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) HIBER_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
// The same for a reader's (shared) hold of a SharedMutex.
#define ACQUIRE_SHARED(...) HIBER_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) HIBER_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
// Releases whichever hold, exclusive or shared (a scoped lock's destructor).
#define RELEASE_GENERIC(...) HIBER_THREAD_ANNOTATION_(release_generic_capability(__VA_ARGS__))
// A function that takes the mutexes when it returns `result`.
#define TRY_ACQUIRE(...) HIBER_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))

// A function that returns a reference to the given mutex.
#define RETURN_CAPABILITY(x) HIBER_THREAD_ANNOTATION_(lock_returned(x))

// Turns the analysis off for one function, where it cannot follow the locking: say why.
#define NO_THREAD_SAFETY_ANALYSIS HIBER_THREAD_ANNOTATION_(no_thread_safety_analysis)
