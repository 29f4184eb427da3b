"""The ASU seed's strategies predicted by the cost model
(jaxdl.cluster.strategies), beside the seed's measurements: the report's
table and its note for a comparison of parallelisms."""
from __future__ import annotations

from jaxdl.cluster import strategies as st
from jaxdl.cluster.cost import DEFAULT_UTILIZATION, DEVICE_PROFILES
from jaxdl.report.markdown import fmt, table


def prediction_table() -> str:
  """The ASU seed's strategies, measured and predicted by the cost model
  (jaxdl.cluster.strategies): samples/s, ratios to one device, and the
  predicted ratio over the measured one."""
  rows = [[p.strategy.name, str(p.strategy.devices), str(p.strategy.batch),
           fmt(p.strategy.measured, ",.0f"), fmt(p.predicted, ",.0f"),
           fmt(p.measured_ratio, ".2f"), fmt(p.predicted_ratio, ".2f"), fmt(p.closeness, ".2f")]
          for p in st.asu_predictions()]
  return table(["strategy", "devices", "global batch", "seed samples/s",
                "predicted samples/s", "seed ratio to one device",
                "predicted ratio to one device", "predicted / seed ratio"], rows)


def prediction_note() -> str:
  """What the prediction table's model includes, the order it gives the
  strategies and how close its ratios come to the seed's."""
  predicted = st.asu_predictions()
  pieces = st.piece_costs(*st.ASU_MODEL)
  devices = st.Devices.of(st.ASU_PROFILE)
  first = st.stage_shares(pieces, 2)[0]
  order = lambda key: " > ".join(p.strategy.name for p in sorted(
      (p for p in predicted if key(p) is not None), key=key, reverse=True))
  measured_order = order(lambda p: p.strategy.measured)
  predicted_order = order(lambda p: p.predicted if p.strategy.measured else None)
  close = "; ".join(f"{p.strategy.name} {p.predicted_ratio:.2f} against {p.measured_ratio:.2f} "
                    f"(× {p.closeness:.2f})" for p in predicted[1:] if p.closeness)
  return (
      f"The seed's table names no model: {st.ASU_MODEL[0]} is assumed. "
      f"From XLA's FLOP counts of {st.ASU_MODEL[0]}'s pieces ({st.ASU_MODEL[3]} stem, "
      f"{'x'.join(map(str, st.ASU_MODEL[1]))} inputs, {st.ASU_MODEL[2]} classes) on "
      f"{st.ASU_PROFILE} devices at {DEFAULT_UTILIZATION:.0%} of their "
      f"{DEVICE_PROFILES[st.ASU_PROFILE] / 1e12:g} TFLOP/s, joined by a link of "
      f"{devices.bandwidth / 1e9:g} GB/s and {devices.latency * 1e6:g} µs a message: one "
      "device runs a batch's forward and backward; data parallel adds a ring all-reduce of "
      f"the {st.BYTES_PER_FLOAT * sum(p.params for p in pieces) / 1e6:.1f} MB gradient; the "
      "pipelines cut the pieces by parameter count, as jaxdl's pipeline does (the first stage "
      f"holds {first[0]:.0%} of the parameters and {first[1]:.0%} of the training FLOPs), "
      "recompute each stage's forward in its backward, move each micro-batch's activations "
      "across the boundary, and run the 2(m + p − 1) slots in lock step, the slowest stage "
      "setting each; model parallel is the same with one micro-batch. The model orders the "
      f"measured strategies {predicted_order}, the seed {measured_order}. Predicted ratios "
      f"to one device against the seed's: {close}. Not modelled: the optimizer's update, "
      "input loading, a framework's own costs per operation or per copy.")
