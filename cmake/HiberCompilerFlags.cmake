# Warnings everywhere, and the sanitizer configurations CI runs.
#
# HIBER_SANITIZE selects instrumentation for the whole tree:
#   ""                 none (Release)
#   "address;undefined" AddressSanitizer + UndefinedBehaviorSanitizer (the CI suite)
#   "thread"           ThreadSanitizer (the threaded parts: wire, device, server)
set(HIBER_SANITIZE "" CACHE STRING "Sanitizers: empty, 'address;undefined' or 'thread'")

add_compile_options(-Wall -Wextra -Wno-missing-field-initializers)
if(HIBER_WERROR)
  add_compile_options(-Werror)
endif()

if(HIBER_SANITIZE)
  if("thread" IN_LIST HIBER_SANITIZE AND "address" IN_LIST HIBER_SANITIZE)
    message(FATAL_ERROR "HIBER_SANITIZE: thread and address cannot be combined")
  endif()
  list(JOIN HIBER_SANITIZE "," _hiber_san)
  add_compile_options(-fsanitize=${_hiber_san} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${_hiber_san})
  # Sanitized builds must not carry -O3 surprises; keep frames for reports.
  add_compile_options(-g)
endif()
