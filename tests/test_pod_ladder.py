"""The accelerator ladder (configs/ladder.py:pod): its dry run, its bad input, and its CPU
scale-down (pod_cpu) end to end: BPE, an HF-datasets directory of local files, microbatches,
a chunked loss and a time cadence, ending in a fit and a validation run."""

import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig

import pytest

from chinchax import config as config_lib
from chinchax.cli import ladder as ladder_cli
from chinchax.cost import hardware as hardware_lib
from chinchax.ladder import dryrun, pod

REPO = pathlib.Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\s*(\d+|V)\s")


def _pod(**ladder):
  c = config_lib.get_ladder_variant("pod")
  c.ladder.update(**ladder)
  return c


@pytest.mark.parametrize("hw", ["v5e-8", "h100x8"])
def test_dry_run_sizes_the_ladder_to_its_budget_and_prices_it(hw):
  """Budgets sized to 24 hours of the target; 25 grid runs + V, ≤ 100 columns; dollars are
  the hours at the table's price; every run's batch is M × microbatch; 1.5 decades."""
  c = _pod(hardware=hw)
  text = ladder_cli.dry_run_text(c)
  lines = text.splitlines()
  assert max(len(x) for x in lines) <= 100, max(lines, key=len)
  rows = [x for x in lines if ROW.match(x)]
  assert len(rows) == 26 and rows[-1].lstrip().startswith("V")
  dry = dryrun.plan_dry_run(_pod(hardware=hw))
  assert 0.9 * 24 <= dry.hours <= 24.0
  assert dry.c_max / dry.c_min == pytest.approx(10 ** 1.5)
  price = hardware_lib.parse_hardware(hw).price_per_hour
  assert dry.dollars == pytest.approx(dry.hours * price)
  for cost in dry.costs:
    lay = cost.layout
    assert lay.microbatches * lay.microbatch_size == cost.run.hparams.global_batch_size
    assert lay.fits and cost.run.hparams.global_batch_size % 8 == 0
  n = [x.run.counts.total for x in dry.grid_costs]
  assert 5e6 < min(n) and max(n) < 1.5e9
  assert "expected 95% interval of a" in text and f"${dry.dollars:,.0f}" in text
  # twice the hours: a larger top budget, still within them
  big = dryrun.plan_dry_run(_pod(hardware=hw, budget_hours=48.0))
  assert big.c_max > 1.6 * dry.c_max and big.hours <= 48.0


def _error(argv, capsys):
  from chinchax.cli import dispatch
  assert dispatch.main(["ladder", "--config", f"{REPO}/configs/ladder.py:pod", *argv]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: "), err
  return err[0]


def test_bad_input_is_one_error_line_naming_what_works(capsys, tmp_path):
  line = _error(["--config.ladder.hardware=v9z-8", "--dry-run"], capsys)
  assert "v9z-8" in line and "v5e" in line and "h100" in line
  line = _error(["--config.ladder.hardware=v5e-1", "--config.ladder.c_max=3e19", "--dry-run"],
                capsys)
  assert "does not fit v5e-1" in line and "ladder.hardware with" in line
  wanted = float(re.search(r"with (\d+) TPU v5e", line).group(1))
  assert wanted > 1
  line = _error(["--config.ladder.c_min=1e9", "--config.ladder.c_max=1e17", "--dry-run"], capsys)
  least = float(re.search(r"ladder.c_min >= ([0-9.e+]+)", line).group(1))
  # one step of one sequence per device on the smallest accelerator shape, times min_steps
  assert least > 1e9
  ok = _pod(c_min=least, c_max=1e17)
  pod.check_one_step(ok.ladder, ok.train_config.train, 32768, pod.target(ok.ladder))
  assert not list(tmp_path.iterdir())


def _hf_dir(root: pathlib.Path, megabytes: float) -> pathlib.Path:
  """A directory of JSON-lines files that HF datasets loads as a local dataset."""
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  d = root / "hf"
  d.mkdir()
  size, rows = 0, []
  for f in sorted(stdlib.glob("*.py")):
    text = f.read_text(errors="replace")
    rows.append(json.dumps({"text": text}))
    size += len(text)
    if size > megabytes * 1e6:
      break
  (d / "train.jsonl").write_text("\n".join(rows) + "\n")
  return d


@pytest.mark.slow  # 10 runs' start-up and compiles: minutes on 2 busy cores (benchmarks/pod_ladder_cpu.sh)
def test_pod_cpu_ladder_runs_end_to_end_and_fits(tmp_path):
  """configs/ladder.py:pod_cpu: 9 runs and a validation run on one CPU device, through the
  pod ladder's code paths, then the fit with the validation run's error."""
  data = _hf_dir(tmp_path, 4.0)
  work = tmp_path / "ladder"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  cmd = [sys.executable, "-m", "chinchax.cli", "ladder", f"--config={REPO}/configs/ladder.py:pod_cpu",
         f"--config.workdir={work}", f"--config.train_config.data.hf_name={data}",
         f"--config.train_config.data.store_root={tmp_path / 'stores'}",
         f"--config.train_config.compile_cache_dir="]
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(x) for x in (work / "results.jsonl").read_text().splitlines()]
  assert sum(r["status"] == "done" for r in rows if r.get("role") != "validation") == 9
  fit = json.loads((work / "fit" / "fit.json").read_text())
  assert fit["validation"]["measured_loss"] > 0
  configs = [json.loads(p.read_text())["config"] for p in (work / "runs").glob("*/config.json")]
  assert max(c["train"]["microbatches"] for c in configs) > 1
  assert {c["train"]["loss_chunk_size"] for c in configs} == {"16"}
  assert {c["data"]["tokenizer"] for c in configs} == {"bpe"}
  assert {c["train"]["eval_every_s"] for c in configs} == {3.0}


def test_compile_ladder_lists_every_distinct_program_with_the_planners_layout():
  """compile --ladder's programs: one per run here (no two share shape × layout), each with the
  dry run's M / remat / loss chunk and FSDP over the slice; the topology stands in for an unset
  ladder.hardware; a hardware of another size is refused."""
  from chinchax.aot import ladder_run
  from chinchax.aot import topology as topology_lib
  target = topology_lib.parse_target("v5e-8")
  progs = ladder_run.ladder_programs(_pod(hardware="v5e-8"), target)
  dry = dryrun.plan_dry_run(_pod(hardware="v5e-8"))
  assert sum(len(p.run_ids) for p in progs) == len(dry.costs) == 26
  by_run = {c.run.run_id: c.layout for c in dry.costs}
  for p in progs:
    lay = by_run[p.run_ids[0]]
    t = p.config.train
    assert (t.microbatches, p.config.model.remat, int(t.loss_chunk_size)) == (
        lay.microbatches, lay.remat, lay.loss_chunk)
    assert (p.config.mesh.data, p.config.mesh.fsdp) == (1, 8)
    assert p.analytic_bytes == pytest.approx(lay.memory.total)
  assert any(r.startswith("V") for p in progs for r in p.run_ids)
  unset = ladder_run.ladder_programs(_pod(hardware=""), target)
  assert [p.key for p in unset] == [p.key for p in progs]
  with pytest.raises(topology_lib.AotError, match="h100x8"):
    ladder_run.ladder_programs(_pod(hardware="h100x8"), topology_lib.parse_target("v5e-4"))


def test_compile_ladder_says_when_the_ladder_was_planned_for_other_hardware(capsys):
  """ladder.hardware v5e-8 compiled on h100x8 (same device count): the v5e-8 layouts, and one
  warning naming the flag that plans the ladder for the topology; none when they agree."""
  from chinchax.aot import ladder_run
  from chinchax.aot import topology as topology_lib
  gpu = ladder_run.ladder_programs(_pod(hardware="v5e-8"), topology_lib.parse_target("h100x8"))
  err = capsys.readouterr().err
  assert "--config.ladder.hardware=h100x8" in err and "v5e-8" in err
  tpu = ladder_run.ladder_programs(_pod(hardware="v5e-8"), topology_lib.parse_target("v5e-8"))
  assert "ladder.hardware" not in capsys.readouterr().err
  assert [p.run_ids for p in gpu] == [p.run_ids for p in tpu]


@pytest.mark.parametrize("args, words", [
    (["--config.ladder.hardware=v9z-8", "--topology", "v5e-8"], ["v9z-8", "v5e", "h100"]),
    (["--config.ladder.hardware=v5e-1", "--config.ladder.c_max=3e19", "--topology", "v5e-1"],
     ["does not fit v5e-1", "remat=full", "ladder.hardware with 2 TPU v5e", "ladder.c_max <="]),
    (["--config.ladder.hardware=v5e-8", "--config.ladder.c_min=1e9", "--config.ladder.c_max=1e17",
      "--topology", "v5e-8"], ["ladder.c_min=1e+09", "ladder.c_min >="]),
])
def test_compile_ladder_bad_input_is_one_error_line_before_any_compile(args, words, tmp_path):
  """compile --ladder refuses what the dry run refuses, before a single program is compiled
  (no compile cache written under HOME)."""
  r = subprocess.run([sys.executable, "-m", "chinchax.cli", "compile", "--ladder", "--no-eval",
                      "--config", "configs/ladder.py:pod", *args], cwd=REPO, capture_output=True,
                     text=True, timeout=300, env=dict(os.environ, HOME=str(tmp_path)))
  assert r.returncode == 2, r.stderr
  err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
  assert len(err) == 1 and all(w in err[0] for w in words), r.stderr
  assert "Traceback" not in r.stderr and not (tmp_path / ".cache" / "chinchax" / "aot").exists()
