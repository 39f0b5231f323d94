"""The config of a chinchax run: its knobs, defaults and variants, and their validation.

Two modules hold it, one job each; this module is their one import path
(``from chinchax import config as config_lib``):

* :mod:`chinchax.config.defaults` — every knob with its default and a one-line
  comment (:func:`base_config`), the named variants (:func:`get_variant`), the
  ladder and bench configs.
* :mod:`chinchax.config.checks` — :func:`validate`, called before any expensive
  work (corpus reading, model init, compilation), which raises
  :class:`ConfigError` naming the bad value and what would be valid; the
  parsers of the knobs that hold lists (save steps, XLA options, host:port).
"""

from __future__ import annotations

from chinchax.config.checks import (ATTENTION_IMPLS, BUDGET_MODES, COMPILER_OPTIONS_AUTO,
                                    COMPUTE_DTYPES, CPU_COLLECTIVES, DATA_SOURCES, DECAY_SHAPES,
                                    DECODE_ERRORS, DISTRIBUTED_MODES, INIT_RULES, LR_SCHEDULES,
                                    MAX_DECAY_FRACTION, MESH_AXES, N_KINDS, REMAT_POLICIES,
                                    TOKENIZERS, ConfigError, check_choice, check_positive,
                                    compiler_options_text, data_shuffle_seed,
                                    parse_compiler_options, parse_host_port,
                                    parse_lr_multipliers, parse_save_steps, parse_trial_seeds,
                                    resolve_mesh_shape,
                                    validate, validate_distributed)
from chinchax.config.benches import get_bench_variant
from chinchax.config.defaults import (base_bench_config, base_config, base_ladder_config,
                                      bench_model, bench_sweep,
                                      get_ladder_variant, get_variant, knob_comments)

__all__ = [
    "ATTENTION_IMPLS", "BUDGET_MODES", "COMPILER_OPTIONS_AUTO", "COMPUTE_DTYPES",
    "CPU_COLLECTIVES", "DATA_SOURCES", "DECAY_SHAPES", "DECODE_ERRORS", "DISTRIBUTED_MODES",
    "INIT_RULES", "LR_SCHEDULES", "MAX_DECAY_FRACTION", "MESH_AXES", "N_KINDS", "REMAT_POLICIES",
    "TOKENIZERS", "ConfigError", "base_bench_config", "base_config", "base_ladder_config",
    "bench_model", "bench_sweep", "check_choice", "check_positive", "compiler_options_text",
    "data_shuffle_seed", "get_bench_variant", "get_ladder_variant", "get_variant",
    "knob_comments", "parse_compiler_options", "parse_host_port", "parse_lr_multipliers",
    "parse_save_steps", "parse_trial_seeds", "resolve_mesh_shape",
    "validate", "validate_distributed",
]
