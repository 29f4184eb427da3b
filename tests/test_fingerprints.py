"""Regression: fixed configs keep their exact parameters across refactors.

Each fingerprint was recorded before a change of structure and must hold after
it: a refactor that changes one bit of any algorithm's result fails here. A
change of semantics re-records the affected entries, with the reason beside
them. They hold for the versions pinned in requirements.lock and
the CPU backend as tests/conftest.py compiles for it, which is exactly what
they depend on besides the code: XLA's code for AVX2 (the vector width sets
the order of a sum), dots in XLA's own code (YNNPACK picks kernels by the
processor), and no platform-dependent math (rsqrt is sqrt then a division,
each correctly rounded, not the processor's estimate). With these, an AMD
EPYC and an Intel Xeon with AVX-512 give the same bits; another XLA may
round differently.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdl
from jaxdl.config import RunConfig

BASE = dict(dataset="digits", model="mlp", batch_size=16, lr=0.05, momentum=0.0,
            schedule="constant", steps=25, progress=False)
# All re-recorded when the tests pinned XLA's CPU code to AVX2 (conftest.py):
# it had compiled for the host's own vector width, so a machine without
# AVX-512 rounded otherwise than the one they were recorded on. All
# re-recorded again when the tests took dots from YNNPACK back to XLA's own
# code: YNNPACK picks its kernels by the CPU it runs on, whatever that pin
# says, and every entry recorded without AVX-512 differed on a machine with it.
# All re-recorded when initialization was compiled with XLA's default
# optimization instead of level 0 (which rounds the random initializers
# differently), so that a run starts from the bits of its task's init(key)
# called by hand; sgd_mesh also runs as a plain jit on one device.
CASES = {
    "sgd_mesh": (dict(algorithm="sgd", engine="mesh", momentum=0.9),
                 "15623f4e50186fb419c339274e8b328b0962ec0d6b1d0eefde27fcd572685c58"),
    # on 4 of the 8 CPU devices that conftest.py fakes
    "bsp_mesh": (dict(algorithm="bsp", engine="mesh", workers=4, momentum=0.9),
                 "d7d8aa33d6b723888e6bd0011b02394bd88e21b6452a1484074dfedace8696d7"),
    "asp_sim_equal": (dict(algorithm="asp", engine="sim", workers=4, compute_time=1e-3),
                      "798272f4ae9183aba99e6d02f81cf75819d76dd04968cbc8958297564dad17da"),
    "asp_sim_jitter": (dict(algorithm="asp", engine="sim", workers=4, jitter=0.3,
                            compute_time=1e-3),
                       "ebfc1b2464aa60012aba0fbdba9c17103f0ed1e954d0c63a5100a5e5b8b3e84a"),
    "ssp_sim_jitter": (dict(algorithm="ssp", engine="sim", workers=4, jitter=0.3,
                            staleness_bound=1, compute_time=1e-3),
                       "623278f66333061e92873ac0071a2ed281dff93dac745c462a4d9e4c18a8f0a9"),
    # Re-recorded when a gossip message became fixed at its push (the sender's
    # model and half weight then), held in flight until it arrives; it was the
    # sender's model at the arrival.
    # Re-recorded when a merge became x_k + a_m / (a_k + a_m) (x_m - x_k) and
    # the evaluated model worker 0's plus the weighted mean of the differences
    # from it, which keep coordinates where the models agree bit for bit.
    "gosgd_sim": (dict(algorithm="gosgd", engine="sim", workers=4, gossip_probability=0.5,
                       compute_time=1e-3),
                  "03b432871082f969cf916216ea9600a9be09f311d353aafbf4712bd34721d53d"),
    # Re-recorded with requirements.lock: a fresh environment's packages gave
    # other bits for this one case than those it was first recorded with
    # (the same code; its schedule's cap never bound).
    # Re-recorded when the tests turned off XLA's platform-dependent math
    # (conftest.py): lambda_t's rsqrt had been the processor's own estimate,
    # refined, and an Intel Xeon gave other bits than the AMD EPYC it was
    # recorded on (9ab22cc6... against 581accf6...).
    "dc_asgd_sim": (dict(algorithm="dc_asgd", engine="sim", workers=4, jitter=0.3,
                         dc_adaptive=True, dc_lambda=2.0, compute_time=1e-3),
                    "cb83ee8103f27dcd08eeaf368604063b49d819c242965f51548a367d30c83494"),
    "lc_asgd_sim": (dict(algorithm="lc_asgd", engine="sim", workers=4, jitter=0.3,
                         compute_time=1e-3),
                    "cdba03a68f8a28e4c7fdd287a130238b74de37242edbffe0ab0705213593808e"),
    "easgd_sim": (dict(algorithm="easgd", engine="sim", workers=4, compute_time=1e-3),
                  "ef1b614eed93d27734a1ca4bdca1034af6ec3799b442d403cce82f0fb00ad6c6"),
    # Re-recorded when the evaluated model (the workers' mean) became worker
    # 0's plus the mean of the differences from it: the same training, other
    # bits in the mean.
    "ad_psgd_sim": (dict(algorithm="ad_psgd", engine="sim", workers=4, compute_time=1e-3),
                    "172aa66f92b54ca0d86f4d27dd27a173910ee88795f09985b4447135ef094a42"),
}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="recorded on the CPU backend")
@pytest.mark.parametrize("name", list(CASES))
def test_fingerprint_is_unchanged(name, tmp_path):
  overrides, expected = CASES[name]
  summary = jaxdl.run(RunConfig.make(**{**BASE, **overrides, "out": str(tmp_path / name)}))
  assert summary["params_fingerprint"] == expected


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU backend's flags")
def test_reciprocal_square_roots_are_correctly_rounded():
  """What DC-ASGD-a's lambda_t = lam / sqrt(v + eps) and batch norm compute is
  the same on every processor: rsqrt, and a division by a sqrt (which XLA
  rewrites to a product with an rsqrt), equal numpy's sqrt and division, each
  correctly rounded (IEEE 754). The processor's own estimate differed in about
  a third of these values on x86-64."""
  x = np.random.default_rng(0).uniform(1e-8, 10.0, 1 << 16).astype(np.float32)
  exact = np.float32(1) / np.sqrt(x)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.lax.rsqrt)(x)), exact)
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: 2.0 / jnp.sqrt(v))(x)),
                                np.float32(2) * exact)
