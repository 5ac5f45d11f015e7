#!/usr/bin/env python3
"""The no-op function in Python: answers each request's body unchanged, with its content type.

hiber-router starts it with HIBER_WORKER_SOCKET set (docs/router.md, "Workers"); the Python twin
of hiber-echo-worker (router/examples/echo_worker.cc).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hiber_function  # noqa: E402


def handle(request):
    return hiber_function.Response(request.body, request.content_type)


if __name__ == "__main__":
    sys.exit(hiber_function.serve(handle))
