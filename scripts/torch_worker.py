#!/usr/bin/env python3
"""A PyTorch function for hiber-router (docs/router.md): an unmodified PyTorch model on "cuda",
served through the Python function SDK. Run by the router with the shim preloaded; see
scripts/gpu-router-check.sh, which checks its answers against an fp64 CPU reference.

A request is a KServe v2 JSON request with one FP32 input of shape [batch, 64]; the answer is the
model's [batch, 10] output, FP32.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "router",
                                "python"))
import hiber_function  # noqa: E402
import torch  # noqa: E402


def make_model(dtype, device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    return model.to(dtype=dtype, device=device).eval()


def main():
    model = make_model(torch.float32, "cuda")

    def handle(request):
        tensor = request.json()["inputs"][0]
        x = torch.tensor(tensor["data"], dtype=torch.float32).reshape(tensor["shape"]).cuda()
        with torch.no_grad():
            y = model(x).cpu()
        return {"outputs": [{"name": "y", "datatype": "FP32", "shape": list(y.shape),
                             "data": y.flatten().tolist()}]}

    return hiber_function.serve(handle)


if __name__ == "__main__":
    sys.exit(main())
