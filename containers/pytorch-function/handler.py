"""An example PyTorch function: one linear layer, y = W x + b, with W[i][j] = (i - j) / 4 and
b[i] = i / 2 (3 outputs, 4 inputs), served with Hiber's Python SDK.

A request is a KServe v2 JSON body with one FP32 input of 4 values; the answer is the output
"y" of 3 values. With torch (the template's PyTorch base) the layer runs on the GPU when CUDA is
there, whose calls the injected shim sends to hiberd; without torch (containers/build.sh's
CPU-only build on the Debian base) the same numbers come from plain Python.
"""

import sys

import hiber_function

OUTPUTS, INPUTS = 3, 4
WEIGHTS = [[(i - j) / 4 for j in range(INPUTS)] for i in range(OUTPUTS)]
BIAS = [i / 2 for i in range(OUTPUTS)]

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layer = torch.nn.Linear(INPUTS, OUTPUTS).to(device)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(WEIGHTS))
        layer.bias.copy_(torch.tensor(BIAS))

    def forward(x):
        with torch.no_grad():
            return layer(torch.tensor(x, dtype=torch.float32, device=device)).tolist()
else:
    def forward(x):
        return [sum(w * v for w, v in zip(row, x)) + b for row, b in zip(WEIGHTS, BIAS)]


def handle(request):
    inputs = request.json().get("inputs") or []
    if len(inputs) != 1 or len(inputs[0].get("data", [])) != INPUTS:
        return hiber_function.Error(f"expected one input of {INPUTS} FP32 values")
    y = forward([float(v) for v in inputs[0]["data"]])
    return {"outputs": [{"name": "y", "datatype": "FP32", "shape": [OUTPUTS], "data": y}]}


if __name__ == "__main__":
    sys.exit(hiber_function.serve(handle))
