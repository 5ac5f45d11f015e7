#!/usr/bin/env python3
"""A small GPT-style decoder, natively or through Hiber: issue 31's acceptance on a GPU.

scripts/gpu-acceptance.sh step (e) runs this file once per variant natively (twice, for the
run-to-run tolerance), then once per variant with libhibercuda.so and the replacement libraries
preloaded against `hiberd --device=cuda` (this file does not know which; --mode only labels its
output). Then `compare` reads the outputs and prints a Markdown table.

  llm_acceptance.py run --variant=V --mode=native|native2|shim --out=DIR
  llm_acceptance.py compare --out=DIR
  llm_acceptance.py variants            # the variant names, one per line

The model: token embedding and learned positions, 8 decoder layers (pre-LN, causal
F.scaled_dot_product_attention over a KV cache, GELU MLP), a final layer norm and a tied output
projection; width 512, 8 heads, vocabulary 4096; random weights from a fixed seed made on the CPU
(no download), fp16 on the GPU. Greedy decoding of 64 tokens from a fixed 16-token prompt, with a
static KV cache (so the decode step has fixed shapes and can be captured).

Variants (each in its own process, since allocator settings are read when CUDA starts):
  eager         the decode step run as is
  cudagraph     the decode step captured once with torch.cuda.CUDAGraph and replayed
  expandable    eager, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (client VMM)
  mallocasync   eager, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (stream-ordered pools)
  cudnn_sdpa    eager, SDPA forced to cuDNN's attention (sdpa_kernel(CUDNN_ATTENTION))
  compile       torch.compile(mode="reduce-overhead") of the decode step, where Triton is
                installed (otherwise recorded as skipped)

A run writes DIR/<variant>.<mode>.json: the tokens, the last step's logits (float32), tokens per
second of the decode loop, and what was skipped. `compare` checks that the tokens through Hiber
are identical to native's and that its logits differ from native's by no more than native's two
runs differ from each other (at least 1e-3 absolute, fp16's rounding), and prints tokens/s both
ways. Standard library and torch only.
"""

import argparse
import json
import os
import sys
import time

VARIANTS = ("eager", "cudagraph", "expandable", "mallocasync", "cudnn_sdpa", "compile")
ALLOC_CONF = {"expandable": "expandable_segments:True", "mallocasync": "backend:cudaMallocAsync"}
LAYERS, WIDTH, HEADS, VOCAB = 8, 512, 8, 4096
PROMPT, NEW_TOKENS = 16, 64
MAX_LEN = PROMPT + NEW_TOKENS


def fail(message, code=2):
    print(f"llm_acceptance: {message}", file=sys.stderr)
    sys.exit(code)


def build(torch):
    nn = torch.nn
    F = torch.nn.functional

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(WIDTH)
            self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
            self.proj = nn.Linear(WIDTH, WIDTH)
            self.ln2 = nn.LayerNorm(WIDTH)
            self.up = nn.Linear(WIDTH, 4 * WIDTH)
            self.down = nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x, k_cache, v_cache, pos, mask):
            # x: [1, T, W]; the caches: [1, H, MAX_LEN, W / H]; pos: the first new position.
            t = x.shape[1]
            q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=-1)
            shape = (1, t, HEADS, WIDTH // HEADS)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
            x = x + self.proj(a.transpose(1, 2).reshape(1, t, WIDTH))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.positions = nn.Embedding(MAX_LEN, WIDTH)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.ln = nn.LayerNorm(WIDTH)

        def forward(self, tokens, pos, caches, mask):
            x = self.embed(tokens) + self.positions(pos)[None]
            for layer, (k, v) in zip(self.layers, caches):
                x = layer(x, k, v, pos, mask)
            return self.ln(x) @ self.embed.weight.t()

    torch.manual_seed(31)
    return Decoder().eval()


def run(args):
    if args.variant in ALLOC_CONF:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[args.variant]
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is not installed for {sys.executable} ({e})")
    out = {"variant": args.variant, "mode": args.mode, "skipped": None}
    path = os.path.join(args.out, f"{args.variant}.{args.mode}.json")
    if args.variant == "compile":
        try:
            import triton  # noqa: F401
        except ImportError:
            out["skipped"] = "Triton is not installed"
            json.dump(out, open(path, "w"))
            print(f"llm_acceptance: {args.variant} skipped: {out['skipped']}")
            return 0
    try:
        return decode(torch, args, out, path)
    except Exception as e:  # recorded: native failures are the variant's, not Hiber's
        out["error"] = f"{type(e).__name__}: {e}"
        json.dump(out, open(path, "w"))
        print(f"llm_acceptance: {args.variant} {args.mode} failed: {out['error']}", file=sys.stderr)
        return 1


def decode(torch, args, out, path):
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    model = build(torch).half().to(device)
    caches = [
        (torch.zeros(1, HEADS, MAX_LEN, WIDTH // HEADS, dtype=torch.half, device=device),
         torch.zeros(1, HEADS, MAX_LEN, WIDTH // HEADS, dtype=torch.half, device=device))
        for _ in range(LAYERS)
    ]
    # Additive masks: position p of the cache is visible to query position q when p <= q.
    full = torch.full((MAX_LEN, MAX_LEN), float("-inf"), device=device).triu(1).half()
    prompt = torch.arange(PROMPT, device=device)[None] * 37 % VOCAB

    sdpa_context = None
    if args.variant == "cudnn_sdpa":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa_context = sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
        sdpa_context.__enter__()

    with torch.inference_mode():
        pos = torch.arange(PROMPT, device=device)
        logits = model(prompt, pos, caches, full[:PROMPT][None, None])
        token = logits[0, -1].argmax().view(1, 1)
        # The decode step, with static inputs so that it can be captured.
        step_token = token.clone()
        step_pos = torch.tensor([PROMPT], device=device)
        step_mask = torch.zeros(1, 1, 1, MAX_LEN, dtype=torch.half, device=device)
        step_out = torch.zeros(1, 1, VOCAB, dtype=torch.half, device=device)

        def step():
            step_out.copy_(model(step_token, step_pos, caches, step_mask))

        graph = None
        runner = step
        if args.variant == "compile":
            runner = torch.compile(step, mode="reduce-overhead")
        tokens = [int(token)]
        torch.cuda.synchronize()
        started = time.perf_counter()
        for i in range(NEW_TOKENS - 1):
            p = PROMPT + i
            step_pos.fill_(p)
            step_mask.copy_(full[p][None, None, None])
            step_token.copy_(token)
            if args.variant == "cudagraph":
                if graph is None:
                    # Warm up on a side stream, as torch.cuda.graphs documents, then capture.
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        step()
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step()
                graph.replay()
            else:
                runner()
            token = step_out[0, -1].argmax().view(1, 1)
            tokens.append(int(token))
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    if sdpa_context is not None:
        sdpa_context.__exit__(None, None, None)
    out["tokens"] = tokens
    out["logits"] = step_out[0, -1].float().cpu().tolist()
    out["tokens_per_s"] = (NEW_TOKENS - 1) / elapsed
    json.dump(out, open(path, "w"))
    print(f"llm_acceptance: {args.variant} {args.mode}: {len(tokens)} tokens, "
          f"{out['tokens_per_s']:.1f} tokens/s")
    return 0


def load(out, variant, mode):
    try:
        return json.load(open(os.path.join(out, f"{variant}.{mode}.json")))
    except (OSError, ValueError):
        return None


def compare(args):
    print("| variant | tokens | logits: max difference (native's own) | native tok/s | hiber tok/s |")
    print("|---|---|---|---|---|")
    failed = False
    for variant in VARIANTS:
        native, again, shim = (load(args.out, variant, m) for m in ("native", "native2", "shim"))
        if native is None or shim is None:
            print(f"| {variant} | not run | | | |")
            failed = True
            continue
        if native.get("skipped"):
            print(f"| {variant} | skipped: {native['skipped']} | | | |")
            continue
        if "error" in native:
            print(f"| {variant} | fails natively too: {native['error'][:80]} | | | |")
            continue
        if "tokens" not in shim:
            print(f"| {variant} | failed through Hiber | | {native['tokens_per_s']:.1f} | |")
            failed = True
            continue
        same = native["tokens"] == shim["tokens"]
        diff = max(abs(a - b) for a, b in zip(native["logits"], shim["logits"]))
        own = 0.0
        if again is not None and "logits" in again:
            own = max(abs(a - b) for a, b in zip(native["logits"], again["logits"]))
        within = diff <= max(own, 1e-3)
        failed |= not (same and within)
        print(f"| {variant} | {'identical' if same else 'DIFFERENT'} | {diff:.3g} ({own:.3g})"
              f"{'' if within else ' OUTSIDE'} | {native['tokens_per_s']:.1f} | "
              f"{shim['tokens_per_s']:.1f} |")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--variant", choices=VARIANTS, required=True)
    r.add_argument("--mode", choices=("native", "native2", "shim"), required=True)
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--out", required=True)
    sub.add_parser("variants")
    args = parser.parse_args()
    if args.command == "variants":
        print("\n".join(VARIANTS))
        return 0
    if args.command == "compare":
        return compare(args)
    os.makedirs(args.out, exist_ok=True)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
