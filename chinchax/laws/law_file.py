"""A law file: the JSON of a fit (``fit.json``) or any object with a law's keys, read from a
local path or a ``gs://`` URL with a bounded wait (:func:`read_law_file`)."""

from __future__ import annotations

import json
import os

from chinchax.storage import gcs
from chinchax.storage import paths as paths_lib


def read_law_file(spec) -> object | None:
  """The JSON in law file ``spec`` (a local path or a ``gs://`` URL), or None when ``spec`` is
  not a string naming an existing file or object (a published law's name, a missing file).

  Raises:
    ValueError: the file is not valid JSON, or its storage gave no answer within
      ``chinchax.storage.gcs.CHECK_TIMEOUT_S``.
  """
  if not isinstance(spec, str) or not spec:
    return None
  if paths_lib.is_url(spec):
    try:
      text = gcs.bounded(lambda: paths_lib.as_path(spec).read_text())
    except (FileNotFoundError, IsADirectoryError, paths_lib.PathError):
      return None
    except gcs.Unreachable as e:
      raise ValueError(f"law file {spec!r} cannot be read: the storage service at "
                       f"{gcs.endpoint()} gave {e}") from None
  elif os.path.isfile(spec):
    with open(spec) as f:
      text = f.read()
  else:
    return None
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"law file {spec!r} is not valid JSON: {e}") from None
