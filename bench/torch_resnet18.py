"""A PyTorch baseline for jaxdl's GPU step timings: ResNet-18 (CIFAR layout).

Trains torchvision's ResNet-18 with the CIFAR stem (3x3 conv stride 1, no max
pool; the layout of jaxdl's `resnet18` with stem "cifar", 11,173,962
parameters on 32x32x3 with 10 classes) on random CIFAR-shaped data already on
the GPU: cross-entropy, SGD(lr 0.01, momentum 0.9), zero_grad / forward /
backward / step. Prints ms per step and samples/s per arm, so a figure taken on
the same card can sit beside jaxdl's (bench/single_step.py --cases
resnet18:32:256).

Arms: `fp32` (PyTorch's defaults; the TF32 flags are printed, since cuDNN
convolutions run in TF32 on Ampere and later unless turned off), `fp32-ieee`
(TF32 off for convolutions and matmuls; not run by default) and `bf16`
(torch.autocast to bfloat16 around forward and loss, parameters in fp32).
The arms alternate within every round; each arm's figure is its median over
rounds. channels_last and cudnn.benchmark are on by default.

Needs torch; uses torchvision when it is installed, else the same network
defined here (the two have the same parameter names and shapes). It imports
neither jax nor jaxdl: it runs in a process of its own. Without torch or
without a CUDA device it says so and exits 0; `--on-cpu` runs the arms on the
CPU instead (a check of the script itself, not a baseline).

  python -m bench.torch_resnet18                       # fp32 and bf16, batch 256
  python -m bench.torch_resnet18 --batch 512 --compile
  python -m bench.torch_resnet18 --arms fp32 fp32-ieee bf16
  python -m bench.torch_resnet18 --on-cpu --batch 8 --warmup 1 --steps 2 --rounds 2
"""
from __future__ import annotations

import contextlib
import dataclasses
import platform
import statistics
import sys
import time
from typing import Literal

import tyro

PARAMS = 11_173_962
"""jaxdl's resnet18 (stem "cifar") on 32x32x3 with 10 classes."""

Arm = Literal["fp32", "fp32-ieee", "bf16"]


@dataclasses.dataclass(frozen=True)
class Args:
  batch: int = 256
  """Samples per step."""
  arms: tuple[Arm, ...] = ("fp32", "bf16")
  """Precision arms: fp32 (PyTorch defaults), fp32-ieee (TF32 off), bf16 (autocast)."""
  warmup: int = 10
  """Untimed steps per arm before the first round (cudnn.benchmark picks kernels here)."""
  steps: int = 30
  """Steps per arm per round."""
  rounds: int = 7
  """Rounds; each arm's figure is its median over rounds."""
  channels_last: bool = True
  """Model and inputs in channels_last (NHWC) memory format."""
  compile: bool = False
  """torch.compile the model (slow to start: adds tens of seconds per arm)."""
  torchvision: bool = True
  """Build the model with torchvision when it is installed (else the definition here)."""
  on_cpu: bool = False
  """Without a CUDA device, run the arms on the CPU (a check of the script)."""
  seed: int = 0
  """Seed of the weights and of the random batch."""


def local_resnet18(nn, num_classes: int = 10):
  """ResNet-18 with the CIFAR stem, written out: torchvision's module names,
  shapes and initialization, without torchvision."""

  class BasicBlock(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
      super().__init__()
      self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(width)
      self.relu = nn.ReLU(inplace=True)
      self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
      self.bn2 = nn.BatchNorm2d(width)
      self.downsample = None
      if stride != 1 or cin != width:
        self.downsample = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False),
                                        nn.BatchNorm2d(width))

    def forward(self, x):
      y = self.relu(self.bn1(self.conv1(x)))
      y = self.bn2(self.conv2(y))
      shortcut = x if self.downsample is None else self.downsample(x)
      return self.relu(y + shortcut)

  class ResNet18(nn.Module):
    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(64)
      self.relu = nn.ReLU(inplace=True)
      self.maxpool = nn.Identity()
      cin = 64
      for i in range(4):
        width = 64 * 2**i
        stride = 1 if i == 0 else 2
        setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, width, stride),
                                                     BasicBlock(width, width, 1)))
        cin = width
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.fc = nn.Linear(512, num_classes)
      for m in self.modules():
        if isinstance(m, nn.Conv2d):
          nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
      x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
      x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
      return self.fc(self.avgpool(x).flatten(1))

  return ResNet18()


def resnet18_cifar(nn, use_torchvision: bool, num_classes: int = 10):
  """-> (model, where it came from). BN: eps 1e-5, momentum 0.1 (flax's 0.9)."""
  if use_torchvision:
    try:
      import torchvision
    except ImportError:
      pass
    else:
      model = torchvision.models.resnet18(num_classes=num_classes)
      model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
      nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
      model.maxpool = nn.Identity()
      return model, f"torchvision {torchvision.__version__}"
  return local_resnet18(nn, num_classes), "defined in bench/torch_resnet18.py"


def machine(torch, device) -> str:
  if device.type == "cuda":
    cudnn = torch.backends.cudnn.version()
    return (f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, cuDNN {cudnn}")
  return (f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} "
          f"threads, torch {torch.__version__}")


def precision_flags(torch) -> str:
  """The TF32 switches as PyTorch has them now (what fp32 convs and matmuls use)."""
  flags = (f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}, "
           f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}")
  conv = getattr(torch.backends.cudnn, "conv", None)
  if conv is not None and hasattr(conv, "fp32_precision"):  # torch >= 2.9
    flags += (f", cudnn.conv.fp32_precision={conv.fp32_precision!r}, "
              f"cuda.matmul.fp32_precision={torch.backends.cuda.matmul.fp32_precision!r}")
  return flags


@contextlib.contextmanager
def tf32_off(torch):
  saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
  torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
  try:
    yield
  finally:
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def make_arm(torch, arm: str, args: Args, device, images, labels):
  """One arm's model, optimizer and `run(n)`: n training steps, then wait for
  the device. Returns (run, last loss)."""
  nn = torch.nn
  torch.manual_seed(args.seed)
  model, _ = resnet18_cifar(nn, args.torchvision)
  model = model.to(device)
  if args.channels_last:
    model = model.to(memory_format=torch.channels_last)
  model.train()
  optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
  forward = torch.compile(model) if args.compile else model
  loss_fn = nn.CrossEntropyLoss()
  autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if arm == "bf16" \
      else contextlib.nullcontext
  flags = (lambda: tf32_off(torch)) if arm == "fp32-ieee" else contextlib.nullcontext
  sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
  last = [float("nan")]

  def run(n: int):
    with flags():
      for _ in range(n):
        optimizer.zero_grad(set_to_none=True)
        with autocast():
          loss = loss_fn(forward(images), labels)
        loss.backward()
        optimizer.step()
        last[0] = loss.detach()
      sync()

  return run, last


def main(args: Args) -> int:
  try:
    import torch
  except ImportError:
    print("torch is not installed: the PyTorch ResNet-18 baseline needs it; skipped")
    return 0
  if torch.cuda.is_available():
    device = torch.device("cuda", torch.cuda.current_device())
  elif args.on_cpu:
    device = torch.device("cpu")
  else:
    print(f"no CUDA device on this machine (torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}): the PyTorch baseline needs one; "
          "skipped (--on-cpu runs the arms on the CPU)")
    return 0

  torch.backends.cudnn.benchmark = True
  print(f"machine: {machine(torch, device)}")
  model, source = resnet18_cifar(torch.nn, args.torchvision)
  count = sum(p.numel() for p in model.parameters())
  check = "matches jaxdl's resnet18 (cifar stem)" if count == PARAMS else \
      f"DIFFERS from jaxdl's {PARAMS:,}"
  print(f"model: resnet18, cifar stem, {source}; {count:,} parameters, {check}")
  print(f"precision flags (fp32 arm): {precision_flags(torch)}")
  print(f"batch {args.batch}, 32x32x3, 10 classes; channels_last={args.channels_last}, "
        f"compile={args.compile}, cudnn.benchmark=True; warmup {args.warmup}, "
        f"{args.rounds} rounds x {args.steps} steps per arm")
  if count != PARAMS:
    return 1

  gen = torch.Generator().manual_seed(args.seed)
  images = torch.randn(args.batch, 3, 32, 32, generator=gen).to(device)
  labels = torch.randint(0, 10, (args.batch,), generator=gen).to(device)
  if args.channels_last:
    images = images.contiguous(memory_format=torch.channels_last)

  arms = {arm: make_arm(torch, arm, args, device, images, labels) for arm in args.arms}
  start = time.perf_counter()
  for run, _ in arms.values():
    run(args.warmup)
  warm_s = time.perf_counter() - start
  times: dict[str, list[float]] = {arm: [] for arm in arms}
  for _ in range(args.rounds):
    for arm, (run, _) in arms.items():
      t = time.perf_counter()
      run(args.steps)  # ends in torch.cuda.synchronize() on a GPU
      times[arm].append((time.perf_counter() - t) / args.steps)

  print(f"\nresnet18 cifar, 32x32x3, batch {args.batch}, {device.type} "
        f"(warm-up {warm_s:.1f} s)")
  print(f"{'arm':<12}{'min ms':>10}{'median ms':>12}{'samples/s':>12}{'last loss':>11}")
  for arm, ts in times.items():
    median = statistics.median(ts)
    loss = float(arms[arm][1][0])
    print(f"{arm:<12}{min(ts) * 1e3:>10.3f}{median * 1e3:>12.3f}"
          f"{args.batch / median:>12.0f}{loss:>11.4f}")
  return 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
