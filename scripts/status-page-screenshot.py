#!/usr/bin/env python3
"""Makes docs/status-page.png: hiber-router's status page over a live node, in headless Chromium.

Starts hiberd (--device=sim, the Torpor paper's 4-GPU node) and hiber-router from a build folder,
registers a dozen functions (shim-preloaded workers; most give their model device memory with
the test worker's application/x-test-alloc), sends them some traffic with a few failures, drains
GPUs in turn so that models move, leaves one GPU drained and one function busy with requests
queued behind it, then screenshots the page. Needs a build with the CUDA toolkit (the shim) and
its targets hiberd, hiber-router, hiber-echo-worker, hiber_router_test_worker and hiberctl.

  scripts/status-page-screenshot.py [--build=build/release] [--out=docs/status-page.png]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build/release"), help="build folder")
    p.add_argument("--out", default=os.path.join(ROOT, "docs/status-page.png"), help="the PNG")
    p.add_argument("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
    a = p.parse_args()
    b = os.path.abspath(a.build)
    binaries = {"hiberd": f"{b}/server/hiberd", "router": f"{b}/router/hiber-router",
                "echo": f"{b}/router/hiber-echo-worker", "hiberctl": f"{b}/tools/hiberctl",
                "test_worker": f"{b}/tests/unit/hiber_router_test_worker",
                "shim": f"{b}/client_shim/libhibercuda.so",
                "plugin": f"{b}/tests/kernels/libhiber_test_kernels_plugin.so"}
    for name, path in binaries.items():
        if not os.path.exists(path):
            sys.exit(f"status-page-screenshot: {name} not built ({path})")

    tmp = tempfile.mkdtemp(prefix="hiber-screenshot-")
    procs = []
    try:
        run = f"{tmp}/run"
        procs.append(subprocess.Popen(
            [binaries["hiberd"], "--device=sim", f"--run_dir={run}",
             f"--node_config={ROOT}/configs/nodes/torpor-4gpu.json", "--host_pool_max_mib=8192",
             f"--sim_kernel_plugins={binaries['plugin']}"],
            stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/hiberd.log", "w")))
        wait_for(lambda: os.path.exists(f"{run}/control.sock"), "hiberd")
        os.mkdir(f"{tmp}/state")
        procs.append(subprocess.Popen(
            [binaries["router"], "--listen=127.0.0.1:0", f"--port_file={tmp}/state/port",
             f"--state_dir={tmp}/state", f"--run_dir={run}", f"--shim_preload={binaries['shim']}",
             f"--worker_programs={binaries['echo']},{binaries['test_worker']}"]
            + (["--allow_root"] if os.geteuid() == 0 else []),
            stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/router.log", "w")))
        wait_for(lambda: os.path.getsize(f"{tmp}/state/port") > 0
                 if os.path.exists(f"{tmp}/state/port") else False, "hiber-router")
        base = "http://127.0.0.1:" + open(f"{tmp}/state/port").read().strip()
        wait_for(lambda: get(base + "/v2/health/ready") == 200, "a ready router")
        token = open(f"{tmp}/state/operator-token").read().strip()
        traffic(base, binaries, run, {"Authorization": f"Bearer {token}"})
        os.makedirs(f"{tmp}/home")
        subprocess.run([a.chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", f"--user-data-dir={tmp}/profile",
                        "--virtual-time-budget=3000", "--hide-scrollbars",
                        "--window-size=1400,900", f"--screenshot={os.path.abspath(a.out)}",
                        base + "/"],
                       env={**os.environ, "HOME": f"{tmp}/home"}, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        print(f"status-page-screenshot: wrote {a.out} ({os.path.getsize(a.out)} bytes)")
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def wait_for(pred, what, seconds=30):
    deadline = time.time() + seconds
    while not pred():
        if time.time() > deadline:
            sys.exit(f"status-page-screenshot: no {what} after {seconds} s")
        time.sleep(0.05)


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except (urllib.error.URLError, OSError):
        return 0


def post(base, path, body=b"", ctype="application/octet-stream", headers=None):
    req = urllib.request.Request(base + path, data=body, method="POST",
                                 headers={"Content-Type": ctype, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=90) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:  # the router went away while a background request waited
        return 0, str(e).encode()


def traffic(base, binaries, run, operator):
    echo, tw = binaries["echo"], binaries["test_worker"]
    # name: (worker, SLO ms, model MiB); echo workers hold no device memory. One allocation
    # stays within hiberd's --pool_chunk_mib (2048): a larger one is allocated, but cannot be
    # placed again once evicted.
    functions = {
        "resnet50": (tw, 100, 1000), "bert-base": (tw, 80, 800), "llama-7b": (tw, 250, 2000),
        "whisper-small": (tw, 150, 600), "yolo-v8": (tw, 60, 400), "clip-vit": (tw, 120, 500),
        "t5-small": (echo, 90, 0), "sd-turbo": (tw, 400, 1500), "mistral-7b": (tw, 300, 1800),
        "embed-minilm": (echo, 40, 0), "rerank": (echo, 50, 0), "ocr-trocr": (tw, 200, 300)}
    for name, (program, slo, mib) in functions.items():
        registration = {"command": [program], "shim": True, "idle_timeout_s": 600, "slo_ms": slo,
                        "concurrency": 2 if name == "llama-7b" else 1}
        status, body = post(base, f"/v2/repository/models/{name}/load",
                            json.dumps(registration).encode(), "application/json", operator)
        if status != 200:
            sys.exit(f"status-page-screenshot: load {name}: {status} {body!r}")
    for name, (_, _, mib) in functions.items():
        if mib:
            post(base, f"/v2/models/{name}/infer", str(mib).encode(), "application/x-test-alloc")
    rng = random.Random(7)
    for name in functions:
        for _ in range(rng.randint(1, 30)):
            status, body = post(base, f"/v2/models/{name}/infer", b"x" * 100)
            if status != 200:
                print(f"status-page-screenshot: {name}: {status} {body[:300]!r}", file=sys.stderr)
    for _ in range(2):
        post(base, "/v2/models/ocr-trocr/infer", b"bad image", "application/x-test-error")

    def hiberctl(*args):
        subprocess.run([binaries["hiberctl"], f"--run_dir={run}", *args], check=True,
                       stdout=subprocess.DEVNULL)

    # Models move: GPUs 0 and 1 drained in turn while every function is called.
    for gpu in (0, 1):
        hiberctl("drain", f"--gpu={gpu}")
        for name in functions:
            post(base, f"/v2/models/{name}/infer", b"y")
        hiberctl("drain", f"--gpu={gpu}", "--resume")
    hiberctl("drain", "--gpu=3")
    # llama-7b busy: two requests that wait for a third (a barrier never met; they give up after
    # their 60 s deadline), and three queued at the router behind them.
    def background(ctype, body):
        threading.Thread(target=post, daemon=True,
                         args=(base, "/v2/models/llama-7b/infer", body, ctype,
                               {"X-Hiber-Deadline-Ms": "60000"})).start()
    for _ in range(2):
        background("application/x-test-barrier", b"3")
    time.sleep(0.5)
    # The models that share llama-7b's GPU move to an idle one, from that GPU (peer swaps).
    for name in functions:
        if name != "llama-7b":
            post(base, f"/v2/models/{name}/infer", b"w")
    for _ in range(3):
        background("text/plain", b"z")
    time.sleep(1.0)


if __name__ == "__main__":
    main()
