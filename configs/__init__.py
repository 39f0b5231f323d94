"""chinchax's named configs, installed with the package as ``chinchax.configs``.

``train.py``, ``ladder.py`` and ``bench.py`` each define ``get_config(variant)``;
use them as ``--config configs/train.py:VARIANT`` from a checkout, or leave
``--config`` out to get the installed file's ``default`` variant.
"""
