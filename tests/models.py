"""Small models shared by the training tests, examples and benchmarks."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, features: int = 20, hidden: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 8, 3)
        self.bn2 = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.gn(self.bn2(self.conv2(x))))
        return self.fc(x.flatten(1))


class Encoder(nn.Module):
    def __init__(self, vocab: int = 13, d: int = 16, classes: int = 3, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.layer = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=32, dropout=dropout, batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, idx):
        return self.head(self.layer(self.embed(idx)).mean(1))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyGPT(nn.Module):
    """A character-level GPT with tied input/output embeddings."""

    def __init__(self, vocab: int = 17, d: int = 16, heads: int = 2, layers: int = 1, block: int = 8,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(block, d) * 0.02)
        self.blocks = nn.ModuleList([Block(d, heads, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.tok.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.2 / math.sqrt(p.shape[-1]))

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln(x))


class GPT2Block(nn.Module):
    """Hugging Face GPT-2's attention block as its modelling code writes it: a fused qkv projection, SDPA with an
    explicit ``scale=`` and ``dropout_p`` only in training, residual dropout, pre-norm, GELU (tanh)."""

    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in self.c_attn(self.ln_1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True,
                                           scale=1.0 / math.sqrt(hd))
        x = x + self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.resid_dropout(self.mlp(self.ln_2(x)))


class GPT2Like(nn.Module):
    """GPT-2's shape in small: token and position embeddings, GPT2Blocks, a final norm, a head tied to the token
    embedding."""

    def __init__(self, vocab: int = 17, d: int = 16, heads: int = 2, layers: int = 2, block: int = 8,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([GPT2Block(d, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def batch(kind: str, step: int, device: str = "cpu", size: int = 8) -> tuple:
    """A deterministic (inputs, targets) batch for a model kind, on ``device``."""
    g = torch.Generator().manual_seed(1000 + step)
    if kind == "mlp":
        x, y = torch.randn(size, 20, generator=g), torch.randint(0, 5, (size,), generator=g)
    elif kind == "cnn":
        x, y = torch.randn(size, 1, 12, 12, generator=g), torch.randint(0, 4, (size,), generator=g)
    elif kind == "encoder":
        x, y = torch.randint(0, 13, (size, 6), generator=g), torch.randint(0, 3, (size,), generator=g)
    else:
        seq = torch.randint(1, 17, (size, 9), generator=g)
        x, y = seq[:, :-1], seq[:, 1:]
    return x.to(device), y.to(device)


def loss_fn(kind: str, out, y):
    if kind == "gpt":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=3, label_smoothing=0.1)
    return F.cross_entropy(out, y)


MODELS = {"mlp": MLP, "cnn": CNN, "encoder": Encoder, "gpt": TinyGPT}
