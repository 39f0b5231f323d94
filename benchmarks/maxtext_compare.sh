#!/usr/bin/env bash
# chinchax's compiled train step beside MaxText's (benchmarks/maxtext_compare.py): builds its
# own environment, never run in CI. maxtext 0.2.5 needs Python >= 3.12 and brings jax 0.12 and
# libtpu; chinchax goes in with --no-deps (the comparison runs both stacks on the one jax/XLA
# maxtext installs, within chinchax's own jax range). The environment is $VENV (default
# benchmarks/.venv-maxtext, gitignored); a second run reuses it.
#   bash benchmarks/maxtext_compare.sh [--cases 125m-v5e8-data8,125m-v5e16-data16] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-benchmarks/.venv-maxtext}"
PY312="${PYTHON312:-$(command -v python3.12 || ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}"
if [ ! -x "$VENV/bin/python" ]; then
  [ -n "$PY312" ] || { echo "error: maxtext needs python3.12; set PYTHON312=/path/to/python3.12" >&2; exit 2; }
  "$PY312" -m venv "$VENV"
  "$VENV/bin/pip" install -q "maxtext[tpu]==0.2.5"
fi
# chinchax without its jax pin, and those of its other requirements maxtext does not bring
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" install -q "ml-collections>=1.0,<2" "tensorboardX>=2.6" "tqdm>=4.66" "scipy>=1.11" \
    "matplotlib>=3.8" "tensorstore>=0.1.70,<0.2"
# H100 rows: XLA's CUDA compiler without a GPU (deviceless, chinchax.aot.topology's target
# config); cuDNN's wheel lets both stacks compile cuDNN flash attention there too.
"$VENV/bin/pip" install -q "jax-cuda12-plugin==$("$VENV/bin/python" -c 'import jax; print(jax.__version__)')" \
    "jax-cuda12-pjrt==$("$VENV/bin/python" -c 'import jax; print(jax.__version__)')" "nvidia-cudnn-cu12>=9.8,<10"
"$VENV/bin/python" -c "import jax, maxtext, chinchax; print('jax', jax.__version__, jax.__file__)"
exec "$VENV/bin/python" benchmarks/maxtext_compare.py "$@"
