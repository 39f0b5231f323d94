"""The model: the Flax NNX decoder-only transformer, its attention kernels, its sharding rules.

- :mod:`chinchax.model.transformer`: the Transformer (RMSNorm, RoPE, SwiGLU, GQA), output head;
- :mod:`chinchax.model.attention`: causal attention implementations (XLA, cuDNN, splash);
- :mod:`chinchax.model.sharding`: the one table of logical axis names → mesh axes, and meshes.

May import: errors, console, storage, config, runtime, cost.
"""
