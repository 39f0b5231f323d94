"""Hugging Face interchange: a run → an HF Llama checkpoint, and an HF Llama → a run's start.

- :mod:`chinchax.export.writer`: ``chinchax export`` (safetensors, config, tokenizer files);
- :mod:`chinchax.export.llama_table`: the one name/transpose table for both directions;
- :mod:`chinchax.export.outdir`: the rules for ``--out``; :mod:`chinchax.export.tokenizer_files`;
- :mod:`chinchax.export.hf_source`, :mod:`chinchax.export.hf_load`: ``train.init_from=hf:DIR``.
"""
