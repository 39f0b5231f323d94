"""A FLOP plan whose shape is 2× the law's N* or more says it is not compute-optimal."""

from chinchax import cli
from chinchax.planning import reach


def test_a_shape_twice_n_star_is_warned_about(capsys):
  assert cli.main(["plan", "--flops", "1e13"]) == 0  # the default law: N* 220,473 params
  out = capsys.readouterr().out
  line = [l for l in out.splitlines() if "the chosen shape has" in l]
  assert line, out
  ratio = float(line[0].split("the chosen shape has ")[1].split("×")[0])
  assert reach.OVERSIZE_FACTOR <= ratio < 4.0  # below the old 4× threshold: said now


def test_a_shape_near_n_star_is_not_warned_about(capsys):
  assert cli.main(["plan", "--flops", "1e18"]) == 0
  assert "the chosen shape has" not in capsys.readouterr().out
