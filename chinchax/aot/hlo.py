"""Collectives of an optimized HLO module: kind, count and bytes per step, per device.

Reads the text of ``compiled.as_text()`` (SPMD-partitioned: one device's
program). A collective inside a ``while`` body runs once per iteration, so
each computation carries a multiplier: the product of the known trip counts
(``backend_config={"known_trip_count":{"n":"12"}}``) of the loops that run it;
a loop without a known count counts once and is reported. Async pairs
(``all-gather-start`` / ``-done``) count once, at the start. On TPU a
reduce-scatter is a fusion that calls a computation named
``all-reduce-scatter*``; it is counted as a reduce-scatter and the all-reduce
inside is not counted again.

Bytes per collective (``size`` = the op's result bytes, ``g`` = its group size):

* operand bytes: all-gather size/g, reduce-scatter size·g, the others size;
* wire bytes a device sends on a ring (Patarasuk & Yuan 2009; NCCL's
  performance notes): all-gather size·(g−1)/g, reduce-scatter size·(g−1),
  all-reduce 2·size·(g−1)/g, all-to-all size·(g−1)/g, collective-permute size.
"""

from __future__ import annotations

import dataclasses
import math
import re

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
               "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8,
               "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


@dataclasses.dataclass
class CollectiveSummary:
  """Per kind: ``count`` (executions per step), ``operand_bytes`` and ``wire_bytes`` per step
  per device; ``unknown_trip_loops``: loops whose collectives were counted once."""

  count: dict[str, int]
  operand_bytes: dict[str, float]
  wire_bytes: dict[str, float]
  unknown_trip_loops: int = 0

  @property
  def total_wire_bytes(self) -> float:
    return float(sum(self.wire_bytes.values()))

  def to_dict(self) -> dict:
    return {k: {"count": self.count[k], "operand_bytes": self.operand_bytes[k],
                "wire_bytes": self.wire_bytes[k]} for k in KINDS} | {
        "unknown_trip_loops": self.unknown_trip_loops}


def shape_bytes(shape_text: str) -> float:
  """Bytes of every array in an HLO shape (``bf16[16,128]{1,0}`` or a tuple of them)."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype not in DTYPE_BYTES:
      continue
    n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
    total += DTYPE_BYTES[dtype] * n
  return total


def _arrays(shape_text: str) -> list[float]:
  out = []
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype in DTYPE_BYTES:
      out.append(DTYPE_BYTES[dtype] * (math.prod(int(d) for d in dims.split(",") if d)
                                       if dims else 1))
  return out


def group_size(attrs: str, n_devices: int) -> int:
  """Devices per replica group: ``{{0,1},{2,3}}``, iota ``[2,4]<=[8]`` or ``mesh[...] {axes}``;
  ``n_devices`` when the op names no groups."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if m:
    sizes = dict((k.strip("' "), int(v)) for k, v in
                 (kv.split("=") for kv in m.group(1).split(",") if "=" in kv))
    axes = [a.strip("' ") for a in m.group(2).split(",") if a.strip("' ")]
    return max(1, math.prod(sizes.get(a, 1) for a in axes))
  m = re.search(r"replica_groups=\[([0-9,]+)\]<=", attrs)
  if m:
    return int(m.group(1).split(",")[-1])
  m = re.search(r"replica_groups=\{\{([0-9,]*)\}", attrs)
  if m and m.group(1):
    return len(m.group(1).split(","))
  m = re.search(r"source_target_pairs=\{([^}]*)\}", attrs)
  if m:
    return 2
  return max(1, n_devices)


def _parse(text: str) -> tuple[dict[str, list[tuple]], str | None]:
  """{computation: [(name, shape, op, rest)]} and the entry computation's name."""
  comps: dict[str, list[tuple]] = {}
  entry, current = None, None
  for line in text.splitlines():
    h = _HEADER.match(line)
    if h:
      current = h.group(2)
      comps[current] = []
      if h.group(1):
        entry = current
      continue
    if current is None:
      continue
    if line.strip() == "}":
      current = None
      continue
    m = _INSTR.match(line)
    if m:
      comps[current].append((m.group(2), m.group(3), m.group(4), m.group(5)))
  return comps, entry


def _called(rest: str) -> list[tuple[str, str]]:
  """(attribute, computation) pairs an instruction calls."""
  out = []
  for attr in ("calls", "body", "condition", "to_apply", "true_computation",
               "false_computation"):
    for m in re.finditer(rf"\b{attr}=%?([\w.\-]+)", rest):
      out.append((attr, m.group(1)))
  m = re.search(r"branch_computations=\{([^}]*)\}", rest)
  if m:
    out += [("branch", c.strip().lstrip("%")) for c in m.group(1).split(",") if c.strip()]
  return out


def collectives(text: str, n_devices: int) -> CollectiveSummary:
  """Counts the collectives of an optimized HLO module's text per step (see the module doc).

  Args:
    text: ``compiled.as_text()``.
    n_devices: devices of the program (the group of an op that names none).
  """
  comps, entry = _parse(text)
  count = {k: 0 for k in KINDS}
  operand = {k: 0.0 for k in KINDS}
  wire = {k: 0.0 for k in KINDS}
  unknown = 0
  if entry is None:
    return CollectiveSummary(count, operand, wire)
  skip: set[str] = set()

  def visit(comp: str, m: float, depth: int = 0) -> None:
    nonlocal unknown
    if depth > 64 or comp not in comps or comp in skip:
      return
    for _, shape, op, rest in comps[comp]:
      kind = None
      if op in KINDS or (op.endswith("-start") and op[:-6] in KINDS):
        kind = op if op in KINDS else op[:-6]
      called = _called(rest)
      if op == "fusion" and any(c.startswith(("all-reduce-scatter", "reduce-scatter"))
                                for _, c in called):
        kind = "reduce-scatter"
        inner = next(c for _, c in called if c.startswith(("all-reduce-scatter",
                                                           "reduce-scatter")))
        skip.add(inner)
        g = next((group_size(r, n_devices) for _, _, o, r in comps.get(inner, [])
                  if o in KINDS or o.endswith("-start")), n_devices)
        _add(kind, shape_bytes(shape), g, m)
        continue
      if kind is not None:
        size = _result_bytes(op, shape)
        _add(kind, size, group_size(rest, n_devices), m)
      for attr, c in called:
        if attr == "to_apply":
          continue
        if attr == "body" and op == "while":
          t = _TRIP.search(rest)
          cond = next((cc for a, cc in called if a == "condition"), None)
          trips = int(t.group(1)) if t else _trips_from_condition(comps.get(cond, []))
          if trips is None:
            unknown += 1
          visit(c, m * (trips or 1), depth + 1)
        elif attr != "condition":
          visit(c, m, depth + 1)

  def _add(kind: str, size: float, g: int, m: float) -> None:
    count[kind] += int(m)
    if kind == "all-gather":
      operand[kind] += m * size / g
      wire[kind] += m * size * (g - 1) / g
    elif kind == "reduce-scatter":
      operand[kind] += m * size * g
      wire[kind] += m * size * (g - 1)
    elif kind == "all-reduce":
      operand[kind] += m * size
      wire[kind] += m * 2 * size * (g - 1) / g
    elif kind == "all-to-all":
      operand[kind] += m * size
      wire[kind] += m * size * (g - 1) / g
    else:
      operand[kind] += m * size
      wire[kind] += m * size

  visit(entry, 1.0)
  return CollectiveSummary(count, operand, wire, unknown)


def _trips_from_condition(cond: list[tuple]) -> int | None:
  """A counted loop's trip count read off its condition (``i < constant``), when the backend
  config does not carry it (TPU): the one integer scalar constant the condition compares with."""
  values = []
  for _, shape, op, rest in cond:
    if op == "constant" and re.match(r"[su](32|64)\[\]", shape):
      m = re.match(r"\s*(-?\d+)\)", rest)
      if m:
        values.append(int(m.group(1)))
  return values[0] if len(values) == 1 and values[0] > 0 else None


def _result_bytes(op: str, shape: str) -> float:
  """Bytes of a collective's result; for async starts (operands, results[, contexts]) the results."""
  if not op.endswith("-start"):
    return shape_bytes(shape)
  arrays = _arrays(re.sub(r"\bu32\[\]", "", shape)) if "collective-permute" in op else \
      _arrays(shape)
  if not op.startswith("all-reduce") and len(arrays) >= 2:  # ((operands), (results))
    return float(sum(arrays[len(arrays) // 2:]))
  return float(sum(arrays))

