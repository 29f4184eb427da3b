"""One typed description of a run, validated before anything runs.

Sections group the fields for ``--help``; every field name is unique across
sections, so the command line stays flat (``--lr``, not ``--optim.lr``) and
`RunConfig.make(lr=0.1)` / `RunConfig.replace(...)` take flat names too.
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal

import tyro

from jaxdl.errors import ConfigError
from jaxdl.settings import SETTINGS, owners as setting_owners


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Data: which dataset, and how each worker batches it."""
  dataset: str = "digits"
  """digits (embedded, the default), mnist, fashion_mnist, synthetic, tfds:NAME (e.g. tfds:cifar10), npz:PATH."""
  data_dir: str | None = None
  """Directory with the dataset's files (IDX files for mnist/fashion_mnist; the tfds data_dir for tfds:NAME)."""
  image_size: int | None = None
  """Resize the shorter side and center-crop to this size (tfds datasets with images of varying size)."""
  batch_size: int = 32
  """Batch size per worker (the global batch is M times it)."""
  batch_sizes: tuple[int, ...] | None = None
  """Unequal per-worker batch sizes, one per worker (e.g. 32 48 48); overrides --batch-size."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Model."""
  model: str = "cnn"
  """Model name: see `jaxdl list`."""
  stem: Literal["auto", "cifar", "imagenet"] = "auto"
  """ResNet/VGG stem and head: imagenet for inputs of 128 px or more under auto."""
  compute_dtype: Literal["float32", "bfloat16"] = "float32"
  """The dtype an image model of the zoo computes in with --parallelism data: bfloat16 casts the parameters and images to it in each forward and backward pass (mixed precision: parameters, gradients, optimizer state, batch-norm statistics, logits and loss stay float32)."""
  parallelism: str = "data"
  """How each worker's model is laid over devices on --engine mesh: data (the whole model on one device per worker), pipeline (the model cut into --stages stages on as many devices, each batch into --microbatches micro-batches, GPipe's schedule) or tensor (its weights sharded over --tensor-parallel devices, Megatron-style), for a synchronous algorithm; pipeline: mlp, cnn, cnn_bn, vit, resnet and vgg models (batch norm normalizes each micro-batch by its own statistics, as in GPipe); tensor: the same models (a batch norm sharded by channels as the convolution before it)."""
  tensor_parallel: int = 2
  """--parallelism tensor: k, the devices each worker's weights are sharded over: dense layers in pairs by columns then rows, attention by heads then rows, convolutions by output channels (a residual block's last pair by output then input channels), batch norm by channels (k must divide each sharded dimension)."""
  stages: int = 2
  """--parallelism pipeline: p, the stages (devices) each worker's model is cut into, balanced by parameter count."""
  microbatches: int = 4
  """--parallelism pipeline: m, the micro-batches each worker's batch is cut into (it must divide the batch size); a stage idles (p - 1) / (m + p - 1) of the time."""
  pipeline_schedule: str = "gpipe"
  """--parallelism pipeline: gpipe (every micro-batch's forward, then every backward: the inputs of m micro-batches kept a stage) or 1f1b (PipeDream-flush: after p - 1 - s forwards, stage s alternates a forward and a backward: at most p kept); the same gradients, the same bubble (a backward recomputes its stage's forward from the kept input)."""


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """Optimizer and learning-rate schedule (every algorithm's update rule)."""
  optimizer: str | None = None
  """Any optax optimizer by name: see `jaxdl list` (unset: sgd, or the algorithm's own recipe that `jaxdl list` states, e.g. diloco's adamw; a recipe's lr and weight decay hold for its optimizer only)."""
  lr: float | None = None
  """Peak learning rate (unset: 0.05, or for a parameter server's pushes the rule `jaxdl list` states for the algorithm and M; config.json records the value chosen, which a rerun from it chooses anew for its own M)."""
  momentum: float | None = None
  """Momentum of sgd (0 for plain SGD; unset: 0.9, or for a parameter server's pushes the rule `jaxdl list` states, recorded in config.json as --lr's is); other optimizers take theirs through --opt-args."""
  nesterov: bool = False
  """Nesterov momentum for sgd."""
  weight_decay: float | None = None
  """Weight decay: decoupled for optimizers that take it (adamw, lamb, ...), an L2 term added to the gradient otherwise (unset: 0, or the algorithm's recipe)."""
  opt_args: str = "{}"
  """Further keyword arguments of the optax optimizer, as JSON, e.g. '{"b2": 0.98}'."""
  schedule: Literal["constant", "cosine", "step", "linear"] = "cosine"
  """Learning-rate schedule after warmup: constant, cosine decay to 0, step decay at --lr-milestones, linear decay to 0."""
  warmup_steps: int = 0
  """Linear warmup from 0 to --lr over this many steps."""
  lr_milestones: tuple[float, ...] = ()
  """Epochs at which the step schedule multiplies the learning rate by --lr-decay."""
  lr_decay: float = 0.1
  """Factor of the step schedule at each milestone."""


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
  """Distributed training algorithm and where it runs."""
  algorithm: str = "sgd"
  """Algorithm name: see `jaxdl list`."""
  workers: int = 1
  """Number of workers M."""
  engine: str = "auto"
  """Engine that runs the algorithm: auto picks the first that runs its family (see `jaxdl list`)."""
  sync_bn: bool = False
  """Batch-norm statistics over all workers' batches instead of each worker's own."""
  async_bn: bool = False
  """Async-BN (asynchronous algorithms with a server: asp, ssp, easgd, dc_asgd, lc_asgd): workers report each batch's batch-norm statistics, the server keeps their moving average and evaluates with it."""
  bn_decay: float = 0.1
  """Async-BN's d: E <- (1 - d) E + d * a worker's reported batch statistics."""
  compress: str = "none"
  """NAME[:ARG]: compress each worker's outgoing message with error feedback (it sends C(x + e) and keeps the residual e, checkpointed with its state): topk[:FRACTION] (the largest FRACTION of each leaf, in (0, 1], default 0.01; values and int32 indices), randk[:FRACTION] (random coordinates, the same), qsgd[:LEVELS] (default 16; a norm, a sign bit and a level per coordinate), sign (scaled sign, a bit a coordinate), powersgd[:RANK] (default 2; P and Q) or none. The message is the gradient for sgd, ar_sgd and bsp (before the all-reduce or push; compressed messages are all-gathered, M (M - 1) a step) and for asp, ssp, dc_asgd and lc_asgd (the push; the pull stays whole unless --compress-pull); the model difference from the last average for local_sgd, the outer gradient (theta - theta_m) for diloco, the elastic difference for easgd (the center's reply stays whole); for gosgd and ad_psgd, whose messages are whole models to a random peer, the model's difference from a reference that both ends of the ordered pair hold and both update with each message (error feedback without a residual: what was not sent stays in the difference; 2 M^2 reference models in all, so at most 32 workers); gosgd merges the receiver's reference, ad_psgd takes CHOCO-SGD's mean-preserving consensus step between the pair's references (--consensus-step). --engine sim times and counts (bytes_total) the compressed bytes; --engine ray sends each compressed message as its payload (values and indices, packed bits, factors), and counts the serialized bytes it sends; --engine mesh computes the same values but its collectives move them as dense arrays (the docs: algorithms/compression)."""
  compress_pull: str = "none"
  """NAME[:ARG], as --compress: a parameter server's reply to a pull (asp, ssp, dc_asgd, lc_asgd), compressed with the server's own error feedback (DoubleSqueeze, per worker): the server keeps the copy h_m of its parameters that worker m holds, sends q = C(w - h_m) and both add q to their copy (the residual w - h_m goes out in later replies); none sends the parameters whole."""
  settings: tyro.conf.Suppress[Any] = None
  """The algorithm's own settings (its `Settings` dataclass; None: its defaults). Set them by their flat names: RunConfig.make(algorithm="ssp", staleness_bound=5)."""


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
  """The machines: worker speeds and parameter-server shards."""
  worker_speeds: tuple[float, ...] | None = None
  """Relative speed per worker: the global batch (M x --batch-size) is partitioned in proportion (unless --batch-sizes). --engine sim models the speeds; on --engine mesh or ray, with --compute-time, the workers are slowed to them for real (see --compute-time); without it they run at their own speed (the speeds only partition the batch: refused with --batch-sizes)."""
  servers: int = 1
  """Parameter-server shards k: each owns about 1/k of the parameters and optimizer state (their bytes), and has its own link; with --engine ray, k shard actors (asp, ssp, dc_asgd, lc_asgd)."""
  cluster: str = "cpu"
  """Device profile of the simulated workers, optionally with a count: cpu, titan-v, v100, a100, h100, h200, 24x titan-v; or a profile measured on the ray engine, PATH.json (`jaxdl calibrate`), which sets the compute time (unless --compute-time is given), the messages' costs (--network and --latency are then unused) and the server's and coordinator's times per call."""
  network: str = "10gbps"
  """Bandwidth of every simulated link, e.g. 10gbps, 56gbps, 100mbps."""
  latency: float = 5e-5
  """Seconds per simulated message."""
  compute_time: float | None = None
  """Seconds per batch (of the workers' mean --batch-sizes) on a speed-1 simulated worker; unset: from the model's FLOP count and --cluster. On --engine mesh or ray, emulated: each worker sleeps until its batch has taken the modelled time (--worker-speeds, --jitter, stragglers, its share of the batch; the sim engine's draws for that worker and iteration), if its real compute took less; a synchronous algorithm's workers then each run their own program, an asynchronous algorithm's (ray) record the padded times in trace.jsonl."""
  jitter: float = 0.0
  """Sigma of the lognormal (mean 1) factor on every simulated (or emulated: --compute-time on a real engine) compute time."""
  jitter_correlation: float = 0.0
  """Correlation rho in [0, 1) of the workers' --jitter: worker w's factor at iteration c is exp(sigma (sqrt(rho) z_c + sqrt(1 - rho) z_wc) - sigma^2 / 2), z_c one standard normal shared by all workers (a function of --seed and c), z_wc its own; each factor stays lognormal with mean 1 and sigma --jitter, and two workers' log factors correlate with coefficient rho (0: independent). The iteration is each worker's own count of its batches: a synchronous step's for every worker, an asynchronous worker's own (not aligned in time with the others')."""
  straggler_prob: float = 0.0
  """Probability that a simulated (or emulated: --compute-time on a real engine) iteration straggles."""
  straggler_slowdown: float = 4.0
  """How many times longer a straggling iteration takes."""
  partition: str = "static"
  """How a synchronous algorithm (sgd, bsp, ar_sgd, local_sgd, diloco) partitions its global batch B among the workers: static (--batch-sizes, or B divided by --worker-speeds, or --batch-size each); proportional (the static partition for a warm-up of --rebalance-every steps, then partitioned once from the batch times measured over it, kept); adaptive (partitioned after the first step, then every --rebalance-every steps from each worker's last --rebalance-window batch times). proportional's partition makes the workers' predicted batch times equal (each fitted as a fixed part plus a part per example: in proportion to throughput when there is no fixed part); adaptive's minimizes the expected slowest batch over the window's measured scatter (a step waits for the slowest). B stays fixed and every example weighs 1/B; the partitions are "partition" events in trace.jsonl. proportional and adaptive run on --engine sim (modelled times: a worker's grows with its batch), and on --engine mesh and ray (measured times: each worker runs its own program on its own share, a thread or a process), over a dataset held in memory."""
  rebalance_every: int = 5
  """--partition proportional: the warm-up's steps; adaptive: steps between partitions."""
  rebalance_window: int = 20
  """--partition adaptive: each worker's most recent batches its batch cost is fitted over."""


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """Several processes (hosts) in one synchronous run, through jax.distributed."""
  coordinator_address: str | None = None
  """host:port of process 0; unset: one process, unless JAX_COORDINATOR_ADDRESS is set."""
  num_processes: int | None = None
  """Number of processes (or JAX_NUM_PROCESSES)."""
  process_id: int | None = None
  """This process's index (or JAX_PROCESS_ID)."""
  coordinator_timeout: float = 60.0
  """Seconds a process waits for all the others to reach the coordinator; then a one-line error (exit code 2)."""
  ray_address: str | None = None
  """--engine ray: HOST:PORT of a running Ray cluster to join (`ray start --head`); unset: a local Ray instance on the loopback address."""
  server_node: str | None = None
  """--engine ray: the address of the Ray node (as `ray start --node-ip-address` gave it, or Ray found it) that runs the run's central actor (an asynchronous algorithm's parameter server and its shards, or coordinator; a synchronous one's exchange); unset: the driver's node. The workers go round robin over the cluster's other nodes; a worker whose node dies is restarted on another."""
  reduce: str = "host"
  """A synchronous algorithm whose workers run their own programs (--engine mesh or ray with --partition proportional or adaptive, --compute-time or --worker-devices): where the workers' collectives are summed, host (in host memory, numpy) or device (put on a device: the default one, on ray a GPU where the exchange's node (--server-node) has one; summed there, copied back); the same result, timed as reduce_s in summary.json."""
  worker_devices: tuple[str, ...] | None = None
  """--engine mesh, a synchronous algorithm: each worker's device, PLATFORM[:INDEX] (e.g. gpu cpu cpu: one worker on the accelerator and two on the CPU in one synchronous step); each worker then runs its own program on its own device (as with --partition proportional or adaptive, or --compute-time). Unset: worker w on the default backend's device w mod their number."""
  pin_workers: bool = False
  """--engine ray: each asynchronous worker's process on one core of its own (worker w on core w mod the cores it may use), one rank per core: a worker's gradient then does not spread over the other workers' cores through XLA's threads. A replay of such a run (--replay) computes on one core too, as its workers did: XLA's CPU matrix products sum in an order that depends on the number of threads, and a replay on more cores would not give the run's bits."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Length of training, seed, and cadences."""
  epochs: float = 10.0
  """Epochs of training: an epoch is the training set once, in samples processed by all workers together; --steps overrides it."""
  steps: int | None = None
  """Training steps; overrides --epochs. A step is one global batch of samples (the workers' batch sizes summed): a synchronous step, or the asynchronous updates of any workers that process as many."""
  seed: int = 0
  """Run seed: data order, initialization and every random choice derive from it."""
  eval_every: int = 0
  """Evaluate on the test split every this many steps (0: once per epoch), and at the end."""
  log_every: int = 20
  """Write a metrics record every this many steps."""
  checkpoint_every: int = 0
  """Save a checkpoint every this many steps (0: once per epoch), and at the end."""
  keep_checkpoints: int = 2
  """Number of most recent checkpoints kept."""
  target_accuracy: float | None = None
  """A test score to time: summary.json gives the steps, epochs and seconds (simulated on the sim engine, else wall) of the first evaluation that reached it (null where none did). In the task's target metric: an accuracy in (0, 1], or test nats per char, reached at or below it."""
  price_per_device_hour: float | None = None
  """Price of one device for an hour: summary.json's cost is the run's devices x its hours x this (the sim engine's devices: its simulated workers, for its simulated hours), and cost_to_target the same to --target-accuracy."""


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  """Run directory and how to treat an existing one."""
  out: str | None = None
  """Run directory (default: runs/<algorithm>-<dataset>-<model>-seed<seed>)."""
  resume: bool = False
  """Continue the run in --out from its latest good checkpoint (starts fresh when there is none)."""
  overwrite: bool = False
  """Replace the run files in a non-empty --out."""
  progress: bool = True
  """Show a progress bar."""
  dry_run: bool = False
  """sim engine: simulate the schedule only (no math) and report its timing."""
  replay: str | None = None
  """sim engine: run the math along this recorded trace.jsonl instead of a new schedule."""
  config: str | None = None
  """Start from this config.json (e.g. a run's); flags given beside it override its values."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything that defines a run."""
  data: DataConfig = DataConfig()
  model: ModelConfig = ModelConfig()
  optim: OptimConfig = OptimConfig()
  algorithm: AlgorithmConfig = AlgorithmConfig()
  cluster: ClusterConfig = ClusterConfig()
  distributed: DistributedConfig = DistributedConfig()
  train: TrainConfig = TrainConfig()
  output: OutputConfig = OutputConfig()

  @classmethod
  def make(cls, **flat: Any) -> RunConfig:
    """A config from flat field names: ``RunConfig.make(dataset="mnist", lr=0.1)``."""
    return cls().replace(**flat)

  def replace(self, **flat: Any) -> RunConfig:
    """A copy with flat fields replaced; unknown names raise a ConfigError.

    A name that is not a section's field is a setting of the algorithm (after
    any change of algorithm in the same call). A new algorithm keeps the
    settings it shares with the old one and takes its defaults for the rest.
    """
    sections = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    owner = field_owner()
    given = {}
    for name, value in flat.items():
      if name in owner:
        sections[owner[name]] = dataclasses.replace(sections[owner[name]], **{name: value})
      else:
        given[name] = value
    new = RunConfig(**sections)
    if "settings" in flat or not (given or new.algorithm.algorithm != self.algorithm.algorithm):
      return new
    if new.algorithm.algorithm == self.algorithm.algorithm:
      kept = self.settings_dict()
    else:  # another algorithm: only what it shares with the old one
      fields = _setting_fields(new.algorithm.algorithm)
      kept = {k: v for k, v in self.settings_dict().items() if k in fields}
    return new._with_settings({**kept, **given})

  def _with_settings(self, values: dict[str, Any]) -> RunConfig:
    name = self.algorithm.algorithm
    if not values and name not in SETTINGS:
      return self  # an unknown algorithm is refused by the validation
    cls = SETTINGS.get(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    for key, value in values.items():
      if key not in fields:
        owners = setting_owners().get(key, [])
        raise ConfigError(key, value, f"a setting of {', '.join(owners)}, not of {name}"
                          if owners else "not a config field; see `jaxdl run --help`")
    typed = cls(**values)
    return dataclasses.replace(self, algorithm=dataclasses.replace(self.algorithm,
                                                                   settings=typed))

  def settings(self):
    """The algorithm's typed settings (its defaults unless set)."""
    if self.algorithm.settings is not None:
      return self.algorithm.settings
    return SETTINGS.get(self.algorithm.algorithm)()

  def settings_dict(self) -> dict[str, Any]:
    if self.algorithm.settings is None and self.algorithm.algorithm not in SETTINGS:
      return {}
    return dataclasses.asdict(self.settings())

  def flat(self) -> dict[str, Any]:
    """Every field by its flat name, the algorithm's settings included."""
    return {k: v for section in self.to_dict().values() for k, v in section.items()
            if k != "settings"} | self.settings_dict()

  def to_dict(self) -> dict[str, dict[str, Any]]:
    d = {f.name: {g.name: getattr(getattr(self, f.name), g.name)
                  for g in dataclasses.fields(getattr(self, f.name))}
         for f in dataclasses.fields(self)}
    d["algorithm"]["settings"] = self.settings_dict()
    return json.loads(json.dumps(d))  # tuples -> lists, as in the file

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> RunConfig:
    """Inverse of `to_dict` (and of `recorded`); accepts a nested or a flat
    dict. In a nested dict written before settings had their own entry, the
    settings of algorithms other than the one named are dropped. A field
    that DEFAULTS_APPLIED records, still at the value recorded, is unset."""
    if not isinstance(d, dict):
      raise ConfigError("config", type(d).__name__, "a JSON object of config fields")
    applied = d.get(DEFAULTS_APPLIED) or {}
    if not isinstance(applied, dict):
      raise ConfigError("config", applied, f"{DEFAULTS_APPLIED}: a JSON object of "
                        "fields and values")
    d = {k: v for k, v in d.items() if k not in FILE_RECORDS}  # records, not settings
    legacy = False
    if d and all(isinstance(v, dict) for v in d.values()):
      section = d.get("algorithm", {})
      legacy = "settings" not in section
      d = {k: v for s in d.values() for k, v in s.items() if k != "settings"} | dict(
          section.get("settings") or {})
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    if legacy:
      owner = field_owner()
      fields = _setting_fields(d.get("algorithm", AlgorithmConfig.algorithm))
      d = {k: v for k, v in d.items() if k in owner or k in fields}
    d = {k: None if k in applied and applied[k] == v else v for k, v in d.items()}
    _check_types(d)
    return cls.make(**d)

  @classmethod
  def load(cls, path: str) -> RunConfig:
    """The config of a config.json; refused if unreadable, or if it sets no
    field (an empty object, likely not the file meant, would run the defaults)."""
    try:
      with open(path) as f:
        d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise ConfigError("config", path, f"a readable config.json ({e})") from None
    config = cls.from_dict(d)
    if not any(v != {} for k, v in d.items() if k not in FILE_RECORDS):
      raise ConfigError("config", path, "a config.json that sets at least one field "
                        "(this one is an empty object)")
    return config

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def field_owner() -> dict[str, str]:
  """Each section field's flat name -> its section (settings excepted)."""
  default = RunConfig()
  return {f.name: section.name for section in dataclasses.fields(default)
          for f in dataclasses.fields(getattr(default, section.name)) if f.name != "settings"}


def field_types() -> dict[str, Any]:
  """Each section field's flat name -> its type (settings excepted)."""
  types = {}
  for section in dataclasses.fields(RunConfig):
    hints = typing.get_type_hints(section.type if isinstance(section.type, type)
                                  else type(getattr(RunConfig(), section.name)))
    types |= {name: hint for name, hint in hints.items() if name != "settings"}
  return types


def _fits(value: Any, hint: Any) -> bool:
  """Whether a value read from JSON has the type `hint` (an int is a float)."""
  if hint is Any:
    return True
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is Literal:
    return value in args
  if origin in (typing.Union, types.UnionType):
    return any(_fits(value, a) for a in args)
  if origin is tuple:
    return isinstance(value, tuple) and all(_fits(v, args[0]) for v in value)
  if hint is type(None):
    return value is None
  if hint is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if hint is int:
    return isinstance(value, int) and not isinstance(value, bool)
  return isinstance(value, hint) if isinstance(hint, type) else True


def type_name(hint: Any) -> str:
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is Literal:
    return "one of " + ", ".join(map(str, args))
  if origin in (typing.Union, types.UnionType):
    return " or ".join(type_name(a) for a in args)
  if origin is tuple:
    return f"a list, each {type_name(args[0])}"
  names = {float: "a number", int: "an integer", str: "a string", bool: "true or false",
           type(None): "null"}
  return names.get(hint, getattr(hint, "__name__", str(hint)))


def settings_types(algorithm: Any) -> dict[str, Any]:
  """The type of each setting of `algorithm` (none for an unknown one)."""
  if isinstance(algorithm, str) and algorithm in SETTINGS:
    return typing.get_type_hints(SETTINGS.get(algorithm))
  return {}


def _check_types(flat: dict[str, Any]) -> None:
  """Refuses a value of the wrong type in a config file, naming its field."""
  hints = field_types() | settings_types(flat.get("algorithm", AlgorithmConfig.algorithm))
  for field, value in flat.items():
    if field in hints and not _fits(value, hints[field]):
      raise ConfigError(field, value, f"{type_name(hints[field])} (in the config file)")


def _setting_fields(algorithm: str) -> set[str]:
  if algorithm not in SETTINGS:
    return set()
  return {f.name for f in dataclasses.fields(SETTINGS.get(algorithm))}


# config.json's record of what the run ran on (jaxdl.rundir.environment).
TASK_PREFIX = "task:"
"""--dataset and --model of a run of a script's own task: task:NAME."""

ENVIRONMENT = "environment"
DEFAULTS_APPLIED = "defaults_applied"
"""config.json's record of the values a rule chose for the unset fields of
the optimizer section (the algorithm's defaults for its M workers, else
jaxdl.optim's), which the section holds too (`recorded`)."""
RESOLVED = "resolved"
"""config.json's record of what the run chose where the config leaves it a
choice: the engine (for --engine auto), each worker's batch size (for
--batch-sizes unset) and the training steps (for --steps 0: from --epochs).
A rerun chooses them anew by the same rules: they are not read back."""
FILE_RECORDS = (ENVIRONMENT, DEFAULTS_APPLIED, RESOLVED)
"""config.json's entries that are records, not fields."""

# Fields that do not change what is computed: a resumed run may differ in them.
RUN_CONTROL_FIELDS = frozenset(
    {"out", "resume", "overwrite", "progress", "config", "log_every",
     "eval_every", "checkpoint_every", "keep_checkpoints", "data_dir",
     "coordinator_address", "num_processes", "process_id", "target_accuracy",
     "price_per_device_hour", "ray_address", "server_node"})


def recorded(config: RunConfig, filled: OptimConfig) -> dict[str, Any]:
  """config.json's content: `config` with its optimizer section `filled` as
  the run fills it (jaxdl.validation.Plan.optim), and DEFAULTS_APPLIED, the
  values so chosen. Read back (`RunConfig.from_dict`), a field still at its
  chosen value is unset again: a rerun chooses it anew by the same rule, for
  its own algorithm and M (the same value where neither changed)."""
  chosen = {f.name: getattr(filled, f.name) for f in dataclasses.fields(filled)
            if getattr(config.optim, f.name) is None and getattr(filled, f.name) is not None}
  return {**dataclasses.replace(config, optim=filled).to_dict(), DEFAULTS_APPLIED: chosen}
