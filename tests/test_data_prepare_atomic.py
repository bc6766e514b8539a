"""Nothing left behind: a bad row, a KeyboardInterrupt or a SIGKILL during a preparation leaves the
output folder byte for byte as it was before the command, and the next run redoes that source
alone (to the bytes of an uninterrupted preparation)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from andrea_jax.data import DataError, hub, load_tokenizer, prepare
from andrea_jax.data.hub import HubSpec
from tests.util import REPO

datasets = pytest.importorskip("datasets")
BYTES = load_tokenizer("bytes")
KNOWN = ("chat", "smoltalk")


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def _rows(n: int, bad_at: int | None = None) -> list[dict]:
  rows = [{"messages": [{"role": "user", "content": f"question {i}"},
                        {"role": "assistant", "content": f"answer {i} " * (1 + i % 4)}]}
          for i in range(n)]
  if bad_at is not None:
    rows[bad_at] = {"messages": None}
  return rows


def _dataset(path, rows) -> str:
  datasets.Dataset.from_list(rows).save_to_disk(str(path))
  return str(path)


def _snapshot(folder) -> dict[str, bytes]:
  """Every file under ``folder`` (hidden ones too) and its bytes."""
  out = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      out[os.path.relpath(path, folder)] = open(path, "rb").read()
  return out


def _prepare(specs, out, **kw):
  return prepare(specs, BYTES, str(out), progress=False, known_sources=KNOWN, **kw)


def _staging_left(tmp_path) -> list[str]:
  return [n for n in os.listdir(tmp_path) if ".staging-" in n]


def test_a_bad_row_at_row_1500_leaves_the_folder_as_it_was(tmp_path):
  good = HubSpec(_dataset(tmp_path / "good", _rows(50)), layout="messages")
  bad = HubSpec(_dataset(tmp_path / "bad", _rows(2000, bad_at=1500)), layout="messages",
                loss_on="assistant")
  out = tmp_path / "out"
  _prepare({"chat": good}, out)
  before = _snapshot(out)
  with pytest.raises(DataError, match=r"source 'smoltalk': dataset '.*bad', split 'train', "
                                      r"row 1500: missing field 'messages'"):
    _prepare({"chat": good, "smoltalk": bad}, out)
  assert _snapshot(out) == before     # no shard of the first 1000 rows, no temporary file
  assert _staging_left(tmp_path) == []
  # A folder the failed command created is gone again.
  with pytest.raises(DataError, match="row 1500"):
    _prepare({"smoltalk": bad}, tmp_path / "fresh")
  assert not (tmp_path / "fresh").exists()


def test_a_source_prepared_again_keeps_its_old_shards_until_the_new_ones_are_whole(
    tmp_path, monkeypatch):
  monkeypatch.setattr(hub, "BATCH_ROWS", 16)
  spec = HubSpec(_dataset(tmp_path / "ds", _rows(200)), layout="messages")
  out = tmp_path / "out"
  _prepare({"chat": spec}, out)
  before = _snapshot(out)
  documents = hub.documents

  def interrupted(source, *a, **kw):
    for i, batch in enumerate(documents(source, *a, **kw)):
      if i == 3:
        raise KeyboardInterrupt
      yield batch

  monkeypatch.setattr(hub, "documents", interrupted)
  masked = spec._replace(loss_on="assistant")
  with pytest.raises(KeyboardInterrupt):
    _prepare({"chat": masked}, out)
  assert _snapshot(out) == before     # the old shards, listed, usable
  assert _staging_left(tmp_path) == []
  monkeypatch.setattr(hub, "documents", documents)
  assert _prepare({"chat": masked}, out).prepared == ("chat",)
  fresh = tmp_path / "fresh"
  _prepare({"chat": masked}, fresh)
  assert _snapshot(out) == _snapshot(fresh)


def test_an_interrupt_mid_source_keeps_the_finished_sources_and_nothing_of_the_rest(
    tmp_path, monkeypatch):
  monkeypatch.setattr(hub, "BATCH_ROWS", 8)
  specs = {"chat": HubSpec(_dataset(tmp_path / "a", _rows(40)), layout="messages"),
           "smoltalk": HubSpec(_dataset(tmp_path / "b", _rows(90)), layout="messages",
                               loss_on="assistant")}
  _prepare({"chat": specs["chat"]}, tmp_path / "chat_only")
  documents = hub.documents

  def interrupted(source, *a, **kw):
    for i, batch in enumerate(documents(source, *a, **kw)):
      if source == "smoltalk" and i == 5:
        raise KeyboardInterrupt
      yield batch

  monkeypatch.setattr(hub, "documents", interrupted)
  out = tmp_path / "out"
  with pytest.raises(KeyboardInterrupt):
    _prepare(specs, out)
  # As if only the finished source had been asked for: its files, its manifest, the lock.
  assert _snapshot(out) == _snapshot(tmp_path / "chat_only")
  monkeypatch.setattr(hub, "documents", documents)
  result = _prepare(specs, out)
  assert (result.prepared, result.skipped) == (("smoltalk",), ("chat",))
  _prepare(specs, tmp_path / "fresh")
  assert _snapshot(out) == _snapshot(tmp_path / "fresh")


KILLED = textwrap.dedent("""
    import sys, time
    from andrea_jax.data import hub, load_tokenizer, prepare
    from andrea_jax.data.hub import HubSpec
    hub.BATCH_ROWS = 16
    documents = hub.documents

    def slow(source, *a, **kw):   # says when it is inside the source, then takes its time
      for i, batch in enumerate(documents(source, *a, **kw)):
        if i == 2:
          open(sys.argv[3], "w").close()
          time.sleep(60)
        yield batch

    hub.documents = slow
    specs = {"chat": HubSpec(sys.argv[1], layout="messages"),
             "smoltalk": HubSpec(sys.argv[2], layout="messages", loss_on="assistant")}
    prepare(specs, load_tokenizer("bytes"), sys.argv[4], progress=False,
            known_sources=("chat", "smoltalk"))
""")


@pytest.mark.slow
def test_a_sigkill_mid_source_leaves_the_folder_as_it_was_and_the_next_run_redoes_it(tmp_path):
  specs = {"chat": HubSpec(_dataset(tmp_path / "a", _rows(40)), layout="messages"),
           "smoltalk": HubSpec(_dataset(tmp_path / "b", _rows(200)), layout="messages",
                               loss_on="assistant")}
  out = tmp_path / "out"
  _prepare({"chat": specs["chat"]}, out)
  before = _snapshot(out)
  ready = tmp_path / "ready"
  env = dict(os.environ, PYTHONPATH=str(REPO), HF_DATASETS_CACHE=str(tmp_path / "hf_cache"))
  proc = subprocess.Popen([sys.executable, "-c", KILLED, specs["chat"].dataset,
                           specs["smoltalk"].dataset, str(ready), str(out)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 120
  while not ready.exists():
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    assert time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  assert _snapshot(out) == before
  assert len(_staging_left(tmp_path)) == 1   # beside the folder, never in it
  result = _prepare(specs, out)
  assert (result.prepared, result.skipped) == (("smoltalk",), ("chat",))
  assert _staging_left(tmp_path) == []       # the next run cleared it
  _prepare(specs, tmp_path / "fresh")
  assert _snapshot(out) == _snapshot(tmp_path / "fresh")
