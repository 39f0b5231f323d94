"""chinchax: compute-optimal language-model pretraining in JAX/Flax.

Importing the package keeps libtpu away from a process on a host without TPUs
(``chinchax.runtime.platforms``): any script, test or verb that uses chinchax starts
only the CPU (or CUDA) backend there, unless ``JAX_PLATFORMS`` says otherwise.
"""

from chinchax.runtime import platforms as _platforms

_platforms.choose()
