#!/usr/bin/env python3
"""A test-only function worker on the Python SDK: router_test_worker.cc's twin (see there for
what each content type does). router_function_sdk_test.cc drives it."""
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "router", "python"))

import hiber_function  # noqa: E402

_barrier = threading.Condition()
_arrived = 0


def handle(request):
    global _arrived
    if request.content_type == "application/x-test-error":
        return hiber_function.Error(request.text())
    if request.content_type == "application/x-test-throw":
        raise RuntimeError(request.text())
    if request.content_type == "application/x-test-client-error":
        raise hiber_function.ClientError(request.text(), 422)
    if request.content_type == "application/x-test-deadline":
        deadline = request.deadline_ms
        return hiber_function.Response("none" if deadline is None else str(int(deadline)),
                                       "text/plain")
    if request.content_type == "application/x-test-barrier":
        needed = int(request.text())
        with _barrier:
            _arrived += 1
            _barrier.notify_all()
            if not _barrier.wait_for(lambda: _arrived >= needed, timeout=60):
                return hiber_function.Error("barrier timed out")
        return hiber_function.Response(b"together", "text/plain")
    return hiber_function.Response(request.body, request.content_type,
                                   request.inference_header_bytes)


if __name__ == "__main__":
    sys.exit(hiber_function.serve(handle))
