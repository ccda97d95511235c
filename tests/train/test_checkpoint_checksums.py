"""Checkpoints carry a checksum of every file: `checksums.json` in each step directory
(sizes and blake2b digests), written once orbax has finished the step, synchronous or
asynchronous. A step whose files no longer match (bytes flipped in an array file, a file
truncated or removed) is skipped at resume with one line naming it and its first bad file,
and the previous one restored; `verify_step` (what `rljax export` calls) refuses it in one
line; the non-finite stop names the newest verified step as the last good one. A step
without a manifest is used with one warning line. An intact step restores bit-identically.

Each case saves a two-step checkpoint of a small state (no model)."""

import glob
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.checkpoint import Checkpointer, CheckpointError, abstract_like, resume, verify_step


def make_state():
    return {"w": jax.random.normal(jax.random.key(0), (64, 64), jnp.float32),
            "b": jnp.arange(7, dtype=jnp.bfloat16), "count": jnp.int32(3)}


def saved_state(step):
    return jax.tree.map(lambda x: x + step, make_state())


def save_two(directory, async_save=False) -> str:
    """Checkpoints 1 and 2 of `saved_state`; -> the checkpoints directory."""
    ckpt = Checkpointer(directory, async_save=async_save)
    for step in (1, 2):
        ckpt.save(step, saved_state(step), {"position": step}, {"step": step})
    ckpt.close()
    return str(directory)


def largest_array_file(step_dir) -> str:
    return max(glob.glob(f"{step_dir}/state/ocdbt.process_0/d/*"), key=os.path.getsize)


def flip_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


DAMAGE = {
    "flipped byte in an array file": flip_byte,
    "truncated array file": truncate,
    "missing array file": os.remove,
}


def restore_latest(directory, **kw):
    return resume("auto", Checkpointer(directory, async_save=False), abstract_like(make_state()), **kw)


def lines(captured) -> list[str]:
    return [line for line in (captured.out + captured.err).splitlines() if line.strip()]


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_every_file_of_every_step_has_its_checksum(tmp_path, async_save):
    directory = save_two(tmp_path / "ckpt", async_save)
    for step in (1, 2):
        step_dir = os.path.join(directory, str(step))
        on_disk = sorted(os.path.relpath(os.path.join(root, name), step_dir)
                         for root, _, names in os.walk(step_dir) for name in names)
        assert "checksums.json" in on_disk and not [n for n in on_disk if n.startswith("checksums.json.")]
        with open(os.path.join(step_dir, "checksums.json")) as f:
            files = json.load(f)["files"]
        assert sorted(files) == [n for n in on_disk if n != "checksums.json"]
        assert any(name.startswith("state/ocdbt.process_0/d/") for name in files)
        for name, entry in files.items():
            with open(os.path.join(step_dir, name), "rb") as f:
                data = f.read()
            assert entry["size"] == len(data)
            assert entry["blake2b"] == hashlib.blake2b(data, digest_size=32).hexdigest()


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_an_intact_checkpoint_restores_bit_identically_without_a_word(tmp_path, capsys, async_save):
    directory = save_two(tmp_path / "ckpt", async_save)
    capsys.readouterr()
    found = restore_latest(directory)
    assert found.step == 2 and found.meta == {"step": 2} and found.data_state == {"position": 2}
    for got, want in zip(jax.tree.leaves(found.state), jax.tree.leaves(saved_state(2))):
        assert got.dtype == want.dtype and np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert lines(capsys.readouterr()) == []
    verify_step(directory, 2)  # no error, no warning
    assert lines(capsys.readouterr()) == []


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_step_is_skipped_at_resume_naming_its_first_bad_file(tmp_path, capsys, damage):
    directory = save_two(tmp_path / "ckpt")
    bad = largest_array_file(os.path.join(directory, "2"))
    DAMAGE[damage](bad)
    rel = os.path.relpath(bad, os.path.join(directory, "2"))
    capsys.readouterr()

    with pytest.raises(CheckpointError) as info:  # told not to fall back: one line, nothing moved
        restore_latest(directory, fallback=False)
    message = str(info.value)
    assert "\n" not in message and f"{directory}/2 is damaged" in message and rel in message, message
    assert sorted(os.listdir(directory)) == ["1", "2"]

    found = restore_latest(directory)
    assert found.step == 1
    for got, want in zip(jax.tree.leaves(found.state), jax.tree.leaves(saved_state(1))):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    said = lines(capsys.readouterr())
    assert len(said) == 1 and f"{directory}/2 is damaged ({rel}" in said[0] and f"{directory}/1" in said[0], said
    assert sorted(os.listdir(directory)) == ["1", "2.damaged"]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_export_refuses_a_damaged_step_in_one_line(tmp_path, capsys, damage):
    directory = save_two(tmp_path / "ckpt")
    bad = largest_array_file(os.path.join(directory, "2"))
    DAMAGE[damage](bad)
    with pytest.raises(CheckpointError) as info:
        verify_step(directory, 2)
    message = str(info.value)
    assert "\n" not in message and f"{directory}/2 is damaged" in message, message
    assert os.path.relpath(bad, os.path.join(directory, "2")) in message
    assert f"the newest intact one is {directory}/1 (--step 1)" in message
    verify_step(directory, 1)
    assert lines(capsys.readouterr()) == []


def test_a_step_without_a_manifest_is_used_with_one_warning(tmp_path, capsys):
    directory = save_two(tmp_path / "ckpt")
    os.remove(os.path.join(directory, "2", "checksums.json"))
    capsys.readouterr()
    found = restore_latest(directory)
    assert found.step == 2
    said = lines(capsys.readouterr())
    assert len(said) == 1 and "warning" in said[0] and f"{directory}/2" in said[0] and "unverified" in said[0]
    verify_step(directory, 2)
    said = lines(capsys.readouterr())
    assert len(said) == 1 and "unverified" in said[0]


def test_an_unreadable_manifest_makes_the_step_damaged(tmp_path, capsys):
    directory = save_two(tmp_path / "ckpt")
    truncate(os.path.join(directory, "2", "checksums.json"))
    capsys.readouterr()
    assert restore_latest(directory).step == 1
    said = lines(capsys.readouterr())
    assert len(said) == 1 and f"{directory}/2 is damaged (checksums.json" in said[0], said


def test_every_step_damaged_stops_with_one_line(tmp_path):
    directory = save_two(tmp_path / "ckpt")
    for step in (1, 2):
        flip_byte(largest_array_file(os.path.join(directory, str(step))))
    with pytest.raises(CheckpointError, match=r"/2 is damaged .*none of the 1 earlier checkpoints restores") as info:
        restore_latest(directory)
    assert "\n" not in str(info.value)
    assert sorted(os.listdir(directory)) == ["1", "2"]


def test_the_nonfinite_stop_names_the_newest_verified_step_as_last_good(tmp_path):
    from rljax.train.skip_guard import NonFiniteError, SkipGuard

    directory = save_two(tmp_path / "ckpt")
    flip_byte(largest_array_file(os.path.join(directory, "2")))
    guard = SkipGuard(1, "optim.lr", 1e-3, Checkpointer(directory, async_save=False))
    with pytest.raises(NonFiniteError) as info:
        guard.check_params(3, {"w": jnp.array([jnp.nan])}, "not saved")
    assert str(info.value).endswith(f"the last good checkpoint is {directory}/1")

    flip_byte(largest_array_file(os.path.join(directory, "1")))
    with pytest.raises(NonFiniteError) as info:
        guard.check_params(3, {"w": jnp.array([jnp.nan])}, "not saved")
    assert str(info.value).endswith(f"no checkpoint in {directory} verifies against its checksums")


def test_an_asynchronous_save_is_sealed_without_waiting_for_the_next_save(tmp_path):
    """A run killed after an asynchronous save finished (but before its next save or its
    end) resumes from a verified step: the manifest appears while training goes on."""
    import time

    ckpt = Checkpointer(tmp_path / "ckpt", async_save=True)
    ckpt.save(1, saved_state(1), {"position": 1}, {"step": 1})
    manifest = os.path.join(ckpt.path(1), "checksums.json")
    deadline = time.time() + 60
    while not os.path.exists(manifest) and time.time() < deadline:
        time.sleep(0.1)
    assert os.path.exists(manifest)
    ckpt.close()
