#!/usr/bin/env python3
"""Unmodified PyTorch inference, natively or through Hiber: issue 16's acceptance on a GPU.

scripts/gpu-acceptance.sh runs this file twice per model with the same arguments: once natively,
once with libhibercuda.so and the replacement libraries preloaded against `hiberd --device=cuda`
(this file does not know which; --mode only labels its output). Then `compare` reads both
outputs and prints a Markdown report: outputs bit-exact or not (with the largest absolute and
relative differences and the likely cause), and the warm latency per inference both ways.

  torch_acceptance.py run --mode=native --model=resnet50 --out=DIR [--iters=20 --warmup=5]
  torch_acceptance.py compare --out=DIR
  torch_acceptance.py stubs --model=M --out=DIR LOG   # the Hiber stubs a shim run's log shows
  torch_acceptance.py models                 # the model names, one per line

Models: ResNet-50 and ResNet-152 (torchvision's if it is installed, else defined here, the same
architecture), and a BERT-base-sized encoder (12 layers, width 768, 12 heads, FFN 3072, GELU,
sequence 128, vocabulary 30522). Random weights from a fixed seed, made on the CPU (so both runs
get the same bytes without any download), eval mode, a fixed input, fp32.

Deterministic settings, so outputs are expected bit-exact when hiberd runs the same library
calls on the same GPU: cudnn.deterministic=True, cudnn.benchmark=False,
torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8 (set here when the
caller did not, before CUDA is initialised). Standard library and torch only.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

MODELS = ("resnet50", "resnet152", "bert")
BATCH = 8


def fail(message, code=2):
    print(f"torch_acceptance: {message}", file=sys.stderr)
    sys.exit(code)


def import_torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        fail(f"PyTorch is not installed for {sys.executable} ({e}); install torch 2.11+cu130")
    return sys.modules["torch"]


# ---- Models (defined here when torchvision is absent) ----


def define_models(torch):
    nn = torch.nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            width = planes
            self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * self.expansion)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        """torchvision's ResNet (v1.5: stride in the 3x3 convolution), bottleneck blocks."""

        def __init__(self, layers, num_classes=1000):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            self.layer1 = self._make_layer(64, layers[0])
            self.layer2 = self._make_layer(128, layers[1], stride=2)
            self.layer3 = self._make_layer(256, layers[2], stride=2)
            self.layer4 = self._make_layer(512, layers[3], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def _make_layer(self, planes, blocks, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride=stride,
                              bias=False),
                    nn.BatchNorm2d(planes * Bottleneck.expansion))
            layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * Bottleneck.expansion
            layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    class Encoder(nn.Module):
        """BERT-base-sized: embeddings, 12 post-norm encoder layers, GELU."""

        def __init__(self, vocab=30522, positions=512, width=768, heads=12, ffn=3072, layers=12):
            super().__init__()
            self.tokens = nn.Embedding(vocab, width)
            self.positions = nn.Embedding(positions, width)
            self.norm = nn.LayerNorm(width, eps=1e-12)
            layer = nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.1, activation="gelu",
                                               layer_norm_eps=1e-12, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            return self.encoder(self.norm(self.tokens(ids) + self.positions(pos)))

    return ResNet, Encoder


def make_model(torch, name):
    """The model (random weights from a fixed seed, on the CPU) and its input, and where the
    model came from."""
    ResNet, Encoder = define_models(torch)
    torch.manual_seed(0)
    source = "defined in torch_acceptance.py"
    if name in ("resnet50", "resnet152"):
        layers = [3, 4, 6, 3] if name == "resnet50" else [3, 8, 36, 3]
        try:
            import torchvision

            model = getattr(torchvision.models, name)(weights=None)
            source = f"torchvision {torchvision.__version__}"
        except ImportError:
            model = ResNet(layers)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(BATCH, 3, 224, 224, generator=gen)
    elif name == "bert":
        model = Encoder()
        gen = torch.Generator().manual_seed(1)
        x = torch.randint(0, 30522, (BATCH, 128), generator=gen)
    else:
        fail(f"unknown model {name!r} (one of {', '.join(MODELS)})")
    return model.eval(), x, source


# ---- run ----


def device_name(torch):
    try:
        return torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"unknown ({e})"


def run(args):
    # Before CUDA starts: cuBLAS reads it when its first handle is made.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch = import_torch()
    if not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False: no GPU visible to this process "
             f"(LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r})", 3)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)
    # PyTorch's defaults, written down so both runs state them.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True

    os.makedirs(args.out, exist_ok=True)
    model, x, source = make_model(torch, args.model)
    result = {
        "mode": args.mode, "model": args.model, "source": source, "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "device": device_name(torch), "batch": BATCH, "iters": args.iters,
        "warmup": args.warmup, "ok": False,
    }
    result_path = os.path.join(args.out, f"{args.model}.{args.mode}.json")
    try:
        if args.mode == "native":
            # The independent reference: the same model and input in fp64 on the CPU. Both GPU
            # runs are judged by their distance to it, so engines that differ only in rounding
            # (TF32, another cuDNN algorithm) are told apart from wrong results.
            import copy
            with torch.inference_mode():
                x64 = x.double() if x.is_floating_point() else x  # token ids stay integers
                reference = copy.deepcopy(model).double()(x64).float()
            torch.save(reference, os.path.join(args.out, f"{args.model}.cpu64.pt"))
        t0 = time.perf_counter()
        model = model.cuda()
        x = x.cuda()
        torch.cuda.synchronize()
        result["load_s"] = time.perf_counter() - t0
        times = []
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model(x)
            torch.cuda.synchronize()
            result["first_ms"] = (time.perf_counter() - t0) * 1e3
            for i in range(args.warmup + args.iters):
                t0 = time.perf_counter()
                out = model(x)
                torch.cuda.synchronize()
                if i >= args.warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
        out = out.float().cpu()
        torch.save(out, os.path.join(args.out, f"{args.model}.{args.mode}.pt"))
        result.update(ok=True, median_ms=statistics.median(times), min_ms=min(times),
                      max_ms=max(times), shape=list(out.shape),
                      finite=bool(torch.isfinite(out).all()))
    except Exception as e:  # noqa: BLE001 - every failure is reported, then the exit code says
        result["error"] = f"{type(e).__name__}: {e}"
        print(f"torch_acceptance: {args.model} ({args.mode}) failed: {result['error']}",
              file=sys.stderr)
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


# ---- compare ----


def likely_cause(native, shim):
    if native.get("device") != shim.get("device"):
        return "different GPUs in the two runs"
    return ("different library algorithms on each side: hiberd's cuBLAS/cuDNN handles got "
            "another workspace, math mode or engine than PyTorch's own (check the settings "
            "carried per call, and that hiberd uses the same cuBLAS/cuDNN builds as torch)")


# What the replacement libraries log (client_shim/unsupported.cc, library_client.cc), once per
# name, for a stub, i.e. a name Hiber exports but does not implement:
#   hibercuda: cudaFoo is not supported by Hiber; it returns the "not supported" error (801)
#   cuDNN: cudnnFoo is not supported by Hiber; it returns the library's "not supported" status ...
STUB = re.compile(r"\b(hibercuda|cuBLAS|cuBLASLt|cuDNN|NVML|hibernvml): (\w+) is not supported "
                  r"by Hiber; it returns")
# NVML's queries Hiber cannot answer (client_shim/nvml.cc):
#   hibernvml: nvmlDeviceGetPowerUsage is not supported (NVML_ERROR_NOT_SUPPORTED)
NVML_STUB = re.compile(r"\b(hibernvml): (\w+) is not supported \(NVML_ERROR_NOT_SUPPORTED\)")
# ... and a call Hiber implements but refuses as not supported (a descriptor type, attribute,
# engine, knob ...) or whose hint it ignores, logged as "<library>: <call>: <why>", e.g.
#   cuDNN: cudnnBackendCreateDescriptor: CUDNN_BACKEND_MATMUL_DESCRIPTOR (type 18) is not ...
REFUSAL = re.compile(r"\b(hibercuda|cuBLAS|cuBLASLt|cuDNN|NVML|hibernvml): (\w+)(?:\([^)]*\))?: "
                     r"(.*(?:not supported|[Nn]ot remoted|Hiber's engines|ignored by Hiber).*)$")


def stubs_in(text):
    """(stubs, refusals) a shim run's stderr shows: sorted "library: name" and messages."""
    stubs, refusals = set(), set()
    for line in text.splitlines():
        m = STUB.search(line) or NVML_STUB.search(line)
        if m:
            stubs.add(f"{m.group(1)}: {m.group(2)}")
            continue
        m = REFUSAL.search(line)
        if m:
            refusals.add(f"{m.group(1)}: {m.group(2)}: {m.group(3).strip()}"[:300])
    return sorted(stubs), sorted(refusals)


def stubs(args):
    """Writes <out>/<model>.stubs.json from the shim run's log and prints what it found."""
    try:
        with open(args.log, errors="replace") as f:
            found, refused = stubs_in(f.read())
    except OSError as e:
        fail(f"cannot read {args.log}: {e}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.model}.stubs.json"), "w") as f:
        json.dump({"model": args.model, "stubs": found, "refusals": refused}, f, indent=1)
    if not found and not refused:
        print(f"{args.model}: no Hiber stub was hit and no call was refused as not supported")
        return 0
    if found:
        print(f"{args.model}: {len(found)} Hiber stub(s) hit: " + ", ".join(found))
    for r in refused:
        print(f"{args.model}: refused: {r}")
    return 1


def stubs_cell(out, name):
    """The report's "stubs hit" cell for a model, and whether it is clean."""
    path = os.path.join(out, f"{name}.stubs.json")
    if not os.path.exists(path):
        return "not checked", True
    found = json.load(open(path))
    hit, refused = found.get("stubs", []), found.get("refusals", [])
    if not hit and not refused:
        return "none", True
    parts = [f"`{s.split(': ', 1)[-1]}`" for s in hit]
    if refused:
        parts.append(f"{len(refused)} refusal(s), see {name}.stubs.json")
    return ", ".join(parts), False


def compare(args):
    torch = import_torch()
    lines = ["| model | source | native ms | hiber ms | hiber/native | outputs | Hiber stubs hit |",
             "|---|---|---|---|---|---|---|"]
    all_ok = True
    for name in MODELS:
        stub_cell, stubs_ok = stubs_cell(args.out, name)
        all_ok = all_ok and stubs_ok
        paths = {m: os.path.join(args.out, f"{name}.{m}.json") for m in ("native", "shim")}
        if not all(os.path.exists(p) for p in paths.values()):
            missing = [m for m, p in paths.items() if not os.path.exists(p)]
            lines.append(f"| {name} | | | | | not run ({', '.join(missing)} missing) "
                         f"| {stub_cell} |")
            all_ok = False
            continue
        native, shim = (json.load(open(paths[m])) for m in ("native", "shim"))
        if not native["ok"] or not shim["ok"]:
            why = "; ".join(f"{r['mode']}: {r.get('error', '?')}"
                            for r in (native, shim) if not r["ok"])
            lines.append(f"| {name} | {native.get('source', '')} | "
                         f"{native.get('median_ms', float('nan')):.2f} | "
                         f"{shim.get('median_ms', float('nan')):.2f} | | FAILED: {why} "
                         f"| {stub_cell} |")
            all_ok = False
            continue
        a = torch.load(os.path.join(args.out, f"{name}.native.pt"))
        b = torch.load(os.path.join(args.out, f"{name}.shim.pt"))
        if a.shape != b.shape:
            verdict = f"shapes differ: {list(a.shape)} vs {list(b.shape)}"
            all_ok = False
        elif torch.equal(a, b):
            verdict = "bit-exact"
        else:
            diff = (a - b).abs()
            rel = diff / a.abs().clamp_min(1e-30)
            verdict = (f"differ: max abs {diff.max().item():.3g}, max rel {rel.max().item():.3g}"
                       f", {int((diff != 0).sum())} of {diff.numel()} elements")
            ref_path = os.path.join(args.out, f"{name}.cpu64.pt")
            if os.path.exists(ref_path):
                # Error relative to the reference's largest magnitude: native's is what rounding
                # alone costs; Hiber passes within 4 times that (another engine or TF32 on
                # one side), or 1e-3, whichever is larger.
                ref = torch.load(ref_path).double()
                scale = ref.abs().max().clamp_min(1e-30)
                e_native = ((a.double() - ref).abs().max() / scale).item()
                e_hiber = ((b.double() - ref).abs().max() / scale).item()
                close = e_hiber <= max(4 * e_native, 1e-3)
                verdict += (f"; against fp64 on the CPU: native {e_native:.2e}, hiber "
                            f"{e_hiber:.2e} ({'within rounding' if close else 'WRONG'})")
                all_ok = all_ok and close
                if not close:
                    verdict += f"; likely cause: {likely_cause(native, shim)}"
            else:
                verdict += f"; likely cause: {likely_cause(native, shim)}"
                all_ok = False
        ratio = shim["median_ms"] / native["median_ms"]
        lines.append(f"| {name} | {native['source']} | {native['median_ms']:.2f} | "
                     f"{shim['median_ms']:.2f} | {ratio:.3f} | {verdict} | {stub_cell} |")
    # A warm inference through hiberd in each isolation mode (the shim runs are context mode,
    # hiberd's default), where a shim-shared run was made.
    isolation = ["", "| model | context ms | shared ms | context/shared | outputs |",
                 "|---|---|---|---|---|"]
    for name in MODELS:
        paths = {m: os.path.join(args.out, f"{name}.{m}.json") for m in ("shim", "shim-shared")}
        if not all(os.path.exists(p) for p in paths.values()):
            continue
        context, shared = (json.load(open(paths[m])) for m in ("shim", "shim-shared"))
        if not context["ok"] or not shared["ok"]:
            isolation.append(f"| {name} | | | | FAILED: {shared.get('error', context.get('error'))} |")
            all_ok = False
            continue
        same = torch.equal(torch.load(os.path.join(args.out, f"{name}.shim.pt")),
                           torch.load(os.path.join(args.out, f"{name}.shim-shared.pt")))
        isolation.append(f"| {name} | {context['median_ms']:.2f} | {shared['median_ms']:.2f} | "
                         f"{context['median_ms'] / shared['median_ms']:.3f} | "
                         f"{'bit-exact' if same else 'differ'} |")
    if len(isolation) > 3:
        lines += isolation
    print("\n".join(lines))
    return 0 if all_ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one model, write <out>/<model>.<mode>.{json,pt}")
    r.add_argument("--mode", required=True, choices=("native", "shim", "shim-shared"),
                   help="shim-shared: through the shim against a hiberd --isolation=shared")
    r.add_argument("--model", required=True, choices=MODELS)
    r.add_argument("--out", required=True)
    r.add_argument("--iters", type=int, default=20, help="timed inferences (median reported)")
    r.add_argument("--warmup", type=int, default=5, help="untimed inferences before them")
    c = sub.add_parser("compare", help="compare the native and shim runs in --out (Markdown)")
    c.add_argument("--out", required=True)
    sub.add_parser("models", help="print the model names")
    s = sub.add_parser("stubs", help="list the Hiber stubs (and refusals) a shim run's log shows, "
                       "into <out>/<model>.stubs.json; exit 1 if any")
    s.add_argument("--model", required=True, help="a label: the model, or llm-<variant>")
    s.add_argument("--out", required=True)
    s.add_argument("log", help="the shim run's stdout and stderr")
    args = parser.parse_args()
    if args.command == "models":
        print("\n".join(MODELS))
        return 0
    if args.command == "stubs":
        return stubs(args)
    return run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
