"""Planning runs: budgets (FLOPs, hours, dollars) → shapes, tokens, batch, step times, configs.

Modules, by job:

* ``allocate`` — compute-optimal N*, D* of a FLOP budget under a law;
* ``shapes`` — the shape rule (one rule, named presets for the plan and the ladder);
* ``batch`` — batch size, steps, peak learning rate and warmup;
* ``work`` — FLOPs, HBM traffic and memory of one train step;
* ``step_time`` — step-time models (roofline, fitted, measured) and their files;
* ``timed`` — shapes under a wall-clock budget: tokens, loss, ranking;
* ``calibrate`` — timing candidate shapes on this machine (``--calibrate``);
* ``planner`` — the FLOP, time and dollar planners and the :class:`Plan`;
* ``render`` — the readable report and JSON;
* ``config_file`` — the config file of a plan (``--write-config``);
* ``cli`` — ``chinchax plan``'s command line (:func:`chinchax.planning.cli.main`).

The package imports nothing itself, so ``chinchax.planning.shapes`` (used by
the ladder) loads without the planner.
"""
