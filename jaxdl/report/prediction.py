"""The ASU seed's strategies predicted by the cost model
(jaxdl.cluster.strategies), beside the seed's measurements: the report's
table and its note for a comparison of parallelisms."""
from __future__ import annotations

from jaxdl.cluster import strategies as st
from jaxdl.cluster.cost import DEFAULT_UTILIZATION, DEVICE_MEMORY, DEVICE_PROFILES
from jaxdl.report.markdown import fmt, table

COST_MODELS = {"FLOP rate": False, "roofline": True}  # name: asu_predictions(roofline=)


def prediction_table() -> str:
  """The ASU seed's strategies, measured and predicted by the cost model's
  two models (jaxdl.cluster.strategies: the FLOP rate and the roofline per
  micro-batch): samples/s and ratios to one device."""
  predicted = {name: st.asu_predictions(roofline) for name, roofline in COST_MODELS.items()}
  rows = []
  for i, strategy in enumerate(st.ASU_STRATEGIES):
    seed = predicted["FLOP rate"][i].measured_ratio
    rows.append([strategy.name, str(strategy.devices), str(strategy.batch),
                 fmt(strategy.measured, ",.0f"), fmt(seed, ".2f"),
                 *(f for name in COST_MODELS
                   for f in (fmt(predicted[name][i].predicted, ",.0f"),
                             fmt(predicted[name][i].predicted_ratio, ".2f")))])
  return table(["strategy", "devices", "global batch", "seed samples/s",
                "seed ratio to one device",
                *(f for name in COST_MODELS
                  for f in (f"{name}: samples/s", f"{name}: ratio"))], rows)


def _order(predictions, key) -> str:
  return " > ".join(p.strategy.name for p in sorted(
      (p for p in predictions if key(p) is not None), key=key, reverse=True))


def prediction_note() -> str:
  """What the prediction table's two models include, the order each gives the
  strategies and how close their ratios come to the seed's."""
  pieces = st.piece_costs(*st.ASU_MODEL)
  devices = st.asu_devices()
  first = st.stage_shares(pieces, 2)[0]
  flops, roofline = (st.asu_predictions(r) for r in COST_MODELS.values())
  measured_order = _order(flops, lambda p: p.strategy.measured)
  orders = "; ".join(
      f"the {name} {_order(predicted, lambda p: p.predicted if p.strategy.measured else None)}"
      for name, predicted in zip(COST_MODELS, (flops, roofline)))
  ratios = lambda predicted, of: ", ".join(
      f"{p.strategy.name} {of(p):.2f}" for p in predicted[1:] if p.closeness)
  return (
      f"The seed's table names no model: {st.ASU_MODEL[0]} is assumed. "
      f"The predictions count {st.ASU_MODEL[0]}'s pieces with XLA ({st.ASU_MODEL[3]} stem, "
      f"{'x'.join(map(str, st.ASU_MODEL[1]))} inputs, {st.ASU_MODEL[2]} classes) and run them "
      f"on {st.ASU_PROFILE} devices joined by a link of {devices.bandwidth / 1e9:g} GB/s and "
      f"{devices.latency * 1e6:g} µs a message. The FLOP rate runs every operation at "
      f"{DEFAULT_UTILIZATION:.0%} of the {DEVICE_PROFILES[st.ASU_PROFILE] / 1e12:g} TFLOP/s "
      "peak; the roofline per micro-batch runs each piece at the longer of its FLOPs at the "
      f"peak and its unfused memory traffic at {DEVICE_MEMORY[st.ASU_PROFILE] / 1e9:g} GB/s, "
      "the traffic's part per operation (weights, their gradients) paid by every micro-batch. "
      "One device runs a batch's forward and backward; data parallel adds a ring all-reduce of "
      f"the {st.BYTES_PER_FLOAT * sum(p.params for p in pieces) / 1e6:.1f} MB gradient; the "
      "pipelines cut the pieces by parameter count, as jaxdl's pipeline does (the first stage "
      f"holds {first[0]:.0%} of the parameters and {first[1]:.0%} of the training FLOPs), "
      "recompute each stage's forward in its backward, move each micro-batch's activations "
      "across the boundary, and run the 2(m + p − 1) slots in lock step, the slowest stage "
      "setting each; model parallel is the same with one micro-batch. The seed orders the "
      f"measured strategies {measured_order}; {orders}. Ratios to one device: the seed's "
      f"{ratios(flops, lambda p: p.measured_ratio)}; the FLOP rate's "
      f"{ratios(flops, lambda p: p.predicted_ratio)}; the roofline's "
      f"{ratios(roofline, lambda p: p.predicted_ratio)}. Not modelled: the optimizer's update, "
      "input loading, a framework's own costs per operation or per copy, how the seed's data "
      "parallelism moved its gradients.")
