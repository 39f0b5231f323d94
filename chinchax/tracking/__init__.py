"""Experiment tracking: TensorBoard event files and Weights & Biases runs, local or on gs://.

- :mod:`chinchax.tracking.tblog`: TensorBoard scalars;
- :mod:`chinchax.tracking.wandblog`: W&B logging (optional extra).

May import: errors, console, storage, config.
"""
