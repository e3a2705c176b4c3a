"""The disk nemesis's cleanup of a killed run's leftovers: a loop device
left attached read-write by a run that never finished is detached and its
image deleted; an image someone attached read-only to look inside a kept
run, and any image of a run that wrote its summary.json, stay (a session
lost seed 10001's images to the next run's start while it was reading
them). Real loop devices: needs root and losetup, as the disk-full nemesis
does. The cleanup is held to the test's own directory: run unscoped beside
a nemesis run, it would take that run's disks (it did, once)."""

import os
import subprocess

import pytest

from nemesis import disks

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or bool(disks.missing_tools()),
                                reason="needs root and losetup (the disk-full nemesis's tools)")


def _image(run_dir, kept):
    node = run_dir / "node1"
    node.mkdir(parents=True)
    image = node / disks.IMAGE_NAME
    with open(image, "wb") as f:
        f.truncate(1 << 20)
    if kept:
        (run_dir / "summary.json").write_text("{}")
    return str(image)


def _attach(image, read_only):
    args = ["losetup", "--find", "--show"] + (["--read-only"] if read_only else []) + [image]
    return subprocess.run(args, check=True, capture_output=True).stdout.decode().strip()


def _attached(device):
    return any(d == device for d, _, _ in disks._loops())


def test_leftovers_of_a_killed_run_go_and_a_kept_runs_images_stay(tmp_path):
    killed = _image(tmp_path / "seed1-killed", kept=False)
    kept_rw = _image(tmp_path / "seed2-kept", kept=True)
    looking = _image(tmp_path / "seed3-kept", kept=True)
    devices = [_attach(killed, False), _attach(kept_rw, False), _attach(looking, True)]
    try:
        found = disks.remove_leftovers(log=lambda *_: None, under=tmp_path)
        assert sorted(found) == sorted([killed, kept_rw])
        assert not os.path.exists(killed), "a killed run's image is deleted"
        assert not _attached(devices[0])
        assert os.path.exists(kept_rw), "a finished run's image is kept (detached)"
        assert not _attached(devices[1])
        assert os.path.exists(looking) and _attached(devices[2]), "a read-only look is left alone"
    finally:
        for d in devices:
            subprocess.run(["losetup", "--detach", d], check=False, capture_output=True)
