"""Fakes 8 CPU devices before JAX starts, so mesh code runs on any machine."""
import os
import platform
import tempfile

# XLA compiles for the CPU it runs on, and its vector width changes how a
# sum is rounded: tests that pin exact bits (test_fingerprints.py) compile
# for AVX2 on every x86-64 machine, AVX-512 ones included. YNNPACK, which
# XLA hands dots to by default, picks its kernels by the CPU it runs on
# whatever the flag says: tests leave dots to XLA's own code. And XLA's
# "platform-dependent math" computes rsqrt (and c / sqrt(x), which it rewrites
# to c * rsqrt(x)) from the processor's approximate reciprocal square root:
# vrsqrtps is an AVX2 instruction on both Intel and AMD, but each refines its
# own estimate, and DC-ASGD-a's lambda_t (and batch norm) rounded otherwise on
# an Intel Xeon than on an AMD EPYC. Off, rsqrt is sqrt then a division, both
# correctly rounded by IEEE 754 on every processor (tests/test_fingerprints.py
# checks it).
ISA = " --xla_cpu_max_isa=AVX2" if platform.machine().lower() in ("x86_64", "amd64") else ""
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8" + ISA +
                           " --xla_cpu_experimental_ynn_fusion_type="
                           " --xla_cpu_enable_platform_dependent_math=false").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# One compilation cache for the session, shared by xdist workers and the
# subprocesses that tests start: identical programs compile once.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"jaxdl-test-xla-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# The ray engine's local instances: no token authentication (tests only; a
# user's cluster keeps it), files under a short temporary directory (Ray's
# Unix socket paths must stay short).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="ray", dir="/tmp"))

