"""What a step and a run cost: parameters, FLOPs, bytes, memory, step time, hardware and prices.

- :mod:`chinchax.cost.budget`: ModelShape, parameter counts, FLOPs (6ND and the matmul count);
- :mod:`chinchax.cost.work`: FLOPs, bytes moved and memory of one training step;
- :mod:`chinchax.cost.step_time`: roofline and measured step-time models;
- :mod:`chinchax.cost.hardware`: the accelerator table (``hardware_prices.json``): peaks, HBM, prices;
- :mod:`chinchax.cost.hparams`: the LR and batch-size rules of a shape.

May import: errors, console, storage, config.
"""
