"""Train a small convnet to tell procedurally drawn shapes apart, on the lazy device.

    python examples/train_cnn.py               # ~20 s on 2 idle cores
    python examples/train_cnn.py --steps 1000 --channels 32 --noise 0.5
    OMP_NUM_THREADS=1 python examples/train_cnn.py   # on a busy machine: spinning OpenMP threads cost ~10x

Each 16x16 image holds one shape (square outline, disc, cross, line at a random angle, ring) at a random position
and size, with random brightness and Gaussian noise; the label is the shape. The net is Conv2d + BatchNorm2d + ReLU
+ max pooling, twice, then one more conv block, global average pooling and a Linear head. Training runs in train
mode (BatchNorm updates its running statistics inside the lazy graph); accuracy on held-out images is measured in
eval mode under no_grad.
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy

SHAPES = ("square", "disc", "cross", "line", "ring")


def draw(shape: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One ``size`` x ``size`` image of ``shape`` at a random position and scale, values in [0, 1] before noise."""
    r = rng.uniform(2.5, size / 3)                       # half-extent of the shape in pixels
    cy, cx = rng.uniform(r, size - 1 - r, size=2)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    dy, dx = y - cy, x - cx
    dist = np.hypot(dy, dx)
    if shape == "square":
        cheb = np.maximum(abs(dy), abs(dx))
        img = (abs(cheb - r) < 0.75)
    elif shape == "disc":
        img = dist <= r
    elif shape == "cross":
        img = ((abs(dy) < 0.8) & (abs(dx) <= r)) | ((abs(dx) < 0.8) & (abs(dy) <= r))
    elif shape == "line":
        angle = rng.uniform(0, np.pi)
        along = dx * np.cos(angle) + dy * np.sin(angle)
        across = -dx * np.sin(angle) + dy * np.cos(angle)
        img = (abs(across) < 0.7) & (abs(along) <= r)
    else:                                                # ring: a circle outline
        img = abs(dist - r) < 0.75
    return img.astype(np.float32) * rng.uniform(0.6, 1.0)


def make_data(n: int, size: int, noise: float, seed: int) -> tuple:
    """``n`` images (n, 1, size, size) with labels in [0, len(SHAPES)), balanced and shuffled."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % len(SHAPES))
    images = np.stack([draw(SHAPES[k], size, rng) for k in labels])
    images += rng.normal(0.0, noise, images.shape).astype(np.float32)
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels).long()


class ConvNet(nn.Module):
    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        c = channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(2 * c, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--size", type=int, default=16, help="image side in pixels")
    parser.add_argument("--noise", type=float, default=0.3, help="std of the Gaussian pixel noise")
    parser.add_argument("--train-images", type=int, default=10000)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--device", default="lazy", help="'cpu' runs the same loop eagerly, for comparison")
    args = parser.parse_args()

    torch.manual_seed(0)
    images, labels = make_data(args.train_images, args.size, args.noise, seed=1)
    test_images, test_labels = make_data(args.test_images, args.size, args.noise, seed=2)
    print(f"{len(SHAPES)} shapes {SHAPES}, {args.train_images} train / {args.test_images} test images of "
          f"{args.size}x{args.size}, chance accuracy {1 / len(SHAPES):.0%}")
    model = ConvNet(args.channels, len(SHAPES)).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)

    model.train()
    start = last = time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, images.shape[0], (args.batch,))
        xb, yb = images[idx].to(args.device), labels[idx].to(args.device)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        lazy.mark_step()
        if step % args.log_every == 0 or step == args.steps - 1:
            now = time.perf_counter()
            rate = (args.log_every if step else 1) / (now - last)
            last = now
            print(f"step {step:5d}  loss {loss.item():.4f}  {rate:7.1f} steps/s  "
                  f"{lazy.metrics.cache_summary()}")
    train_time = time.perf_counter() - start

    # NOTE: eval mode makes BatchNorm use the running statistics gathered during training; evaluating in
    # fixed-size chunks keeps every eval graph the same shape, so only the first one compiles.
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=args.device)
    chunk = 250
    with torch.no_grad():
        for i in range(0, test_images.shape[0], chunk):
            xb, yb = test_images[i:i + chunk].to(args.device), test_labels[i:i + chunk].to(args.device)
            correct += (model(xb).argmax(1) == yb).sum()
            lazy.mark_step()
    accuracy = correct.item() / test_images.shape[0]
    print(f"done: trained in {train_time:.1f} s, test accuracy {accuracy:.1%} (chance {1 / len(SHAPES):.0%})")
    print(lazy.metrics.report())


if __name__ == "__main__":
    main()
