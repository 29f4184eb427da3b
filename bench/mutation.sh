#!/usr/bin/env bash
# Mutation testing of jaxdl/algorithms and the schedules (BENCHMARKS.md).
# Usage: bench/mutation.sh [mutmut run args]   (needs: pip install -e '.[test,mutation]')
# Prints the score; `mutmut results` lists the survivors, `mutmut show NAME` one diff.
set -euo pipefail
cd "$(dirname "$0")/.."
# The fork server imports jax before tests/conftest.py runs: set what the
# conftest would (8 fake CPU devices, a shared compilation cache) here.
export JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3
export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8 --xla_cpu_experimental_ynn_fusion_type="
case "$(uname -m)" in x86_64|amd64) XLA_FLAGS="$XLA_FLAGS --xla_cpu_max_isa=AVX2";; esac
export JAX_COMPILATION_CACHE_DIR="${TMPDIR:-/tmp}/jaxdl-mutation-xla-$(id -u)"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
python3 bench/mutation_state.py restore
mutmut run --max-children "${JOBS:-$(nproc)}" "$@" > mutants.log 2>&1 || true
python3 bench/mutation_state.py save
mutmut results > mutants/survivors.txt
mutmut export-cicd-stats > /dev/null
python3 - <<'PY'
import json
s = json.load(open("mutants/mutmut-cicd-stats.json"))
tested = s["total"] - s["skipped"]
dead = s["killed"] + s["timeout"]
print({k: v for k, v in s.items() if v})
print(f"mutation score: {dead}/{tested} = {100 * dead / max(tested, 1):.1f}% killed "
      f"(survivors: mutants/survivors.txt)")
PY
