"""`chinchax compile` while another process holds libtpu's lock (/tmp/libtpu_lockfile): it
waits its turn, saying whom for, and past CHINCHAX_LIBTPU_LOCK_TIMEOUT_S one line naming the
holder (its id and command line) and what to do, never libtpu's advice to delete a live
process's lock. The holder is a real second process with a POSIX lock on the file; the
end-to-end test runs in a private /tmp (a mount namespace) so other processes on the host keep
theirs."""

import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from chinchax.aot import topology

REPO = pathlib.Path(__file__).resolve().parent.parent
HOLD = textwrap.dedent("""
    import fcntl, sys, time
    f = open(sys.argv[1], "a+")
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
""")


def _hold(path, seconds=120):
  proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)],
                          stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_the_holder_of_a_lock_is_found_in_proc_locks(tmp_path):
  lockfile = tmp_path / "libtpu_lockfile"
  assert topology.libtpu_lock_message(lockfile) is None  # absent: nobody holds it
  lockfile.touch()
  assert topology.lock_holders(lockfile) == []
  holder = _hold(lockfile)
  try:
    assert topology.lock_holders(lockfile) == [holder.pid]
    line = topology.libtpu_lock_message(lockfile)
    assert f"process {holder.pid} (" in line and "-c" in line and f"kill {holder.pid}" in line
    assert "rm" not in line.replace("do not delete", "")
  finally:
    holder.kill()
    holder.wait()
  assert topology.lock_holders(lockfile) == []


@pytest.mark.skipif(not topology.libtpu_available(), reason="libtpu is not installed")
def test_compile_while_another_process_holds_libtpus_lock_names_it():
  if shutil.which("unshare") is None:
    pytest.skip("unshare is not installed")
  work = pathlib.Path(tempfile.mkdtemp(dir="/var/tmp"))  # seen under the private /tmp too
  script = work / "hold.py"
  script.write_text(HOLD)
  inner = (f"mount -t tmpfs tmpfs /tmp || exit 99; "
           f"{sys.executable} {script} /tmp/libtpu_lockfile 300 > {work}/held & holder=$!; "
           f"while ! grep -q held {work}/held 2>/dev/null; do "
           f"kill -0 $holder 2>/dev/null || exit 98; sleep 0.1; done; "
           f"HOME={work} JAX_PLATFORMS=cpu CHINCHAX_LIBTPU_LOCK_TIMEOUT_S=3 "
           f"{sys.executable} -m chinchax.cli compile --topology v5e-8 "
           f"--no-cache --config {REPO}/configs/train.py:tiny; status=$?; "
           f"kill $holder; exit $status")
  try:  # HOME: chinchax's own per-user lock is private too (no wait for other compiles)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                       capture_output=True, text=True, timeout=900, cwd=REPO)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  if r.returncode == 98:  # the holder could not start there (its Python under /tmp, now hidden)
    pytest.skip("the lock holder could not run under a private /tmp")
  if r.returncode == 99 or "unshare failed" in r.stderr or "Operation not permitted" in r.stderr:
    pytest.skip(f"no private /tmp here: {r.stderr.strip()[:200]}")
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert r.returncode == 2 and len(errors) == 1, r.stderr[-3000:]
  assert "holds its lock /tmp/libtpu_lockfile" in errors[0] and str(script) in errors[0]
  assert "waited 3 s" in errors[0] and "ALLOW_MULTIPLE_LIBTPU_LOAD=1" in errors[0]
  assert "this compile waits for it" in r.stderr  # said before the wait
  assert "sudo rm" not in r.stderr, r.stderr[-3000:]
