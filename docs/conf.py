"""jaxdl's documentation: MyST pages and notebooks, executed at build time;
the API reference from the package's docstrings; the command-line reference
and the algorithm pages from the dataclasses and registries (_ext/jaxdl_docs.py).

Build: python -m sphinx -W --keep-going -b html docs docs/_build/html
"""
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
# The notebooks' kernels inherit these: JAX on the CPU, TensorFlow quiet.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# tqdm.auto warns on import in a kernel without ipywidgets; the runs here show no bar.
os.environ.setdefault("PYTHONWARNINGS", "ignore:IProgress not found")

project = "jaxdl"
author = "the jaxdl authors"
copyright = "the jaxdl authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "jaxdl_docs"]
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
html_theme = "furo"
html_title = "jaxdl"
smartquotes = False  # "--flag" stays two hyphens

# MyST: $...$ and $$...$$ math, ::: fences, anchors on headings down to ###.
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# Every code cell runs at build time; an error fails the build. Each notebook
# runs in a temporary directory (its runs/ go there), outputs cached by cell
# source under docs/_build/.jupyter_cache (a fresh output directory runs all).
nb_execution_mode = "cache"
nb_execution_timeout = 300  # seconds a cell may take
nb_execution_raise_on_error = True
nb_execution_in_temp = True
nb_execution_show_tb = True
nb_merge_streams = True

# Autodoc: the docstrings' Google sections (Args, Returns, Attributes).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True

# No network: no intersphinx. Every reference inside jaxdl must resolve
# (nitpicky); references into other packages' docs cannot, and are not links.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|optax|flax|numpy|np|chex|tyro|ray|orbax|tf)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Mapping|Sequence|Protocol|NamedTuple)"),
    (r"py:.*", r"(Path|pathlib\.Path|optional|dataclasses\..*)"),
    (r"py:class", r"(jaxdl\.registry\.T|jaxdl\.engines\.base\.Slice|Suppress|jaxdl\.algorithms\.compression\.CompressSpec)"),
]
suppress_warnings = ["mystnb.unknown_mime_type"]
