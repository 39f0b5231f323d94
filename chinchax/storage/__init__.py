"""Where files live: local and ``gs://`` paths, conditional writes, and a full disk.

- :mod:`chinchax.storage.paths`: one Path-like API over local directories and buckets;
- :mod:`chinchax.storage.gcs`: gs:// specifics (gcsfs, conditional object writes);
- :mod:`chinchax.storage.diskfull`: turning "no space left on device" into one line.

May import: errors, console.
"""
