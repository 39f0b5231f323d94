"""Collectives of an optimized HLO module: kind, count and bytes per step, per device.

Reads the text of ``compiled.as_text()`` (SPMD-partitioned: one device's
program). A collective inside a ``while`` body runs once per iteration, so
each computation carries a multiplier: the product of the known trip counts
(``backend_config={"known_trip_count":{"n":"12"}}``) of the loops that run it;
a loop without a known count counts once and is reported. On TPU a
reduce-scatter is a fusion that calls a computation named
``all-reduce-scatter*``; it is counted as a reduce-scatter and the all-reduce
inside is not counted again.

An asynchronous collective counts once, with the bytes of its result:

* ``all-gather-start`` / ``-done`` (and the other ``*-start`` ops): at the start. The
  start's shape is the results alone (``f32[16]``; a tuple of them for several
  operands) or, in the newer print format, ``(operands, results[, u32[] contexts])``;
  the op's operand count tells which (:func:`start_result_bytes`).
* generic ``async-start`` / ``-update`` / ``-done`` wrapping a collective in a
  computation: the wrapped op, through the start's ``calls=`` only (``-done`` and
  ``-update`` may print the same ``calls=``).
* TPU async-collective fusions: the start, each continuation and the done are
  fusions that all hold a copy of the same collective with the same ``channel_id``
  (ending in the ``AsyncCollectiveStart`` / ``AsyncCollectiveDone`` custom-calls).

So within one run of a computation (a loop body, a branch, the entry; the fusions and
async wrappers it calls share it) a ``channel_id`` is counted once.

Bytes per collective (``size`` = the op's result bytes, ``g`` = its group size):

* operand bytes: all-gather size/g, reduce-scatter size·g, the others size;
* wire bytes a device sends on a ring (Patarasuk & Yuan 2009; NCCL's
  performance notes): all-gather size·(g−1)/g, reduce-scatter size·(g−1),
  all-reduce 2·size·(g−1)/g, all-to-all size·(g−1)/g, collective-permute size.

Traffic between slices (data-center network, DCN) is counted apart, per device:

* TPU multi-slice: XLA compiles one slice's program (``num_partitions`` = the devices
  of a slice, so every replica group lies inside one slice) and moves what crosses
  slices as host-transfer ``send`` ops of the ``xla_megascale_runtime``
  (``_xla_megascale_transfer_type="ALL_REDUCE"``, …). Their operand bytes P are what a
  device hands to the DCN; on a ring over s slices it sends ALL_REDUCE 2·P·(s−1)/s,
  ALL_GATHER P·(s−1), REDUCE_SCATTER P·(s−1)/s, other types P.
* One program over every device (GPU hosts): a collective whose replica groups hold
  devices of several slices (``slice_of`` maps partition id → slice) crosses; taken
  hierarchically (within each slice first, then across), a group of g devices over s
  slices moves 1/k of the payload (k = g/s devices per slice) over the DCN on a ring of
  s: all-reduce 2·(size/k)·(s−1)/s, all-gather and reduce-scatter (size·g for the
  latter)/k·(s−1)/s, all-to-all size·(s−1)/s, collective-permute size.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

COUNT_VERSION = 2  # bump when the counting changes: cached reports (chinchax.aot.search) hold it
KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
               "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8,
               "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_MEGASCALE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_PARTITIONS = re.compile(r"\bnum_partitions=(\d+)")
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_CONTEXT = re.compile(r"^[us]32\[\](\{[^}]*\})?$")  # an async op's context scalar
_ASYNC_TAIL = ("async-update", "async-done")  # their calls= repeat the start's


@dataclasses.dataclass
class CollectiveSummary:
  """Per kind: ``count`` (executions per step), ``operand_bytes`` and ``wire_bytes`` per step
  per device; ``unknown_trip_loops``: loops whose collectives were counted once; ``dcn``: the
  same per kind for the traffic between slices; ``cross_slice_groups``: executions of
  collectives whose replica groups span slices; ``partitions``: the program's
  ``num_partitions`` (one slice's devices on TPU multi-slice)."""

  count: dict[str, int]
  operand_bytes: dict[str, float]
  wire_bytes: dict[str, float]
  unknown_trip_loops: int = 0
  dcn: dict = dataclasses.field(default_factory=dict)
  cross_slice_groups: int = 0
  partitions: int | None = None

  @property
  def dcn_wire_bytes(self) -> float:
    """Bytes a device sends over the data-center network per step (see the module doc)."""
    return float(sum(v["wire_bytes"] for v in self.dcn.values()))

  @property
  def total_wire_bytes(self) -> float:
    return float(sum(self.wire_bytes.values()))

  def to_dict(self) -> dict:
    return {k: {"count": self.count[k], "operand_bytes": self.operand_bytes[k],
                "wire_bytes": self.wire_bytes[k]} for k in KINDS} | {
        "unknown_trip_loops": self.unknown_trip_loops, "dcn": self.dcn,
        "dcn_wire_bytes": self.dcn_wire_bytes, "cross_slice_groups": self.cross_slice_groups,
        "partitions": self.partitions}


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


def replica_groups(attrs: str) -> list[list[int]] | None:
  """The device groups an op names: ``{{0,1},{2,3}}``, iota ``[2,4]<=[8]`` or
  ``[2,4]<=[4,2]T(1,0)``, or the pairs of ``source_target_pairs``; None for no or another form."""
  m = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", attrs)
  if m:
    shape, dims = [int(x) for x in m.group(1).split(",")], [int(x) for x in m.group(2).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if m.group(3):
      ids = ids.transpose([int(x) for x in m.group(3).split(",")])
    return ids.reshape(-1, shape[-1]).tolist()
  m = re.search(r"replica_groups=\{((?:\{[0-9,]*\},?)+)\}", attrs)
  if m:
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([0-9,]*)\}", m.group(1))]
  m = re.search(r"source_target_pairs=\{((?:\{[0-9,]*\},?)+)\}", attrs)
  if m:
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([0-9,]*)\}", m.group(1))]
  return None


def _dcn_wire(kind: str, size: float, g: int, s: int) -> float:
  """Bytes a device sends over the DCN for a collective whose groups of g span s slices
  (the module doc's hierarchical ring; size = the op's result bytes)."""
  k = g / s
  if kind == "all-reduce":
    return 2 * size / k * (s - 1) / s
  if kind == "all-gather":
    return size / k * (s - 1) / s
  if kind == "reduce-scatter":
    return size * g / k * (s - 1) / s
  if kind == "all-to-all":
    return size * (s - 1) / s
  return size


def _megascale_wire(kind: str, operand: float, s: int) -> float:
  """Bytes a device sends for a TPU multi-slice transfer of ``operand`` bytes over s slices."""
  factor = {"all-reduce": 2 * (s - 1) / s, "all-gather": s - 1,
            "reduce-scatter": (s - 1) / s}.get(kind, 1.0)
  return operand * factor


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


def collectives(text: str, n_devices: int, slice_of: list[int] | None = None,
                num_slices: int = 1) -> CollectiveSummary:
  """Counts the collectives of an optimized HLO module's text per step (see the module doc).

  Args:
    text: ``compiled.as_text()``.
    n_devices: devices of the program (the group of an op that names none).
    slice_of: the slice of each partition id (the mesh's devices in order), to find the
      collectives whose replica groups cross slices; None: none is looked for.
    num_slices: slices of the target (the ring of a TPU multi-slice transfer).
  """
  comps, entry = _parse(text)
  count = {k: 0 for k in KINDS}
  operand = {k: 0.0 for k in KINDS}
  wire = {k: 0.0 for k in KINDS}
  dcn: dict[str, dict] = {}
  unknown = cross = 0
  if entry is None:
    return CollectiveSummary(count, operand, wire)
  skip: set[str] = set()
  parts = _PARTITIONS.search(text)
  if slice_of is not None and parts and int(parts.group(1)) < len(slice_of):
    slice_of = None  # one slice's program (TPU multi-slice): its groups lie inside a slice

  def to_dcn(kind: str, nbytes: float, sent: float, m: float) -> None:
    d = dcn.setdefault(kind, {"count": 0, "operand_bytes": 0.0, "wire_bytes": 0.0})
    d["count"] += int(m)
    d["operand_bytes"] += m * nbytes
    d["wire_bytes"] += m * sent

  def crossing(kind: str, size: float, attrs: str, g: int, m: float) -> None:
    nonlocal cross
    groups = replica_groups(attrs) if slice_of is not None else None
    if not groups or any(i >= len(slice_of) for grp in groups for i in grp):
      return
    s = max(len({slice_of[i] for i in grp}) for grp in groups)
    if s > 1:
      cross += int(m)
      to_dcn(kind, size, _dcn_wire(kind, size, g, s), m)

  def first(rest: str, seen: set) -> bool:
    """False for a collective whose channel was already counted in this scope."""
    ch = _CHANNEL.search(rest)
    if ch is None:
      return True
    if ch.group(1) in seen:
      return False
    seen.add(ch.group(1))
    return True

  def visit(comp: str, m: float, depth: int = 0, seen: set | None = None) -> None:
    nonlocal unknown
    if depth > 64 or comp not in comps or comp in skip:
      return
    seen = set() if seen is None else seen
    for _, shape, op, rest in comps[comp]:
      kind = None
      if op in KINDS or (op.endswith("-start") and op[:-6] in KINDS):
        kind = op if op in KINDS else op[:-6]
      called = [] if op in _ASYNC_TAIL else _called(rest)
      if op == "fusion" and any(c.startswith(("all-reduce-scatter", "reduce-scatter"))
                                for _, c in called):
        kind = "reduce-scatter"
        inner = next(c for _, c in called if c.startswith(("all-reduce-scatter",
                                                           "reduce-scatter")))
        skip.add(inner)
        attrs = next((r for _, _, o, r in comps.get(inner, [])
                      if o in KINDS or o.endswith("-start")), "")
        if not first(attrs, seen):
          continue
        g = group_size(attrs, n_devices) if attrs else n_devices
        _add(kind, shape_bytes(shape), g, m)
        crossing(kind, shape_bytes(shape), attrs, g, m)
        continue
      if kind is not None and first(rest, seen):
        size = _result_bytes(op, shape, rest)
        _add(kind, size, group_size(rest, n_devices), m)
        crossing(kind, size, rest, group_size(rest, n_devices), m)
      mega = _MEGASCALE.search(rest) if op == "send" else None
      if mega:
        arrays = _arrays(shape)
        kind_dcn = mega.group(1).lower().replace("_", "-")
        nbytes = arrays[0] if arrays else 0.0
        to_dcn(kind_dcn, nbytes, _megascale_wire(kind_dcn, nbytes, num_slices), m)
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
        elif attr == "calls" and op != "call":  # a fusion or an async wrapper: same scope
          visit(c, m, depth + 1, seen)
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
  return CollectiveSummary(count, operand, wire, unknown, dcn, cross,
                           int(parts.group(1)) if parts else None)


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


def _result_bytes(op: str, shape: str, rest: str = "") -> float:
  """Bytes of a collective's result (``rest``: the text after the op's opening parenthesis)."""
  if not op.endswith("-start"):
    return shape_bytes(shape)
  return start_result_bytes(shape, _operand_count(rest))


def start_result_bytes(shape: str, n_operands: int) -> float:
  """Result bytes of an async start from its shape, in either print format.

  Forms (context scalars ``u32[]`` at the end dropped first):
  ``f32[16]`` or ``(f32[16], f32[8])``: the results alone (the older all-reduce-start);
  ``(f32[16], f32[16])`` with one operand: (operand, result);
  ``((f32[8]), f32[2])``: ((operands), results), as async-start and all-gather-start print.
  """
  parts = _top_level(shape)
  while len(parts) > 1 and _CONTEXT.match(parts[-1].strip()):
    parts.pop()
  if len(parts) == 2 and parts[0].lstrip().startswith("("):
    return shape_bytes(parts[1])
  if n_operands and len(parts) == 2 * n_operands:
    return float(sum(shape_bytes(p) for p in parts[n_operands:]))
  return float(sum(shape_bytes(p) for p in parts))


def _top_level(shape: str) -> list[str]:
  """The elements of a tuple shape (``[shape]`` for an array), nested tuples kept whole."""
  shape = re.sub(r"/\*[^*]*\*/", "", shape).strip()
  if not shape.startswith("("):
    return [shape]
  parts, depth, cur = [], 0, ""
  for ch in shape[1:-1] if shape.endswith(")") else shape[1:]:
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    if ch == "," and depth == 0:
      parts.append(cur)
      cur = ""
    else:
      cur += ch
  if cur.strip():
    parts.append(cur)
  return parts


def _operand_count(rest: str) -> int:
  """Operands of an instruction: top-level entries before its closing parenthesis."""
  depth, n, any_text = 0, 0, False
  for ch in re.sub(r"/\*[^*]*\*/", "", rest):
    if ch in "([{":
      depth += 1
    elif ch in "]}":
      depth -= 1
    elif ch == ")":
      if depth == 0:
        break
      depth -= 1
    elif ch == "," and depth == 0:
      n += 1
    elif not ch.isspace():
      any_text = True
  return n + 1 if any_text else 0
