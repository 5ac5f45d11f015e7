"""hiber_function: the Python function SDK, the worker side of hiber-router's worker protocol.

Standard library only; Python 3.9 or newer. See docs/router.md, "Workers".

    import sys
    import hiber_function

    def handle(request):
        inputs = request.json()["inputs"]          # a KServe v2 JSON request
        return {"outputs": [...]}                  # sent as application/json

    sys.exit(hiber_function.serve(handle))

A handler gets a Request and returns the answer:
    bytes (or bytearray, memoryview)   application/octet-stream
    str                                text/plain; charset=utf-8
    dict or list                       application/json (json.dumps)
    Response(body, content_type)       as given
    Error(message)                     an error: hiber-router answers 500 with the message
    ClientError(message, status=400)   the client's mistake: hiber-router answers status
                                       (400..499) with the message, counted as rejected
An exception the handler raises is an error with its message too (a ClientError raised is the
client's mistake); the worker keeps serving. A request in the binary tensor data extension has
inference_header_bytes set: its body's first bytes are the JSON (request.json() reads them).
"""

import json
import os
import socket
import struct
import sys
import threading
import time
from collections import deque

__all__ = ["Request", "Response", "Error", "ClientError", "serve", "encode_frame", "read_frame",
           "ProtocolError", "MAX_HEADER_BYTES", "MAX_BODY_BYTES"]

PROTOCOL = 1
MAX_HEADER_BYTES = 64 << 10
MAX_BODY_BYTES = 1 << 30
MAX_CONCURRENCY = 4096
# Error messages are cut to this, so a result header stays far below MAX_HEADER_BYTES.
_MAX_ERROR_CHARS = 16 << 10
_PREFIX = struct.Struct("<IQ")  # header bytes, body bytes

_EXIT_ENVIRONMENT = 2
_EXIT_PROTOCOL = 3
# An attaching worker retries after 0.1 s, 0.2 s, ... up to 5 s; a connection that lasted 1 s was
# accepted, and the next retry starts from the shortest wait again.
_MIN_ATTACH_BACKOFF = 0.1
_MAX_ATTACH_BACKOFF = 5.0
_ACCEPTED_CONNECTION_S = 1.0


class ProtocolError(Exception):
    """A frame that breaks the worker protocol; the connection is unusable."""


class Request:
    """One invocation: id, content_type, body (bytes), deadline_ms (ms left, or None) and
    inference_header_bytes (the JSON's length in a binary tensor data request, or None)."""

    __slots__ = ("id", "content_type", "body", "deadline_ms", "inference_header_bytes")

    def __init__(self, id, content_type, body, deadline_ms=None, inference_header_bytes=None):
        self.id = id
        self.content_type = content_type
        self.body = body
        self.deadline_ms = deadline_ms
        self.inference_header_bytes = inference_header_bytes

    def json(self):
        """The body parsed as JSON (a KServe v2 request when content_type is application/json);
        of a binary tensor data request, its JSON part."""
        if self.inference_header_bytes is not None:
            return json.loads(self.body[:self.inference_header_bytes])
        return json.loads(self.body)

    def binary_data(self):
        """The bytes after the JSON of a binary tensor data request (b"" otherwise)."""
        if self.inference_header_bytes is None:
            return b""
        return self.body[self.inference_header_bytes:]

    def text(self):
        return self.body.decode("utf-8")

    def __repr__(self):
        return "Request(id=%r, content_type=%r, %d bytes, deadline_ms=%r)" % (
            self.id, self.content_type, len(self.body), self.deadline_ms)


class Response:
    """An answer with an explicit content type; a str body is sent as UTF-8. With
    inference_header_bytes, an answer in the binary tensor data extension: the body's first
    bytes are its JSON (hiber-router sends the Inference-Header-Content-Length header)."""

    __slots__ = ("body", "content_type", "inference_header_bytes")

    def __init__(self, body, content_type="application/octet-stream",
                 inference_header_bytes=None):
        self.body = body
        self.content_type = content_type
        self.inference_header_bytes = inference_header_bytes


class Error:
    """A handler's error answer: hiber-router answers 500 with the message."""

    __slots__ = ("message",)

    def __init__(self, message):
        self.message = str(message)


class ClientError(Exception):
    """The request is the client's mistake: hiber-router answers status (400..499) with the
    message and counts it as rejected, not as the function's failure. Return it or raise it."""

    def __init__(self, message, status=400):
        super().__init__(str(message))
        self.message = str(message)
        self.status = status if isinstance(status, int) and 400 <= status < 500 else 400


def encode_frame(header, body=b""):
    """u32 LE header length | u64 LE body length | header JSON | body."""
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return _PREFIX.pack(len(text), len(body)) + text + bytes(body)


def _read_exactly(stream, count, what):
    data = stream.read(count)
    if data is None or len(data) != count:
        raise ProtocolError("the connection ended inside a frame's %s" % what)
    return data


def read_frame(stream):
    """The next (header, body) from a binary stream, or None at a clean end of stream."""
    prefix = stream.read(_PREFIX.size)
    if not prefix:
        return None
    if len(prefix) != _PREFIX.size:
        raise ProtocolError("the connection ended inside a frame's length prefix")
    header_bytes, body_bytes = _PREFIX.unpack(prefix)
    if header_bytes == 0 or header_bytes > MAX_HEADER_BYTES:
        raise ProtocolError("a frame header of %d bytes (must be 1 to %d)"
                            % (header_bytes, MAX_HEADER_BYTES))
    if body_bytes > MAX_BODY_BYTES:
        raise ProtocolError("a frame body of %d bytes (at most %d)" % (body_bytes, MAX_BODY_BYTES))
    text = _read_exactly(stream, header_bytes, "header")
    try:
        header = json.loads(text)
    except ValueError:
        raise ProtocolError("a frame header that is not valid JSON") from None
    if not isinstance(header, dict):
        raise ProtocolError("a frame header that is JSON but not an object")
    body = _read_exactly(stream, body_bytes, "body") if body_bytes else b""
    return header, body


def _parse_invoke(header, body):
    if header.get("type") != "invoke":
        raise ProtocolError("expected an invoke frame, got the header %s" % json.dumps(header))
    request_id = header.get("id")
    if not isinstance(request_id, str):
        raise ProtocolError("an invoke without a string id")
    content_type = header.get("content_type")
    if content_type is None:
        content_type = "application/octet-stream"
    elif not isinstance(content_type, str):
        raise ProtocolError("invoke %s: content_type is not a string" % request_id)
    deadline_ms = header.get("deadline_ms")
    if deadline_ms is not None and (isinstance(deadline_ms, bool)
                                    or not isinstance(deadline_ms, (int, float))):
        raise ProtocolError("invoke %s: deadline_ms is not a number" % request_id)
    header_bytes = header.get("inference_header_bytes")
    if header_bytes is not None and (isinstance(header_bytes, bool)
                                     or not isinstance(header_bytes, int)
                                     or not 0 <= header_bytes <= len(body)):
        raise ProtocolError("invoke %s: inference_header_bytes is not a byte count within the "
                            "body" % request_id)
    return Request(request_id, content_type, body, deadline_ms, header_bytes)


def _error_frame(request_id, message, status=None):
    header = {"type": "result", "id": request_id, "ok": False, "error": message[:_MAX_ERROR_CHARS]}
    if status is not None:
        header["status"] = status
    return encode_frame(header)


def _result_frame(request_id, answer):
    if isinstance(answer, Error):
        return _error_frame(request_id, answer.message)
    if isinstance(answer, ClientError):
        return _error_frame(request_id, answer.message, answer.status)
    header_bytes = None
    if isinstance(answer, Response):
        content_type, body = answer.content_type, answer.body
        header_bytes = answer.inference_header_bytes
    elif isinstance(answer, (bytes, bytearray, memoryview)):
        content_type, body = "application/octet-stream", answer
    elif isinstance(answer, str):
        content_type, body = "text/plain; charset=utf-8", answer
    elif isinstance(answer, (dict, list)):
        content_type, body = "application/json", json.dumps(answer, separators=(",", ":"))
    else:
        return _error_frame(request_id, "the handler returned a %s, not bytes, str, dict, list, "
                            "Response, Error or ClientError" % type(answer).__name__)
    if isinstance(body, str):
        body = body.encode("utf-8")
    body = bytes(body)
    if len(body) > MAX_BODY_BYTES:
        return _error_frame(request_id, "the answer of %d bytes is larger than the protocol's "
                            "limit of %d" % (len(body), MAX_BODY_BYTES))
    header = {"type": "result", "id": request_id, "ok": True, "content_type": str(content_type)}
    if header_bytes is not None:
        if isinstance(header_bytes, bool) or not isinstance(header_bytes, int) \
                or not 0 <= header_bytes <= len(body):
            return _error_frame(request_id, "the answer's inference_header_bytes is not a byte "
                                "count within its body")
        header["inference_header_bytes"] = header_bytes
    return encode_frame(header, body)


class _Connection:
    """The socket to the router: one reader (serve's loop), writers from any thread."""

    def __init__(self, sock):
        self.sock = sock
        self._write_lock = threading.Lock()
        self.write_error = None

    def send(self, frame):
        with self._write_lock:
            if self.write_error is not None:
                return
            try:
                self.sock.sendall(frame)
            except OSError as e:
                self.write_error = e
                # Wakes serve's reading loop, which then ends.
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _answer(connection, handler, request):
    try:
        answer = handler(request)
    except ClientError as e:
        answer = e
    except Exception as e:  # noqa: BLE001 - any handler failure is the request's error
        answer = Error("the handler raised %s: %s" % (type(e).__name__, e))
    connection.send(_result_frame(request.id, answer))


class _Pool:
    """The threads that run requests when HIBER_CONCURRENCY > 1."""

    def __init__(self, size, connection, handler):
        self._queue = deque()
        self._ready = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, args=(connection, handler),
                                          name="hiber-worker-%d" % i, daemon=True)
                         for i in range(size)]
        for thread in self._threads:
            thread.start()

    def _run(self, connection, handler):
        while True:
            with self._ready:
                while not self._stopping and not self._queue:
                    self._ready.wait()
                if self._stopping:
                    return  # queued requests are dropped: nobody can take the answers
                request = self._queue.popleft()
            _answer(connection, handler, request)

    def push(self, request):
        with self._ready:
            self._queue.append(request)
            self._ready.notify()

    def stop(self):
        """Lets running handlers finish, then joins every thread."""
        with self._ready:
            self._stopping = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()


def _complain(message):
    sys.stderr.write("hiber function worker: %s\n" % message)
    sys.stderr.flush()


def _concurrency():
    text = os.environ.get("HIBER_CONCURRENCY", "")
    if not text:
        return 1
    try:
        value = int(text, 10)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CONCURRENCY:
        _complain('HIBER_CONCURRENCY="%s" is not an integer in [1, %d]' % (text, MAX_CONCURRENCY))
        return 0
    return value


def _open_hiber_session():
    """With Hiber's client libraries preloaded, initialises CUDA through them.

    That opens the function's session in hiberd, which places a function's requests only once it
    has an instance; the router sends requests as soon as the worker says hello. hiberd fixes a
    function's model at its first request, so what the program did on the GPU before serving
    (loading its weights) must have reached hiberd first: the shim batches calls, so this waits
    for them (cuCtxSynchronize). A worker without the shim (no GPU) has no cuInit. Returns False
    when cuInit or the synchronization failed.
    """
    if "HIBER_RUN_DIR" not in os.environ:
        return True
    import ctypes
    try:
        cu_init = ctypes.CDLL(None).cuInit
    except (AttributeError, OSError):
        return True
    cu_init.argtypes = [ctypes.c_uint]
    cu_init.restype = ctypes.c_int
    result = cu_init(0)
    if result != 0:
        _complain("cuInit failed (CUresult %d)" % result)
        return False
    try:
        synchronize = ctypes.CDLL(None).cuCtxSynchronize
    except AttributeError:
        return True
    synchronize.argtypes = []
    synchronize.restype = ctypes.c_int
    result = synchronize()
    if result != 0:
        _complain("cuCtxSynchronize failed (CUresult %d)" % result)
    return result == 0


def _connect(address):
    """A socket connected to HIBER_WORKER_SOCKET: a Unix socket's path, or tcp:HOST:PORT."""
    if address.startswith("tcp:"):
        host, sep, port = address[4:].rpartition(":")
        if not sep or not host or not port.isdigit():
            raise OSError('HIBER_WORKER_SOCKET="%s" is not tcp:HOST:PORT' % address)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small frames, answered at once
        return sock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock


def _read_token(path):
    """The token file's first line, without trailing blanks."""
    with open(path, "r", encoding="utf-8") as f:
        token = f.readline().rstrip("\r\n ")
    if not token:
        raise OSError("HIBER_WORKER_TOKEN_FILE=%s is empty" % path)
    return token


def _serve_connection(sock, handler, concurrency):
    """Serves invokes on one connection until the router closes it; returns why the protocol
    broke, or None."""
    connection = _Connection(sock)
    pool = _Pool(concurrency, connection, handler) if concurrency > 1 else None
    stream = sock.makefile("rb", buffering=64 << 10)
    problem = None
    try:
        while True:
            frame = read_frame(stream)
            if frame is None:
                break  # the router closed the connection (or a failed write shut it down)
            request = _parse_invoke(*frame)
            if pool is not None:
                pool.push(request)
            else:
                _answer(connection, handler, request)
    except ProtocolError as e:
        problem = "malformed frame from the router: %s" % e
    except ConnectionResetError:
        pass  # the router going away, as a clean close is
    except OSError as e:
        problem = "read: %s" % e
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    if pool is not None:
        pool.stop()
    stream.close()
    sock.close()
    error = connection.write_error
    if problem is None and error is not None and not isinstance(
            error, (BrokenPipeError, ConnectionResetError)):
        problem = "write: %s" % error
    return problem


def _hello(**extra):
    hello = {"type": "hello", "protocol": PROTOCOL,
             "function": os.environ.get("HIBER_FUNCTION_ID", ""), "pid": os.getpid()}
    hello.update(extra)
    return encode_frame(hello)


def _serve_started(address, handler, concurrency):
    """A worker the router started: one connection to its own socket."""
    try:
        sock = _connect(address)
    except OSError as e:
        _complain("connect to %s: %s" % (address, e))
        return _EXIT_PROTOCOL
    if not _open_hiber_session():
        sock.close()
        return _EXIT_ENVIRONMENT
    _Connection(sock).send(_hello())
    problem = _serve_connection(sock, handler, concurrency)
    if problem is not None:
        _complain(problem)
        return _EXIT_PROTOCOL
    return 0


def _serve_attached(address, token_file, handler, concurrency):
    """A worker started by someone else (docs/router.md, "Attached workers"): it attaches with
    the worker token, waits for the router to be up, and attaches again whenever the connection
    ends."""
    function = os.environ.get("HIBER_FUNCTION_ID", "")
    if not function:
        _complain("HIBER_FUNCTION_ID is not set: an attaching worker must name its function")
        return _EXIT_ENVIRONMENT
    extra = {}
    if "HIBER_RUN_DIR" in os.environ:
        extra["run_dir"] = os.environ["HIBER_RUN_DIR"]
    if os.environ.get("HIBER_INSTANCE_ID"):
        extra["instance"] = os.environ["HIBER_INSTANCE_ID"]
    session_opened = False
    backoff = _MIN_ATTACH_BACKOFF
    last_problem = None
    while True:
        sock = None
        try:
            token = _read_token(token_file)
        except OSError as e:
            why = "cannot read HIBER_WORKER_TOKEN_FILE=%s: %s" % (token_file, e.strerror or e)
        else:
            try:
                sock = _connect(address)
            except OSError as e:
                why = "connect to %s: %s" % (address, e)
        if sock is None:
            if why != last_problem:
                _complain(why + "; retrying")  # once, not every retry
            last_problem = why
            time.sleep(backoff)
            backoff = min(backoff * 2, _MAX_ATTACH_BACKOFF)
            continue
        last_problem = None
        if not session_opened:
            if not _open_hiber_session():
                sock.close()
                return _EXIT_ENVIRONMENT
            session_opened = True
        _Connection(sock).send(_hello(token=token, **extra))
        _complain("connected to the router at %s as function %s" % (address, function))
        since = time.monotonic()
        problem = _serve_connection(sock, handler, concurrency)
        if problem is not None:
            _complain(problem)
            return _EXIT_PROTOCOL
        _complain("the router at %s closed the connection; attaching again" % address)
        if time.monotonic() - since >= _ACCEPTED_CONNECTION_S:
            backoff = _MIN_ATTACH_BACKOFF
        else:
            time.sleep(backoff)  # refused at once (see the router's log): do not hammer it
            backoff = min(backoff * 2, _MAX_ATTACH_BACKOFF)


def serve(handler):
    """Connects to $HIBER_WORKER_SOCKET, says hello and serves invokes with `handler`.

    HIBER_WORKER_SOCKET is a Unix socket's path or tcp:HOST:PORT. A worker the router started
    returns 0 when the router closes the connection; 2 when the environment is wrong and 3 when
    the connection or the protocol fails (after printing why on stderr). With
    $HIBER_WORKER_TOKEN_FILE set the worker attaches by itself (docs/router.md, "Attached
    workers"): it retries until the router is up, attaches again after the connection ends, and
    returns only for a wrong environment (2) or a protocol failure (3). Up to $HIBER_CONCURRENCY
    requests (default 1) run at once on that many threads; with 1 the handler runs on the calling
    thread.
    """
    address = os.environ.get("HIBER_WORKER_SOCKET", "")
    if not address:
        _complain("HIBER_WORKER_SOCKET is not set: this program is a function worker that "
                  "hiber-router starts, or that attaches to it (docs/router.md)")
        return _EXIT_ENVIRONMENT
    concurrency = _concurrency()
    if concurrency == 0:
        return _EXIT_ENVIRONMENT
    token_file = os.environ.get("HIBER_WORKER_TOKEN_FILE", "")
    if token_file:
        return _serve_attached(address, token_file, handler, concurrency)
    return _serve_started(address, handler, concurrency)
