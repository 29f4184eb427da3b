"""What a ray run leaves behind, and how joining a cluster answers.

1. A killed driver: `jaxdl run --engine ray` on a local instance, SIGKILLed
   once its actors are up (cluster.json written); seconds until each
   process of its Ray instance (the driver's descendants) has ended.
2. Joining a token-protected head (on the loopback address, RAY_AUTH_MODE
   unset for jaxdl) with the head's token, a wrong one, none, and an address
   that answers but is not Ray: exit code, seconds, lines on stderr.

Measures whatever code is installed: run it on two commits to compare.

  python -m bench.ray_cluster --repeats 3
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import tyro

RUN = [sys.executable, "-m", "jaxdl", "run", "--algorithm", "asp", "--engine", "ray",
       "--workers", "2", "--model", "mlp", "--batch-size", "16", "--no-progress"]
RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")


def _env(**settings: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
  return {**env, **settings}


def _running(p: psutil.Process) -> bool:
  try:
    return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def killed_driver(limit: float) -> dict[str, float]:
  """Seconds after the driver's SIGKILL at which each of its Ray processes
  was last seen running (polled every 0.1 s, up to `limit`)."""
  temp, out = tempfile.mkdtemp(prefix="ray", dir="/tmp"), Path(tempfile.mkdtemp()) / "run"
  run = subprocess.Popen(RUN + ["--steps", "100000", "--out", str(out)],
                         env=_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=temp),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  while not (out / "cluster.json").exists():
    assert run.poll() is None
    time.sleep(0.2)
  time.sleep(2)
  tree = [p for p in psutil.Process(run.pid).children(recursive=True) if _running(p)]
  names = {p.pid: f"{p.name()} {p.pid}" for p in tree}
  run.kill()
  start = time.monotonic()
  seen = {pid: 0.0 for pid in names}
  while tree and time.monotonic() - start < limit:
    tree = [p for p in tree if _running(p)]
    seen.update({p.pid: time.monotonic() - start for p in tree})
    time.sleep(0.1)
  for p in tree:  # still running at the limit
    p.kill()
  return {names[pid]: t for pid, t in sorted(seen.items(), key=lambda kv: kv[1])}


def joins(home: Path, scratch: Path, timeout: float) -> None:
  """Starts a token-protected head, joins it four ways (each killed after
  `timeout` s: exit code -9), stops it by pid."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
  head_env = _env(HOME=str(home), RAY_TMPDIR=temp, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
  subprocess.run([RAY_CLI, "get-auth-token", "--generate"], env=head_env, check=True,
                 capture_output=True)
  silent = socket.create_server(("127.0.0.1", 0))  # answers, says nothing
  try:
    subprocess.run([RAY_CLI, "start", "--head", "--node-ip-address=127.0.0.1",
                    f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], env={**head_env, "RAY_AUTH_MODE": "token"},
                   check=True, capture_output=True)
    cases = {"the head's token": ({}, port),
             "a wrong token": ({"RAY_AUTH_TOKEN": "0" * 64}, port),
             "no token": ({"HOME": str(scratch)}, port),
             "not a Ray cluster": ({}, silent.getsockname()[1]),
             "no port (start-up)": ({}, "")}  # before any connection: the command's start-up
    print(f"\n{'joining with':<20}{'exit':>6}{'seconds':>9}{'stderr lines':>14}")
    for case, (settings, at) in cases.items():
      start = time.monotonic()
      run = subprocess.Popen(RUN + ["--steps", "6", "--out", str(scratch / case.replace(" ", "-")),
                                    "--ray-address", f"127.0.0.1:{at}"],
                             env={**head_env, "TMPDIR": str(scratch), **settings},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
      try:
        stderr = run.communicate(timeout=timeout)[1]
      except subprocess.TimeoutExpired:
        run.kill()
        stderr = run.communicate()[1]
      lines = stderr.strip().splitlines()
      print(f"{case:<20}{run.returncode:>6}{time.monotonic() - start:>9.1f}{len(lines):>14}")
      print("   ", lines[-1][:300] if lines else "")
  finally:
    silent.close()
    heads = [p for p in psutil.process_iter(["cmdline"]) if temp in " ".join(
        p.info["cmdline"] or [])]
    for p in {p for h in heads for p in [h, *h.children(recursive=True)]}:
      p.kill()


def main(repeats: int = 3, limit: float = 300.0) -> None:
  """`repeats` killed drivers, then the four joins (`limit`: seconds any
  of them may take)."""
  print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
  for r in range(repeats):
    seen = killed_driver(limit)
    print(f"killed driver {r}: last process seen {max(seen.values()):.1f} s after the kill")
    print("   ", ", ".join(f"{name} {t:.1f} s" for name, t in seen.items()))
  with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as scratch:
    joins(Path(home), Path(scratch), limit)
  print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  tyro.cli(main)
