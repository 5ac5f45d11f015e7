#!/usr/bin/env python3
"""Invokes the PyTorch function of scripts/torch_worker.py through hiber-router and checks every
answer against the same model computed on the CPU in fp64. Used by scripts/gpu-router-check.sh.

  gpu-router-check.py ROUTER_URL FUNCTION [REQUESTS]
"""
import json
import sys
import urllib.request

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from torch_worker import make_model  # noqa: E402


def main():
    url, function = sys.argv[1], sys.argv[2]
    requests = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    reference = make_model(torch.float64, "cpu")
    worst = 0.0
    sources = {}
    for n in range(requests):
        torch.manual_seed(1000 + n)
        x = torch.randn(8, 64)
        body = {"inputs": [{"name": "x", "shape": [8, 64], "datatype": "FP32",
                            "data": x.flatten().tolist()}]}
        request = urllib.request.Request(f"{url}/v2/models/{function}/infer",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            out = json.loads(answer.read())
            source = answer.headers.get("X-Hiber-Source", "?")
            sources[source] = sources.get(source, 0) + 1
        y = torch.tensor(out["outputs"][0]["data"], dtype=torch.float64).reshape(8, 10)
        with torch.no_grad():
            want = reference(x.to(torch.float64))
        error = float((y - want).abs().max() / want.abs().max())
        worst = max(worst, error)
    print(f"{requests} requests through hiber-router, sources {sources}, "
          f"worst error against fp64 CPU {worst:.3g}")
    return 0 if worst <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
