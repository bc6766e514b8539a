"""The PyTorch yardstick for bench/gpu.py: GPT-2-small as a PyTorch expert writes it.

Same architecture as ``andrea_jax.model`` (pre-LayerNorm blocks, fused QKV, tanh-GELU MLP,
learned positions, tied output embedding, vocabulary padded to a multiple of 128, GPT-2
initialisation) and the same training step (cross-entropy over the real vocabulary, global-norm
clipping at 1.0, AdamW betas (0.9, 0.95), weight decay 0.1 on matrices), with the PyTorch
speed-ups: bf16 autocast, ``F.scaled_dot_product_attention(is_causal=True)`` on the flash kernel
(the other SDPA backends turned off on the GPU), fused AdamW, a foreach global-norm clip, TF32 for
what stays float32. Synthetic tokens; plain causal attention. Two variants (``--variant``):

* ``compiled-loss`` (the yardstick): the forward pass *and the loss* (the logits' float32 cast, the
  cross-entropy) in one ``torch.compile``d function, so inductor fuses the output projection's
  epilogue with the loss and AOTAutograd compiles their backward together;
* ``eager-loss`` (the earlier yardstick, kept so the change is visible): the model compiled, the
  loss computed eagerly on its bf16 logits (a float32 copy of ``[B, T, V]`` and its cotangent).

Usage (from the repository root):
  python -m bench.torch_gpt2 [--quick] [--cpu] [--json] [--steps N] [--variant eager-loss]

``--cpu`` uses a tiny model on the CPU (to check the script); ``--json`` prints one JSON line
instead of the table (bench/gpu.py reads it).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
  """``x += attn(ln_1(x)); x += mlp(ln_2(x))``."""

  def __init__(self, d: int, heads: int, d_mlp: int):
    super().__init__()
    self.heads = heads
    self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
    self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
    self.c_fc, self.mlp_proj = nn.Linear(d, d_mlp), nn.Linear(d_mlp, d)

  def forward(self, x_BxTxD: torch.Tensor) -> torch.Tensor:
    B, T, D = x_BxTxD.shape
    qkv = self.c_attn(self.ln_1(x_BxTxD)).view(B, T, 3, self.heads, D // self.heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)                      # each [B, H, T, Dh]
    y_BxHxTxDh = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x_BxTxD = x_BxTxD + self.attn_proj(y_BxHxTxDh.transpose(1, 2).reshape(B, T, D))
    h_BxTxF = F.gelu(self.c_fc(self.ln_2(x_BxTxD)), approximate="tanh")
    return x_BxTxD + self.mlp_proj(h_BxTxF)


class GPT2(nn.Module):
  """Decoder-only LM: ``tokens [B, T] -> logits [B, T, vocab]`` (the padded columns sliced off)."""

  def __init__(self, vocab: int, max_len: int, layers: int, heads: int, d: int, d_mlp: int):
    super().__init__()
    self.vocab = vocab
    padded = (vocab + 127) // 128 * 128
    self.wte, self.wpe = nn.Embedding(padded, d), nn.Embedding(max_len, d)
    self.h = nn.ModuleList(Block(d, heads, d_mlp) for _ in range(layers))
    self.ln_f = nn.LayerNorm(d)
    for name, p in self.named_parameters():
      if name.endswith("bias"):
        nn.init.zeros_(p)
      elif "ln_" in name:
        nn.init.ones_(p)
      else:   # GPT-2: normal(0.02), residual projections scaled by 1/sqrt(2L)
        std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
        nn.init.normal_(p, std=std)

  def forward(self, tokens_BxT: torch.Tensor) -> torch.Tensor:
    T = tokens_BxT.shape[1]
    x_BxTxD = self.wte(tokens_BxT) + self.wpe(torch.arange(T, device=tokens_BxT.device))
    for block in self.h:
      x_BxTxD = block(x_BxTxD)
    logits_BxTxVp = F.linear(self.ln_f(x_BxTxD), self.wte.weight)   # tied output projection
    return logits_BxTxVp[..., :self.vocab]


def gpt2_small() -> dict:
  """GPT-2 small = ANDREA-120M: 12 layers, 12 heads, d_model 768, MLP 3072, context 1024."""
  return dict(vocab=50257, max_len=1024, layers=12, heads=12, d=768, d_mlp=3072)


def tiny() -> dict:
  return dict(vocab=257, max_len=64, layers=2, heads=2, d=64, d_mlp=256)


VARIANTS = ("compiled-loss", "eager-loss")


def _flash_only() -> str:
  """Leaves only the flash SDPA backend on (the GPU); the name of what runs."""
  try:
    torch.backends.cuda.enable_flash_sdp(True)
    for off in ("enable_mem_efficient_sdp", "enable_math_sdp", "enable_cudnn_sdp"):
      if hasattr(torch.backends.cuda, off):
        getattr(torch.backends.cuda, off)(False)
    return "flash SDPA"
  except (AttributeError, RuntimeError) as e:
    return f"default SDPA ({type(e).__name__} turning flash on)"


def measure(shape: dict, batch: int, seq_len: int, steps: int, device: str,
            compile_model: bool = True, variant: str = "compiled-loss") -> dict:
  """Time ``steps`` training steps after two warm-up steps; tokens/s, peak memory, compile time."""
  torch.manual_seed(0)
  model = GPT2(**shape).to(device)
  decay = [p for p in model.parameters() if p.dim() >= 2]
  no_decay = [p for p in model.parameters() if p.dim() < 2]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")
  sdpa = _flash_only() if device == "cuda" else "SDPA"
  vocab = shape["vocab"]

  def loss_of(m, inputs, targets):
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
      logits = m(inputs)
    return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))

  if variant == "compiled-loss":
    eager = lambda inputs, targets: loss_of(model, inputs, targets)
    what = "torch.compile (model and loss)"
  else:
    eager = None
    what = "torch.compile (model), loss eager"
  compiled, note = None, what if compile_model else "eager"
  if compile_model:
    try:
      compiled = torch.compile(eager) if eager else torch.compile(model)
    except Exception as e:  # pylint: disable=broad-except -- the table says it ran eager
      note = f"eager (compile failed: {type(e).__name__})"
  gen = torch.Generator(device="cpu").manual_seed(1)
  tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen).to(device)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]

  def step(c):
    # (``is None``: a compiled module has no truth value)
    if variant == "compiled-loss":
      loss = (eager if c is None else c)(inputs, targets)
    else:
      loss = loss_of(model if c is None else c, inputs, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=device == "cuda")
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  t0 = time.perf_counter()
  try:
    step(compiled)
  except Exception as e:  # pylint: disable=broad-except -- inductor needs a working C++ toolchain
    if compiled is None:
      raise
    compiled, note = None, f"eager (compile failed: {type(e).__name__})"
    step(compiled)
  step(compiled)
  sync()
  compile_s = time.perf_counter() - t0
  if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
  t0 = time.perf_counter()
  for _ in range(steps):
    loss = step(compiled)
  sync()
  elapsed = time.perf_counter() - t0
  return {"tokens_per_s": batch * seq_len * steps / elapsed, "step_s": elapsed / steps,
          "compile_s": compile_s, "loss": float(loss.detach()),
          "peak_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
          "mode": f"{note}, {sdpa}, bf16 autocast, fused AdamW" if device == "cuda" else note,
          "variant": variant,
          "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
          "torch": torch.__version__}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="fewer timed steps")
  ap.add_argument("--cpu", action="store_true", help="tiny model on the CPU (checks the script)")
  ap.add_argument("--json", action="store_true", help="print one JSON line")
  ap.add_argument("--batch", type=int, default=None)
  ap.add_argument("--seq_len", type=int, default=None)
  ap.add_argument("--steps", type=int, default=0, help="timed steps (after 2 warm-up steps)")
  ap.add_argument("--no_compile", action="store_true", help="skip torch.compile")
  ap.add_argument("--variant", default="compiled-loss", choices=VARIANTS,
                  help="compiled-loss: the loss inside torch.compile (the yardstick); eager-loss: "
                       "the earlier yardstick, the loss outside")
  args = ap.parse_args()
  if args.cpu or not torch.cuda.is_available():
    if not args.cpu:
      print("no CUDA GPU: nothing to measure (use --cpu to check the script on a tiny model)")
      return
    device, shape = "cpu", tiny()
    torch.set_num_threads(1)   # a check, not a speed: OpenMP threads spinning on a busy CPU cost 50x
    batch, seq_len = args.batch or 4, args.seq_len or 64
  else:
    device, shape = "cuda", gpt2_small()
    batch, seq_len = args.batch or 64, args.seq_len or 1024
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
  steps = args.steps or (3 if args.quick and device == "cpu" else (10 if args.quick else 25))
  r = measure(shape, batch, seq_len, steps, device, compile_model=not args.no_compile,
              variant=args.variant)
  r.update(batch=batch, seq_len=seq_len, steps=steps)
  if args.json:
    print(json.dumps(r))
    return
  print(f"device: {r['device']}; torch {r['torch']}; {r['mode']}; B={batch} T={seq_len}, "
        f"{steps} timed steps")
  print(f"{'model':12s} {'tokens/s':>12s} {'step ms':>9s} {'peak GiB':>9s} {'compile s':>10s}")
  peak = f"{r['peak_bytes'] / 2**30:.2f}" if r["peak_bytes"] else "n/a"
  print(f"{'gpt2-small' if device == 'cuda' else 'tiny':12s} {r['tokens_per_s']:>12,.0f} "
        f"{1e3 * r['step_s']:>9.1f} {peak:>9s} {r['compile_s']:>10.1f}")


if __name__ == "__main__":
  main()
