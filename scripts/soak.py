#!/usr/bin/env python3
"""A soak run of a whole simulated node (scripts/soak.sh builds and starts it; docs/reliability.md).

hiberd (--device=sim) and hiber-router in front of it; N functions (mlp_server, the demo's CUDA
inference worker, under the shim, each with its own seed and a 1-4 MiB model) registered with the
router, idle workers scaled to zero after --idle_timeout_s. For --minutes:

  - bursty arrivals: Poisson, at --rate requests/s, five times that for 10 s of every 40 s; each
    request "7 <entry>" to a function chosen with a Zipf-like skew, its answer checked against
    mlp_server's table formula ((seed * 2654435761 + entry * 40503) mod 65536, as C99 hex);
  - random SIGKILLs of the router's workers (one every --worker_kill_s), and --hiberd_kills (2)
    SIGKILLs of hiberd spread evenly over the run, each followed by a restart at once;
  - hostile clients, in every other minute: connection floods (300 silent connections to the
    function socket, held 5 s), garbage frames, and clients killed in the middle of a message
    (hiber_test_client --mode=victim);
  - a few unmodified CUDA programs of tests/shim run under the shim straight against hiberd
    (each checks its own results against a CPU reference: exit 0).

Every request ends as one of: correct, wrong (an answer that is not the formula's: never
acceptable), failed (an HTTP error with a reason), or lost (no answer at all within its 60 s
timeout). A failure outside a kill window (10 s after a worker kill, from a hiberd kill to 15 s
after its restart answered) is reported as unexplained. hiberd's RSS and open fds are sampled
every 10 s. The p99 latency of correct answers outside kill windows is reported with and without
hostile clients, and their ratio.

Prints a report and writes it as JSON to --report. Exits 0 when nothing was lost or wrong and
every failure fell inside a kill window.
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SEND_TIMEOUT_S = 60


def table_value(seed, entry):
    """mlp_server's table entry (tests/shim/programs/tiny_mlp_model.h) as it prints it (%a)."""
    v = float((seed * 2654435761 + entry * 40503) % 65536)
    if v == 0:
        return "0x0p+0"
    mantissa, exponent = v.hex().split("p")
    return mantissa.rstrip("0").rstrip(".") + "p" + exponent


def wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"soak: {what} within {seconds} s")


def read_file(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


class Node:
    """hiberd and hiber-router on a simulated node, in a fresh run directory."""

    def __init__(self, bin_dir, run_dir):
        self.bin = bin_dir
        self.run_dir = run_dir
        self.hiberd = None
        self.router = None
        self.hiberd_runs = 0
        plugin = f"{bin_dir}/tests/shim/libhiber_shim_programs_plugin.so"
        self.hiberd_argv = [f"{bin_dir}/server/hiberd", "--device=sim", "--sim_throttle",
                            f"--run_dir={run_dir}", f"--sim_kernel_plugins={plugin}"]

    def start_hiberd(self):
        self.hiberd_runs += 1
        log = open(f"{self.run_dir}/hiberd-{self.hiberd_runs}.log", "w")
        self.hiberd = subprocess.Popen(self.hiberd_argv, stderr=log, stdout=log,
                                       start_new_session=True)
        wait_for(lambda: "hiberd serving functions on" in read_file(log.name) or
                 self.hiberd.poll() is not None, 60, "hiberd did not serve")
        if self.hiberd.poll() is not None:
            raise SystemExit(f"soak: hiberd exited: {read_file(log.name)[-2000:]}")

    def kill_hiberd(self):
        self.hiberd.send_signal(signal.SIGKILL)
        self.hiberd.wait()

    def start_router(self):
        programs = f"{self.bin}/tests/shim/programs/mlp_server"
        argv = [f"{self.bin}/router/hiber-router", f"--run_dir={self.run_dir}",
                f"--state_dir={self.run_dir}/router", "--listen=127.0.0.1:0",
                f"--port_file={self.run_dir}/router.port", f"--worker_programs={programs}"]
        if os.geteuid() == 0:
            argv.append("--allow_root")
        log = open(f"{self.run_dir}/router.log", "w")
        self.router = subprocess.Popen(argv, stderr=log, stdout=log, start_new_session=True)
        wait_for(lambda: read_file(f"{self.run_dir}/router.port") != "", 30, "the router did not start")
        self.port = int(read_file(f"{self.run_dir}/router.port"))
        self.operator_token = read_file(f"{self.run_dir}/router/operator-token")

    def request(self, method, path, body=b"", headers=None, timeout=SEND_TIMEOUT_S):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def load(self, name, registration):
        status, body = self.request(
            "POST", f"/v2/repository/models/{name}/load", json.dumps(registration).encode(),
            {"Authorization": f"Bearer {self.operator_token}", "Content-Type": "application/json"})
        if status != 200:
            raise SystemExit(f"soak: loading {name}: {status} {body[:300]!r}")

    def worker_pids(self):
        """The router's live worker processes (its children)."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == self.router.pid and fields[0] != "Z":
                    pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
        return pids

    def hiberd_resources(self):
        """hiberd's RSS (KiB), its anonymous, file-backed and shared-memory parts, and its fds.

        The parts tell host memory apart: anonymous (hiberd's heap), file (the model repository's
        files in the state directory), shmem (memfds: the simulated GPUs' memory, channels)."""
        pid = self.hiberd.pid
        values = {"VmRSS:": 0, "RssAnon:": 0, "RssFile:": 0, "RssShmem:": 0}
        for line in read_file(f"/proc/{pid}/status").splitlines():
            fields = line.split()
            if fields and fields[0] in values:
                values[fields[0]] = int(fields[1])
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            fds = 0
        parts = (values["RssAnon:"], values["RssFile:"], values["RssShmem:"])
        return values["VmRSS:"], fds, parts

    def stop(self):
        for process in (self.router, self.hiberd):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


class Soak:
    def __init__(self, args, node):
        self.args = args
        self.node = node
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.results = []  # (sent, latency_s, outcome, detail, hostile)
        self.windows = []  # (start, end, why): failures inside are explained
        self.samples = []  # (t, rss_kib, fds)
        self.hostile = threading.Event()
        self.stop = threading.Event()
        self.programs = {"runs": 0, "passed": 0, "failed": []}
        self.hostile_counts = {"floods": 0, "garbage": 0, "victims": 0}
        self.functions = []
        self.start = time.monotonic()

    def now(self):
        return time.monotonic() - self.start

    def window(self, start, end, why):
        with self.lock:
            self.windows.append((start, end, why))

    # ---- Load ----
    def register(self):
        for i in range(self.args.functions):
            mib = 1 + i % 4
            seed = 1000 + i
            name = f"soak-{i:03d}"
            self.node.load(name, {
                "command": [f"{self.node.bin}/tests/shim/programs/mlp_server", str(seed), str(mib)],
                "shim": True, "slo_ms": 2000, "idle_timeout_s": self.args.idle_timeout_s,
                "max_instances": 1, "quota_mib": 64})
            self.functions.append((name, seed, mib))

    def pick_function(self):
        # Zipf-like: function k with weight 1 / (k + 1).
        n = len(self.functions)
        while True:
            k = int(n ** self.rng.random()) - 1
            if 0 <= k < n:
                return self.functions[k]

    def send(self, name, seed, mib):
        entry = self.rng.randrange(mib * 262144)
        sent = self.now()
        hostile = self.hostile.is_set()
        try:
            status, body = self.node.request("POST", f"/v2/models/{name}/infer",
                                             f"7 {entry}".encode(),
                                             {"Content-Type": "application/octet-stream"})
            text = body.decode(errors="replace")
            if status == 200:
                fields = text.split()
                ok = (len(fields) == 11 and fields[:2] == ["result", "7"] and
                      fields[10] == table_value(seed, entry))
                outcome, detail = ("correct", "") if ok else ("wrong", text[:200])
            else:
                outcome, detail = "failed", f"{status} {text[:200]}"
        except (OSError, http.client.HTTPException) as e:
            outcome, detail = "lost", f"{name} '7 {entry}': {e!r}"

        with self.lock:
            self.results.append((sent, self.now() - sent, outcome, detail, hostile))

    def arrivals(self):
        threads = []
        while not self.stop.is_set():
            burst = (self.now() % 40) < 10
            rate = self.args.rate * (5 if burst else 1)
            time.sleep(self.rng.expovariate(rate))
            name, seed, mib = self.pick_function()
            t = threading.Thread(target=self.send, args=(name, seed, mib), daemon=True)
            t.start()
            threads.append(t)
            threads = [t for t in threads if t.is_alive()]
        for t in threads:
            t.join(SEND_TIMEOUT_S + 5)

    # ---- Chaos ----
    def kill_workers(self):
        while not self.stop.wait(self.args.worker_kill_s):
            pids = self.node.worker_pids()
            if not pids:
                continue
            pid = self.rng.choice(pids)
            t = self.now()
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            self.window(t, t + 10, f"worker {pid} SIGKILLed")

    def kill_hiberd(self):
        kills = self.args.hiberd_kills
        for fraction in [(k + 1) / (kills + 1) for k in range(kills)]:
            if self.stop.wait(max(0, self.args.minutes * 60 * fraction - self.now())):
                return
            t = self.now()
            self.node.kill_hiberd()
            self.node.start_hiberd()
            self.window(t, self.now() + 15, "hiberd SIGKILLed and restarted")

    def hostile_clients(self):
        socket_path = f"{self.node.run_dir}/hiberd.sock"
        victim = f"{self.node.bin}/tests/integration/hiber_test_client"
        token = read_file(f"{self.node.run_dir}/auth-token")
        while not self.stop.is_set():
            # Every other minute.
            if int(self.now() // 60) % 2 == 0:
                self.hostile.clear()
                self.stop.wait(1)
                continue
            self.hostile.set()
            try:
                flood = []
                for _ in range(300):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(socket_path)
                    flood.append(s)
                self.hostile_counts["floods"] += 1
                for _ in range(20):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(socket_path)
                    s.sendall(bytes([16, 0, 0, 0]) + os.urandom(16))
                    s.close()
                    self.hostile_counts["garbage"] += 1
                victim_process = subprocess.Popen(
                    [victim, "--mode=victim", f"--socket={socket_path}", f"--token={token}",
                     "--function_id=soak-victim"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                self.stop.wait(self.rng.uniform(1, 4))
                victim_process.kill()
                victim_process.wait()
                self.hostile_counts["victims"] += 1
                self.stop.wait(2)
                for s in flood:
                    s.close()
            except OSError:
                pass  # hiberd restarting: the next round tries again
            self.stop.wait(2)

    def cuda_programs(self):
        lib = f"{self.node.bin}/client_shim"
        preload = " ".join(f"{lib}/{name}" for name in (
            "libhibercuda.so", "libhibercublas.so", "libhibercublasLt.so", "libhibercudnn.so",
            "libhibernvml.so"))
        env = dict(os.environ, LD_PRELOAD=preload, HIBER_RUN_DIR=self.node.run_dir)
        programs = ["vector_add", "saxpy_streams", "library_gemm", "library_dnn_attention"]
        while not self.stop.wait(20):
            name = self.rng.choice(programs)
            t = self.now()
            result = subprocess.run([f"{self.node.bin}/tests/shim/programs/{name}"], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
            self.programs["runs"] += 1
            if result.returncode == 0:
                self.programs["passed"] += 1
            elif not self.explained(t) and not self.explained(self.now()):
                self.programs["failed"].append(
                    f"{name} exit {result.returncode}: {result.stdout[-300:]!r}")

    def sample(self):
        while not self.stop.wait(10):
            run = self.node.hiberd_runs
            rss, fds, parts = self.node.hiberd_resources()
            if rss > 0:  # not between a kill and the restart
                self.samples.append((round(self.now()), run, rss, fds, parts))

    def explained(self, t):
        with self.lock:
            return any(start <= t <= end for start, end, _ in self.windows)

    # ---- The run ----
    def run(self):
        self.register()
        self.start = time.monotonic()
        workers = [threading.Thread(target=f, daemon=True) for f in (
            self.kill_workers, self.kill_hiberd, self.hostile_clients, self.cuda_programs,
            self.sample)]
        for w in workers:
            w.start()
        load = threading.Thread(target=self.arrivals)
        load.start()
        self.stop.wait(self.args.minutes * 60)
        self.stop.set()
        load.join()
        for w in workers:
            w.join(SEND_TIMEOUT_S)
        return self.report()

    def report(self):
        def p99(latencies):
            if not latencies:
                return None
            latencies = sorted(latencies)
            return latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]

        counts = {"sent": len(self.results), "correct": 0, "wrong": 0, "failed": 0, "lost": 0}
        unexplained = []
        lost = []
        calm, stormy = [], []
        for sent, latency, outcome, detail, hostile in self.results:
            counts[outcome] += 1
            if outcome == "lost":
                lost.append(f"t={sent:.1f}s after {latency:.1f}s: {detail}")
            inside = self.explained(sent) or self.explained(sent + latency)
            if outcome in ("failed", "lost", "wrong") and (outcome == "wrong" or not inside):
                unexplained.append(f"t={sent:.1f}s {outcome}: {detail}")
            if outcome == "correct" and not inside:
                (stormy if hostile else calm).append(latency)
        # hiberd's resources per run of it, after the first quarter of that run's samples.
        runs = {}
        for t, run, rss, fds, parts in self.samples:
            runs.setdefault(run, []).append((t, rss, fds, parts))
        bounds = []
        for run, samples in sorted(runs.items()):
            warm = samples[len(samples) // 4:]
            first, last = warm[0][3], warm[-1][3]
            bounds.append({"run": run, "samples": len(samples),
                           "rss_mib": [min(s[1] for s in warm) // 1024,
                                       max(s[1] for s in warm) // 1024],
                           "fds": [min(s[2] for s in warm), max(s[2] for s in warm)],
                           # anonymous, file, shmem: at the first and the last warm sample
                           "rss_parts_mib": [[p // 1024 for p in first],
                                             [p // 1024 for p in last]]})
        report = {
            "minutes": self.args.minutes, "functions": self.args.functions,
            "rate_per_s": self.args.rate, "requests": counts,
            "failures_outside_kill_windows": len(unexplained),
            "unexplained": unexplained[:20],
            "lost_requests": lost[:50],
            "kill_windows": len(self.windows),
            "hiberd_restarts": self.node.hiberd_runs - 1,
            "cuda_programs": self.programs, "hostile": self.hostile_counts,
            "hiberd_samples": self.samples,
            "hiberd_after_warmup": bounds,
            "p99_ms_calm": None if p99(calm) is None else round(p99(calm) * 1000, 1),
            "p99_ms_hostile": None if p99(stormy) is None else round(p99(stormy) * 1000, 1),
        }
        if report["p99_ms_calm"] and report["p99_ms_hostile"]:
            report["p99_ratio_hostile_to_calm"] = round(
                report["p99_ms_hostile"] / report["p99_ms_calm"], 2)
        report["ok"] = (counts["lost"] == 0 and counts["wrong"] == 0 and not unexplained and
                        not self.programs["failed"])
        return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="the release build folder")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--functions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=10, help="mean requests/s outside bursts")
    parser.add_argument("--idle_timeout_s", type=int, default=30)
    parser.add_argument("--worker_kill_s", type=float, default=20)
    parser.add_argument("--hiberd_kills", type=int, default=2,
                        help="SIGKILLs of hiberd, evenly spread over the run (each restarted)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report", default="soak-report.json")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    args = parser.parse_args()

    run_dir = tempfile.mkdtemp(prefix="hiber-soak-")
    node = Node(args.bin, run_dir)
    ok = False
    try:
        node.start_hiberd()
        node.start_router()
        soak = Soak(args, node)
        report = soak.run()
        ok = report["ok"]
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
        printable = {k: v for k, v in report.items() if k != "hiberd_samples"}
        print(json.dumps(printable, indent=1))
        print(f"soak: {'OK' if ok else 'FAILED'} (report: {args.report}, run dir: {run_dir})")
    finally:
        node.stop()
        if ok and not args.keep:
            subprocess.run(["rm", "-rf", run_dir])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
