"""A small filesystem of its own per node, for the disk-full nemesis: a
sparse image file (IMAGE_BYTES), a loop device (`losetup`), ext4 with no
blocks reserved for root (the node runs as root: reserved blocks would let it
write on), mounted at <node dir>/disk; the node's data directory is
<node dir>/disk/data. Filling it (`fill`) leaves no free block; `unfill`
gives the space back. skiff writes with O_DIRECT, which ext4 supports.

Only runs whose nemeses include disk-full use these (the others keep their
data directories on the run directory's filesystem: no mkfs and mount cost).

Leftovers of a killed run (a mount, an attached loop device) are found by
the image's name (IMAGE_NAME under a run directory) and removed at the next
start; a run removes its own at exit. A failing run keeps its images (its
data) in the run directory, detached: `mount -o loop,ro <image> /mnt` to look
inside. Neither is a leftover: an image attached read-only (someone looking)
is left alone, and an image of a run that finished (its summary.json
written) is never deleted (a session lost seed 10001's images that way)."""

import errno
import json
import os
import shutil
import subprocess
import time

IMAGE_NAME = "skiff-nemesis-disk.img"
IMAGE_BYTES = 2 << 30  # sparse: only what is written takes space
FILLER = "nemesis-filler"
CMD_TIMEOUT_S = 60.0


class DiskError(Exception):
    pass


def _run(args, check=True):
    p = subprocess.run(args, capture_output=True, timeout=CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise DiskError(f"{' '.join(args)} exited {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    return p


def missing_tools():
    return [t for t in ("losetup", "mkfs.ext4", "mount", "umount") if shutil.which(t) is None]


def _loops():
    """[(device, backing file, read-only)] of every attached loop device."""
    p = _run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE,RO"], check=False)
    try:
        rows = json.loads(p.stdout.decode() or "{}").get("loopdevices", [])
    except ValueError:
        return []
    return [(r.get("name"), (r.get("back-file") or "").replace(" (deleted)", ""),
             r.get("ro") in (True, 1, "1")) for r in rows]


def _kept(image):
    """Whether the image belongs to a run that finished and kept its
    directory (<run dir>/node<N>/IMAGE_NAME next to <run dir>/summary.json)."""
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(image)))
    return os.path.exists(os.path.join(run_dir, "summary.json"))


def _mounts_of(device):
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and parts[0] == device:
                out.append(parts[1])
    return out


def _release(device, image, log):
    for mnt in _mounts_of(device):
        if _run(["umount", mnt], check=False).returncode != 0:
            _run(["umount", "-l", mnt], check=False)
        log(f"disk: unmounted {mnt}")
    _run(["losetup", "--detach", device], check=False)


def remove_leftovers(log=print, under=None):
    """Unmount and detach every loop device a killed run left attached
    (read-write, backed by a suite image), and delete those images unless
    their run finished and kept them. A device attached read-only is someone
    looking inside a kept run's data: left alone. `under`: only images below
    that directory (a test's own; the suite's start takes every one, as its
    run lock says no other run is under way). Returns the images found."""
    found = []
    root = None if under is None else os.path.join(os.path.abspath(under), "")
    for device, back, read_only in _loops():
        if os.path.basename(back) != IMAGE_NAME or read_only:
            continue
        if root is not None and not os.path.abspath(back).startswith(root):
            continue
        _release(device, back, log)
        if not _kept(back):
            try:
                os.unlink(back)
            except FileNotFoundError:
                pass
        found.append(back)
    return found


class Disk:
    """One node's filesystem."""

    def __init__(self, node_dir):
        self.image = os.path.join(node_dir, IMAGE_NAME)
        self.mountpoint = os.path.join(node_dir, "disk")
        self.data_dir = os.path.join(self.mountpoint, "data")
        self.filler = os.path.join(self.mountpoint, FILLER)
        self.device = None

    def setup(self):
        with open(self.image, "wb") as f:
            f.truncate(IMAGE_BYTES)
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
              self.image])
        p = _run(["losetup", "--find", "--show", self.image])
        self.device = p.stdout.decode().strip()
        os.makedirs(self.mountpoint, exist_ok=True)
        # noinit_itable: no background zeroing of the inode tables (writes
        # the image would take on disk for nothing; it is a scratch fs)
        _run(["mount", "-t", "ext4", "-o", "noinit_itable", self.device, self.mountpoint])
        os.makedirs(self.data_dir, exist_ok=True)

    def free_bytes(self):
        st = os.statvfs(self.mountpoint)
        return st.f_bavail * st.f_frsize

    def _grab(self, path):
        """Allocates what is free to `path` (fallocate: no data written);
        returns the bytes taken."""
        taken = 0
        with open(path, "ab") as f:
            start = os.fstat(f.fileno()).st_size
            chunk = self.free_bytes()
            while chunk >= 4096:
                try:
                    os.posix_fallocate(f.fileno(), start + taken, chunk)
                    taken += chunk
                    chunk = self.free_bytes()
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    chunk //= 2
        return taken

    def fill(self):
        """Takes every free block; returns (bytes taken, bytes still free)."""
        taken = self._grab(self.filler)
        return taken, self.free_bytes()

    def keep_full(self, stop, period_s=0.0005):
        """Until `stop` is set, takes whatever becomes free (a thread's
        loop). The node frees space itself: a rolled segment is trimmed to
        its data, and the next segment would preallocate (32 MiB) what the
        trim gave back before the first write needing a new block fails; so
        the disk is kept full, not filled once. Returns the bytes taken."""
        taken = 0
        while not stop.wait(period_s):
            if self.free_bytes() >= 4096:
                taken += self._grab(self.filler)
        return taken

    def unfill(self):
        try:
            os.unlink(self.filler)
        except FileNotFoundError:
            pass

    def teardown(self, keep_image=False, log=print):
        if self.device is not None:
            deadline = time.monotonic() + 10
            while True:
                if _run(["umount", self.mountpoint], check=False).returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if os.path.ismount(self.mountpoint):
                _run(["umount", "-l", self.mountpoint], check=False)
                log(f"disk: {self.mountpoint} busy, unmounted lazily")
            _run(["losetup", "--detach", self.device], check=False)
            self.device = None
        if not keep_image:
            try:
                os.unlink(self.image)
            except FileNotFoundError:
                pass
