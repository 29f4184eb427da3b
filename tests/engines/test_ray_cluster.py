"""Where a ray run's processes live: a token-protected cluster started as the
docs say (docs/engines/ray.md), joined with its token and refused without it in one line; and
a local instance whose processes all end with a killed driver."""
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from jaxdl.engines import ray_cluster, ray_driver
from jaxdl.errors import ConfigError
from tests import marks
from tests.helpers import jaxdl_command

RAY_DOCS = Path(__file__).resolve().parents[2] / "docs" / "engines" / "ray.md"
RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
RUN = ("run", "--algorithm", "asp", "--engine", "ray", "--workers", "2", "--model", "mlp",
       "--batch-size", "16", "--no-progress")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _processes_of(temp: str) -> list[psutil.Process]:
  """The processes whose command line names `temp` (a Ray instance's directory)."""
  found = []
  for p in psutil.process_iter(["cmdline"]):
    try:
      if temp in " ".join(p.info["cmdline"] or []):
        found.append(p)
    except psutil.Error:
      pass
  return found


def _running(p: psutil.Process) -> bool:
  try:
    return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _ended(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
  """Waits up to `timeout` s for `processes` to end; those still running."""
  deadline = time.monotonic() + timeout
  while any(_running(p) for p in processes) and time.monotonic() < deadline:
    time.sleep(0.1)
  return [p for p in processes if _running(p)]


def _kill(processes: list[psutil.Process]) -> list[psutil.Process]:
  """SIGKILL to each of `processes` still running; those running 10 s later."""
  for p in processes:
    try:
      p.kill()
    except psutil.NoSuchProcess:
      pass
  return _ended(processes, 10)


def _env(**settings: str | None) -> dict[str, str]:
  """This process's environment with `settings` (None: unset)."""
  env = dict(os.environ)
  for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
    env.pop(name, None)
  env.update({k: v for k, v in settings.items() if v is not None})
  return env


def _documented_cluster_commands() -> list[str]:
  """The lines of the ray page's bash block that starts a cluster."""
  text = RAY_DOCS.read_text()
  blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
  [block] = [b for b in blocks if "ray start --head" in b]
  return [line for line in block.splitlines() if line and not line.startswith("#")]


class Head:
  """A Ray head on the loopback address, started as the docs say, with
  its own token (in `home`/.ray) and its own directory."""

  def __init__(self, home: Path):
    self.home, self.temp, port = home, tempfile.mkdtemp(prefix="ray", dir="/tmp"), _free_port()
    self.address, self.port = f"127.0.0.1:{port}", port
    self.env = _env(HOME=str(home), RAY_TMPDIR=self.temp, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")

  def start(self) -> None:
    [make_token, start] = [line for line in _documented_cluster_commands()
                           if "get-auth-token" in line or "ray start --head" in line]
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]  # its `ray`
    subprocess.run(["bash", "-c", make_token], env={**self.env, "PATH": path}, check=True,
                   capture_output=True, timeout=60)
    self.token = (self.home / ".ray" / "auth_token").read_text()
    assert start.startswith("RAY_AUTH_MODE=token ray start --head")
    subprocess.run([RAY_CLI, "start", "--head", "--node-ip-address=127.0.0.1",
                    f"--port={self.port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], env={**self.env, "RAY_AUTH_MODE": "token"},
                   check=True, capture_output=True, timeout=120)

  def stop(self) -> None:
    """Kills every process the head started (`ray stop` would stop every Ray
    instance on the machine), its raylet's children too."""
    heads = _processes_of(self.temp)
    tree = {p.pid: p for h in heads for p in [h, *h.children(recursive=True)]}
    assert not _kill(list(tree.values()))


@pytest.fixture(scope="module")
def head(tmp_path_factory):
  started = Head(tmp_path_factory.mktemp("home"))
  try:
    started.start()
    yield started
  finally:
    started.stop()
  assert not _processes_of(started.temp)


def test_the_documented_token_is_readable_by_its_owner_only(head):
  assert (head.home / ".ray").stat().st_mode & 0o777 == 0o700
  assert (head.home / ".ray" / "auth_token").stat().st_mode & 0o777 == 0o600
  assert re.fullmatch(r"[0-9a-f]{64}", head.token)  # 256 random bits
  commands = _documented_cluster_commands()
  assert any(c.startswith("RAY_AUTH_MODE=token ray start --address HEAD_IP:") for c in commands)


def _one_line_refusal(run: subprocess.CompletedProcess) -> tuple[str, str]:
  """A refused --ray-address: exit code 2 and one line on stderr, no
  traceback and none of Ray's log lines; the line and the log it names."""
  assert run.returncode == 2, run.stderr[-3000:]
  assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-3000:]
  line = run.stderr.strip()
  assert line.startswith("jaxdl run: error: --ray-address=")
  return line, Path(re.search(r"Ray's messages: (\S+)\)$", line).group(1)).read_text()


@pytest.mark.parametrize("token", [marks.slow("none here"), "wrong"])
def test_a_missing_or_wrong_token_is_one_line_naming_the_token(head, tmp_path, token):
  """jaxdl turns token authentication on by itself; without the head's
  token it says which token and how to pass it, and writes nothing."""
  home = tmp_path / "home" if token == "none here" else head.home  # no ~/.ray/auth_token
  env = _env(HOME=str(home), RAY_TMPDIR=head.temp, TMPDIR=str(tmp_path),
             RAY_AUTH_TOKEN="0" * 64 if token == "wrong" else None)
  out = tmp_path / "run"
  run = subprocess.run(jaxdl_command(*RUN, "--steps", "4", "--out", str(out), "--ray-address",
                                     head.address), env=env, capture_output=True, text=True,
                       timeout=300)
  line, log = _one_line_refusal(run)
  assert "~/.ray/auth_token" in line and "RAY_AUTH_TOKEN_PATH" in line
  if token == "wrong":
    assert "the cluster refused the token in RAY_AUTH_TOKEN" in line
    assert "InvalidAuthToken" in log  # Ray's own words, kept
  else:
    assert "token authentication is on (RAY_AUTH_MODE=token) and Ray finds no token" in line
    assert "couldn't find an authentication token" in log
  assert not out.exists()


def test_the_head_refuses_a_process_without_a_token(head, monkeypatch):
  monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # set by the user: jaxdl leaves it
  monkeypatch.setenv("HOME", str(head.home))
  with pytest.raises(ConfigError, match="the cluster asks for a token and "
                     "RAY_AUTH_MODE=disabled sends none: unset it"):
    ray_cluster.check_address(head.address)


@pytest.mark.slow
def test_a_run_joins_a_token_protected_head_with_its_token(head, tmp_path):
  """The token in ~/.ray/auth_token, RAY_AUTH_MODE unset: the run completes
  on the head's cluster."""
  out = tmp_path / "run"
  run = subprocess.run(jaxdl_command(*RUN, "--steps", "6", "--out", str(out), "--ray-address",
                                     head.address),
                       env=_env(HOME=str(head.home), RAY_TMPDIR=head.temp), capture_output=True,
                       text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert '"status": "completed"' in (out / "summary.json").read_text()
  assert not run.stderr.strip(), run.stderr[-3000:]  # nothing of Ray's


@pytest.fixture
def silent_server():
  """A TCP server that accepts connections and never says a word."""
  server = socket.create_server(("127.0.0.1", 0))
  accepted = []

  def accept():
    try:
      while True:
        accepted.append(server.accept()[0])
    except OSError:  # closed
      pass

  threading.Thread(target=accept, daemon=True).start()
  yield f"127.0.0.1:{server.getsockname()[1]}"
  server.close()
  for connection in accepted:
    connection.close()


def test_an_address_that_answers_but_is_not_a_ray_cluster_is_refused_at_once(silent_server):
  start = time.monotonic()
  with pytest.raises(ConfigError) as refused:
    ray_driver.connect(silent_server)  # Ray itself would retry for minutes, printing
  assert str(refused.value) == (
      f"--ray-address='{silent_server}' is not valid: the address HOST:PORT of a running Ray "
      "cluster (`ray start --head`); what answers there is not one (it does not speak gRPC, "
      "as a Ray cluster's GCS does)")
  assert time.monotonic() - start < 60


# A driver that starts a watchdog, then (as ray.init) a child whose own
# child outlives it (as the raylet's agents do), then one more child of its
# own after Ray's; prints their pids; then ends as the test says.
DRIVER = """
import subprocess, sys, time
from jaxdl.engines.ray_cluster import Watchdog
sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
watchdog = Watchdog()
spawner = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                            f"p = subprocess.Popen({sleep!r}, start_new_session=True); "
                            "print(p.pid, flush=True); time.sleep(300)"], stdout=subprocess.PIPE)
orphan = int(spawner.stdout.readline())
watchdog.started()
later = subprocess.Popen(sleep)
print(spawner.pid, orphan, later.pid, watchdog.process.pid, flush=True)
if sys.argv[1] == "stop":
  sys.stdin.readline()  # once the test holds the processes (ended ones have no pid to ask)
  watchdog.stop()
  print("stopped", flush=True)
time.sleep(300)
"""


def _line(process: subprocess.Popen, timeout: float = 120.0) -> str:
  """The first line `process` prints, within `timeout` s."""
  assert select.select([process.stdout], [], [], timeout)[0], "no line from the driver"
  return process.stdout.readline()


@pytest.mark.parametrize("ending", ["SIGKILL", "stop"])
def test_the_watchdog_kills_what_ray_started_and_nothing_else(ending):
  """Once the driver is killed, or stops it, the watchdog kills every
  process started as Ray's (the orphan of a child included) and ends; a
  child the driver started after Ray's lives on."""
  driver = subprocess.Popen([sys.executable, "-c", DRIVER, ending], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
  pids = []
  try:
    pids = [int(p) for p in _line(driver).split()]
    spawner, orphan, later, watchdog = [psutil.Process(p) for p in pids]
    if ending == "SIGKILL":
      driver.kill()
    else:
      driver.stdin.write("stop\n")
      driver.stdin.flush()
      assert _line(driver) == "stopped\n"
    assert not _ended([spawner, orphan, watchdog], 10)
    assert _running(later)
  finally:
    driver.kill()
    _kill([psutil.Process(p) for p in pids if psutil.pid_exists(p)])
    driver.communicate()  # its pipe closed (once its children, which share it, are gone)


def test_no_process_of_a_killed_drivers_ray_instance_outlives_it_by_10_s(tmp_path):
  """SIGKILL to a ray run's driver once its actors are up: every process of
  its local Ray instance (the GCS, the raylet, its agents, the actors'
  processes) is gone within 10 s."""
  temp, out = tempfile.mkdtemp(prefix="ray", dir="/tmp"), tmp_path / "run"
  run = subprocess.Popen(jaxdl_command(*RUN, "--steps", "100000", "--out", str(out)),
                         env=_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=temp),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  session = []
  try:
    deadline = time.monotonic() + 240
    while not (out / "cluster.json").exists():  # written once every actor is up
      assert run.poll() is None and time.monotonic() < deadline, run.stderr.read()[-3000:]
      time.sleep(0.2)
    session = psutil.Process(run.pid).children(recursive=True)
    names = {p.name() for p in session if _running(p)}
    assert {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
            "ray::Server"} <= names
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=60)
    alive = _ended(session, 10)
    assert not alive, sorted(p.name() for p in alive)
    assert not _processes_of(temp)
  finally:
    run.kill()
    _kill(session)
    run.communicate()  # its pipe closed (once its children, which share it, are gone)
