"""Planning runs: budgets (FLOPs, hours, dollars) → shapes, tokens, batch, step times, configs.

Modules, by job:

* ``allocate`` — compute-optimal N*, D* of a FLOP budget under a law;
* ``shapes`` — the shape rule (one rule, named presets for the plan and the ladder);
* ``batch`` — batch size, steps, peak learning rate and warmup;
* ``timed`` — shapes under a wall-clock budget: tokens, loss, ranking;
* ``calibrate`` — timing candidate shapes on this machine (``--calibrate``);
* ``planner`` — the FLOP, time and dollar planners and the :class:`Plan`;
* ``render`` — the readable report and JSON;
* ``config_file`` — the config file of a plan (``--write-config``).

The cost of one train step (``chinchax.cost.work``) and the step-time models
(``chinchax.cost.step_time``) are in the core: the benchmark writes step-time files
that the planner reads. The command line is ``chinchax.cli.plan``.

The package imports nothing itself, so ``chinchax.planning.shapes`` (used by
the ladder) loads without the planner.
"""
