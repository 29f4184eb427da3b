"""Timing-only predictions of parallel strategies: the formulas against values
worked out by hand, ResNet-18's FLOP counts, and the ASU seed's ordering."""
import dataclasses
import math

import pytest

from jaxdl.cluster import strategies as st
from jaxdl.errors import ConfigError
from tests import marks

G = 1e9
FAST = dict(flops=1e12, bandwidth=math.inf)  # a link that takes no time


def equal_pieces(count: int) -> list[st.PieceCost]:
  return [st.PieceCost(params=100, forward=1 * G, training=3 * G, output=1000)] * count


@pytest.mark.parametrize("stages, microbatches, per_stage", [(2, 4, 1), (4, 8, 1), (3, 1, 2),
                                                             (2, 16, 3)])
def test_equal_stages_on_a_fast_link_take_the_ideal_time(stages, microbatches, per_stage):
  """GPipe, p equal stages, m micro-batches: (m + p - 1) / m x one stage's share
  of a batch's training x the recompute factor (forward + training) / training."""
  batch = 16 * microbatches
  pieces = equal_pieces(stages * per_stage)
  share = batch * per_stage * 3 * G / 1e12  # seconds of one stage's training of a batch
  ideal = (microbatches + stages - 1) / microbatches * share * (1 + 3) / 3
  seconds = st.pipeline_seconds(pieces, st.Devices(**FAST), stages, microbatches, batch)
  assert seconds == pytest.approx(ideal, rel=1e-12)


def test_the_slowest_stage_sets_each_slot():
  """Two unequal stages, two micro-batches of 16. GPipe's slots (stage 0: F F - -
  B B; stage 1: - F F B B -) and 1F1B's (F F - B - B; - F B F B -), in units of
  16 examples x 1e9 FLOPs at 1e12 FLOP/s: forward 2 and 1, backward 6 and 3."""
  heavy = st.PieceCost(params=10, forward=2 * G, training=6 * G, output=50)
  light = st.PieceCost(params=10, forward=1 * G, training=3 * G, output=10)
  unit = 16 * G / 1e12
  devices = st.Devices(**FAST)
  assert st.pipeline_seconds([heavy, light], devices, 2, 2, 32, "gpipe") == pytest.approx(
      (2 + 2 + 1 + 3 + 6 + 6) * unit)
  assert st.pipeline_seconds([heavy, light], devices, 2, 2, 32, "1f1b") == pytest.approx(
      (2 + 2 + 3 + 6 + 3 + 6) * unit)


def test_model_parallel_moves_one_activation_each_way():
  """Model parallel, 2 stages: both forwards, both backwards, and the boundary's
  activation (32 x 1000 floats) sent forward and its cotangent back."""
  first = st.PieceCost(params=10, forward=1 * G, training=3 * G, output=1000)
  second = st.PieceCost(params=10, forward=2 * G, training=5 * G, output=10)
  devices = st.Devices(flops=1e12, bandwidth=1e9, latency=1e-5)
  compute = 32 * (1 + 2 + 5 + 3) * G / 1e12
  messages = 2 * (1e-5 + 32 * 1000 * 4 / 1e9)
  assert st.pipeline_seconds([first, second], devices, 2, 1, 32) == pytest.approx(
      compute + messages)
  assert st.model_parallel([first, second], devices, 2, 32) == pytest.approx(
      32 / (compute + messages))


def test_a_fixed_cost_per_operation():
  """Every slot of GPipe on equal stages holds an operation: 2 (m + p - 1) of them."""
  pieces, batch = equal_pieces(2), 64
  slow = st.Devices(**FAST, op_overhead=1e-3)
  extra = st.pipeline_seconds(pieces, slow, 2, 4, batch) - st.pipeline_seconds(
      pieces, st.Devices(**FAST), 2, 4, batch)
  assert extra == pytest.approx(2 * (4 + 2 - 1) * 1e-3)
  assert st.single_device(pieces, slow, batch) == pytest.approx(
      batch / (batch * 6 * G / 1e12 + 1e-3))


@pytest.mark.parametrize("count", [2, 4, 8])
def test_data_parallel_on_a_fast_link_is_count_times_one_device(count):
  pieces, devices = equal_pieces(3), st.Devices(**FAST)
  assert st.data_parallel(pieces, devices, count, 32) == pytest.approx(
      count * st.single_device(pieces, devices, 32), rel=1e-12)


def test_data_parallel_adds_a_ring_all_reduce():
  """4 devices: 2 (D - 1) / D of the 4 MB gradient over the link, 2 (D - 1) latencies."""
  pieces = [st.PieceCost(params=500_000, forward=G, training=2 * G, output=1)] * 2
  devices = st.Devices(flops=1e12, bandwidth=1e9, latency=1e-5)
  compute = 32 * 4 * G / 1e12
  ring = 2 * 3 / 4 * 4e6 / 1e9 + 6 * 1e-5
  assert st.data_parallel(pieces, devices, 4, 32) == pytest.approx(4 * 32 / (compute + ring))


def test_a_roofline_takes_the_longer_of_flops_and_traffic():
  """Two pieces at 1e12 FLOP/s and 1e11 bytes/s, 10 examples: the first's
  forward 10 x 1e9 FLOPs (10 ms) against 1e8 + 10 x 1e6 bytes (1.1 ms), the
  second's 10 x 1e7 FLOPs (0.1 ms) against 2e8 + 10 x 1e7 bytes (3 ms)."""
  pieces = [st.PieceCost(10, G, 3 * G, 1, forward_bytes=(1e8, 1e6)),
            st.PieceCost(10, 1e7, 3e7, 1, forward_bytes=(2e8, 1e7))]
  devices = st.Devices(flops=1e12, bandwidth=1e9, memory=1e11, op_overhead=1e-4)
  assert st.operation_seconds(pieces, devices, 10, "forward") == pytest.approx(
      10e-3 + 3e-3 + 1e-4)
  # training moves no bytes here: FLOPs alone, 10 x (3e9 + 3e7) at 1e12
  assert st.operation_seconds(pieces, devices, 10) == pytest.approx(10 * 3.03e9 / 1e12 + 1e-4)
  # a micro-batch pays the part per operation whatever its size
  assert st.operation_seconds(pieces[1:], devices, 1, "forward") == pytest.approx(
      (2e8 + 1e7) / 1e11 + 1e-4)


def test_traffic_is_counted_per_operation_and_per_example(resnet18):
  """A product of a b x 64 input and a 64 x 32 matrix reads both and writes
  b x 32 floats; ResNet-18's traffic counted on 8 and 16 examples gives its
  count on 16 and 32 (affine in the batch, to XLA's float32 counts), and a piece's training moves at
  least its weights twice (read, and their gradients written)."""
  import jax.numpy as jnp
  x, w = jnp.ones((8, 64)), jnp.ones((64, 32))
  assert st._counts(jnp.matmul, x, w) == (2 * 8 * 64 * 32, 4 * (8 * 64 + 64 * 32 + 8 * 32))
  on16 = st.piece_costs(*st.ASU_MODEL, batch=16)
  for eight, sixteen in zip(resnet18, on16):
    for passes in st.PASSES:
      assert eight.traffic(passes, 32) == pytest.approx(sixteen.traffic(passes, 32), rel=1e-6)
    assert eight.training_bytes[0] >= 2 * 4 * eight.params - 16  # (float32 counts: bytes off)
    assert eight.training_bytes[1] > eight.forward_bytes[1] > 0


def test_bad_devices():
  with pytest.raises(ConfigError, match="--cluster"):
    st.Devices.of("h100")  # no link known for it
  with pytest.raises(ValueError):
    st.Devices(flops=1e12, bandwidth=0.0)
  with pytest.raises(ValueError):
    st.Devices(flops=1e12, bandwidth=1e9, memory=0.0)
  with pytest.raises(ValueError, match="multiple"):
    st.pipeline_seconds(equal_pieces(2), st.Devices(**FAST), 2, 3, 32)


@pytest.fixture(scope="module")
def resnet18():
  return st.piece_costs(*st.ASU_MODEL)


def test_resnet18_pieces_add_up_to_the_whole_model(resnet18):
  """The pieces' FLOPs against the whole model's (one trace): forward to 1e-6,
  forward and backward to 1e-3 (measured: 1.1e-4); parameters exactly, as
  torchvision's ResNet-18 with a 3x3 stem and 10 classes."""
  whole = st.model_cost(*st.ASU_MODEL)
  assert sum(p.params for p in resnet18) == whole.params == 11_173_962
  assert sum(p.forward for p in resnet18) == pytest.approx(whole.forward, rel=1e-6)
  assert sum(p.training for p in resnet18) == pytest.approx(whole.training, rel=1e-3)
  # a 3x3 convolution of 64 channels on 32x32, twice: 2 x 2 x 9 x 64^2 x 32^2 multiply-adds
  # but for the padded border
  assert resnet18[1].forward == pytest.approx(2 * 2 * 9 * 64 ** 2 * 32 ** 2, rel=0.05)
  assert 2.9 < resnet18[1].training / resnet18[1].forward < 3.1
  assert [p.output for p in resnet18] == [65536] * 3 + [32768] * 2 + [16384] * 2 + \
      [8192] * 2 + [10]


@pytest.mark.parametrize("name", ["mlp", marks.slow("vit"), "vgg11_bn"])
def test_pieces_with_and_without_batch_norm_add_up_to_the_whole_model(name):
  model = (name, (8, 8, 1), 10, "cifar")
  whole, pieces = st.model_cost(*model), st.piece_costs(*model)
  assert sum(p.params for p in pieces) == whole.params
  assert sum(p.forward for p in pieces) == pytest.approx(whole.forward, rel=1e-3)


@pytest.mark.slow  # (per example by default: test_resnet18_pieces_add_up_to_the_whole_model's
#                    counts on 8 examples against one example's by hand)
def test_flops_are_counted_per_example():
  one, eight = (st.model_cost(*st.ASU_MODEL, batch=b) for b in (1, 8))
  assert one.training == pytest.approx(eight.training, rel=1e-4)


def test_resnet18_cut_by_parameters_loads_the_first_stage(resnet18):
  """Two stages balanced by parameter count: layer4's second block and the head
  alone in the second (42% of the parameters), the rest, 89% of the FLOPs, in the
  first."""
  assert st.stage_groups(resnet18, 2) == [range(0, 8), range(8, 10)]
  (params0, flops0), _ = st.stage_shares(resnet18, 2)
  assert 0.5 < params0 < 0.6 and flops0 > 0.85


def test_the_asu_ordering(resnet18):
  """Data parallel > one device > GPipe, as the seed measured; GPipe below one
  device only because of the parameter cut: cut by FLOPs, it would pass it."""
  single, data, gpipe, model = st.asu_predictions()
  assert data.predicted > single.predicted > gpipe.predicted > model.predicted
  single, data, gpipe, model = st.asu_predictions(roofline=True)
  assert data.predicted > single.predicted > gpipe.predicted > model.predicted
  assert [p.strategy.measured for p in (single, data, gpipe)] == [2275.0, 2968.0, 1528.0]
  assert gpipe.closeness == pytest.approx(gpipe.predicted_ratio / (1528 / 2275))
  by_flops = [dataclasses.replace(p, params=round(p.training)) for p in resnet18]
  devices = st.Devices.of(st.ASU_PROFILE)
  assert st.pipeline(by_flops, devices, 2, 4, 256) > st.single_device(by_flops, devices, 128)
