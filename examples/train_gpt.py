"""Train a tiny character-level GPT on the Python standard library's own source, on the lazy device.

    python examples/train_gpt.py                          # ~50 s on 2 idle cores
    python examples/train_gpt.py --steps 3000 --d 128 --layers 4 --block 128 --dropout 0.1
    OMP_NUM_THREADS=1 python examples/train_gpt.py        # on a busy machine: spinning OpenMP threads cost ~10x
    torchrun --nproc_per_node=2 examples/train_gpt.py --ddp   # data parallel: DistributedDataParallel on lazy
    LAZY_BACKING_DEVICE=cuda torchrun --nproc_per_node=2 examples/train_gpt.py --ddp   # one GPU per rank, NCCL

The text is a fixed list of stdlib modules (textwrap.py, argparse.py, ...), read from the running interpreter's
library, so it exists on every machine. The script prints the unigram (per-character) entropy of that text: a
model that ignores context cannot beat it, so training loss well below it shows the GPT is using its context.
AdamW with linear warmup then cosine decay, gradient clipping at 1.0, tied input/output embeddings; each step is
one lazy graph (compiled once, then served from the graph cache). At the end the model is evaluated on held-out
text and samples a continuation of a prompt.

With ``--ddp`` (under torchrun) each rank trains on its own batches of ``--batch`` sequences and
DistributedDataParallel averages the gradients: the process group is lazy's ("lazy": gloo for a cpu backing device,
NCCL for cuda, one GPU per rank), and the gradient all-reduces are recorded into each step's graph. Only rank 0
prints; the loss shown is the mean over the ranks.
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import lazy

# NOTE: a fixed list (not a directory listing) so the corpus is the same from run to run; exact sizes vary a
# little between Python versions.
MODULES = ("textwrap", "argparse", "difflib", "functools", "heapq", "string", "shlex", "fractions", "contextlib",
           "random")


def load_text() -> str:
    libdir = os.path.dirname(os.__file__)
    parts = []
    for name in MODULES:
        with open(os.path.join(libdir, name + ".py"), encoding="utf-8") as f:
            parts.append(f.read())
    return "\n".join(parts)


def unigram_entropy(data: torch.Tensor, vocab: int) -> float:
    """Entropy in nats of the character frequencies: the loss of the best context-free model."""
    p = torch.bincount(data, minlength=vocab).double() / data.numel()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, block: int, dropout: float) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Parameter(torch.zeros(block, d))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(d, heads, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight       # tied: one Parameter, updated by both uses
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))   # GPT-2's scaled residual init

    def forward(self, idx):
        x = self.drop(self.tok_emb(idx) + self.pos_emb[: idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln(x))


def lr_at(step: int, steps: int, warmup: int, lr: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))   # cosine down to lr / 10


def get_batch(data: torch.Tensor, batch: int, block: int, device: str, gen=None) -> tuple:
    starts = torch.randint(0, data.numel() - block - 1, (batch,), generator=gen)
    offsets = torch.arange(block)
    x = data[starts[:, None] + offsets]
    y = data[starts[:, None] + offsets + 1]
    return x.to(device), y.to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--block", type=int, default=64, help="context length in characters")
    parser.add_argument("--d", type=int, default=64, help="model width")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=6e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--sample-chars", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--device", default="lazy", help="'cpu' runs the same loop eagerly, for comparison")
    parser.add_argument("--ddp", action="store_true", help="data parallel over the processes torchrun starts")
    args = parser.parse_args()

    rank, world, shard_gen = 0, 1, None
    if args.ddp:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if args.device == "lazy" and lazy.config.backing_device.startswith("cuda"):
            lazy.config.backing_device = f"cuda:{local_rank}"   # one GPU per rank
            torch.cuda.set_device(local_rank)
        dist.init_process_group("lazy" if args.device == "lazy" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        shard_gen = torch.Generator().manual_seed(1000 + rank)   # each rank draws its own batches
    say = print if rank == 0 else (lambda *a, **k: None)

    torch.manual_seed(0)
    text = load_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.9 * data.numel())
    train, val = data[:split], data[split:]
    entropy = unigram_entropy(train, len(chars))
    say(f"text: {len(MODULES)} stdlib modules, {len(text) / 1000:.0f} K chars, vocab {len(chars)}; unigram "
        f"entropy {entropy:.3f} nats = {entropy / math.log(2):.3f} bits/char (uniform: {math.log(len(chars)):.3f})")

    model = GPT(len(chars), args.d, args.heads, args.layers, args.block, args.dropout).to(args.device)
    say(f"model: {sum(p.numel() for p in model.parameters()) / 1e3:.0f} K parameters, d={args.d}, "
        f"{args.layers} layers, {args.heads} heads, block {args.block}, batch {args.batch}"
        + (f" per rank x {world} ranks" if args.ddp else ""))
    net = torch.nn.parallel.DistributedDataParallel(model) if args.ddp else model
    # NOTE: no weight decay on biases, LayerNorm weights and the positional embedding, as in nanoGPT.
    decay = [p for p in model.parameters() if p.dim() == 2 and p is not model.pos_emb]
    no_decay = [p for p in model.parameters() if p.dim() < 2 or p is model.pos_emb]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, args.steps, args.warmup, args.lr) / args.lr)

    model.train()
    # NOTE: the running sum of the loss stays on the device and is part of each step's graph, so averaging the
    # loss over the log window costs no extra sync; it is read only when a progress line is printed.
    loss_sum = torch.zeros((), device=args.device)
    seen = last_sum = 0.0
    start = last = time.perf_counter()
    for step in range(args.steps):
        xb, yb = get_batch(train, args.batch, args.block, args.device, shard_gen)
        logits = net(xb)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), yb.view(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if args.ddp:  # the mean over the ranks, all-reduced inside the step's graph
            shown = loss.detach().clone()
            dist.all_reduce(shown)
            loss_sum += shown / world
        else:
            loss_sum += loss.detach()
        lazy.mark_step()
        if step % args.log_every == 0 or step == args.steps - 1:
            now = time.perf_counter()
            rate = (args.log_every if step else 1) / (now - last)
            last = now
            total = loss_sum.item()
            mean_loss, last_sum, seen = (total - last_sum) / (step + 1 - seen), total, step + 1
            say(f"step {step:5d}  loss {mean_loss:.4f}  {rate:7.1f} steps/s  "
                f"{lazy.metrics.cache_summary()}")
    train_time = time.perf_counter() - start

    model.eval()
    g = torch.Generator().manual_seed(1)
    total = torch.zeros((), device=args.device)
    batches = 20
    with torch.no_grad():
        for _ in range(batches):
            starts = torch.randint(0, val.numel() - args.block - 1, (args.batch,), generator=g)
            offsets = torch.arange(args.block)
            xb = val[starts[:, None] + offsets].to(args.device)
            yb = val[starts[:, None] + offsets + 1].to(args.device)
            logits = model(xb)
            total += F.cross_entropy(logits.view(-1, logits.shape[-1]), yb.view(-1))
            lazy.mark_step()
    val_loss = total.item() / batches
    say("(loss: mean training loss since the previous line, in nats)")
    say(f"done: trained in {train_time:.1f} s; held-out loss {val_loss:.3f} nats = {val_loss / math.log(2):.3f} "
        f"bits/char vs unigram entropy {entropy:.3f} nats = {entropy / math.log(2):.3f} bits/char")

    # Sampling stays on the training device. NOTE: on lazy every token is a sync (its probabilities are copied to
    # the CPU, where the next character is drawn), so this loop runs one small graph per token. The context is
    # always the last `block` characters of a prompt at least that long, so every step has the same shape and the
    # graph compiles once; a growing context would compile once per length.
    prompt = val[: args.block].tolist()
    context = list(prompt)
    with torch.no_grad():
        for _ in range(args.sample_chars if rank == 0 else 0):   # rank 0 samples, the others are done
            idx = torch.tensor([context[-args.block:]], device=args.device)
            logits = model(idx)[0, -1] / args.temperature
            probs = F.softmax(logits, dim=-1).cpu()
            context.append(int(torch.multinomial(probs, 1, generator=g)))
    say("--- prompt " + "-" * 60)
    say("".join(chars[i] for i in prompt))
    say("--- sample " + "-" * 60)
    say("".join(chars[i] for i in context[len(prompt):]))
    say("-" * 71)
    say(lazy.metrics.report())
    if args.ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
