"""kcat 1.7 (librdkafka 2.0, Debian's) against a skiff node: produce with every
codec, keys, headers, null values and binary files; read back byte-exact; the
batches on the node carry the codec kcat used; `kcat -L` metadata."""

import json
import os
import random
import shutil
import subprocess

import pytest

import ck
import kafka_wire as kw

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
FORMAT = r"%K:%k|%S:%s|%o|%p|%h\n"

pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat not installed (scripts/test installs it)")


def kcat(*args, stdin=b"", timeout=60):
    cmd = [KCAT, *args]
    p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {p.returncode}\nstderr: {p.stderr.decode(errors='replace')[-3000:]}"
        )
    err = p.stderr.decode(errors="replace")
    assert "Delivery failed" not in err and "ERROR" not in err, f"{' '.join(cmd)}: {err[-3000:]}"
    return p.stdout


def parse_format(out: bytes):
    """Messages printed with FORMAT, parsed by length so any byte may appear in
    keys and values: [(key, value, offset, partition, headers_text)]."""
    msgs = []
    pos = 0

    def sized():
        nonlocal pos
        colon = out.index(b":", pos)
        n = int(out[pos:colon])
        pos = colon + 1
        if n < 0:
            data = None
        else:
            data = out[pos : pos + n]
            pos += n
        assert out[pos : pos + 1] == b"|", f"bad kcat output at {pos}: {out[pos - 20 : pos + 20]!r}"
        pos += 1
        return data

    while pos < len(out):
        key = sized()
        value = sized()
        nl = out.index(b"\n", pos)
        offset, partition, headers = out[pos:nl].split(b"|", 2)
        pos = nl + 1
        msgs.append((key, value, int(offset), int(partition), headers.decode()))
    return msgs


def consume(bootstrap, topic, partition=0):
    return parse_format(
        kcat("-C", "-b", bootstrap, "-t", topic, "-p", str(partition), "-o", "beginning", "-e", "-q", "-f", FORMAT)
    )


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_lines(node, topic_name, codec):
    ck.create_topic(node.bootstrap, topic_name, 1)
    lines = [b"key-%d:%s" % (i, b"payload %d " % i * (1 + i % 30)) for i in range(500)]
    lines.insert(7, b"nullvalue:")  # -Z: an empty value is sent as NULL
    lines.insert(9, b"colon:a:b:c")  # only the first ':' splits key from value
    kcat(
        "-P", "-b", node.bootstrap, "-t", topic_name, "-p", "0", "-z", codec, "-K:", "-Z",
        "-H", "trace=abc", "-H", "trace=def", "-H", "empty=",
        "-X", "linger.ms=50",
        stdin=b"\n".join(lines) + b"\n",
    )
    msgs = consume(node.bootstrap, topic_name)
    assert len(msgs) == len(lines), f"{len(msgs)} messages back, produced {len(lines)}"
    for i, (line, (key, value, offset, partition, headers)) in enumerate(zip(lines, msgs)):
        want_key, want_value = line.split(b":", 1)
        if want_value == b"":
            want_value = None
        assert (key, value) == (want_key, want_value), f"offset {offset}: {(key, value)!r} != {(want_key, want_value)!r}"
        assert (offset, partition) == (i, 0)
        assert headers == "trace=abc,trace=def,empty=", f"offset {offset}: headers {headers!r}"

    batches = kw.all_batches(node.bootstrap, topic_name, 0)
    assert all(b["crc_ok"] for b in batches), batches
    kw.assert_codec(batches, codec, f"kcat -z {codec}")
    assert sum(b["count"] for b in batches) == len(lines)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_binary_files_byte_exact(node, topic_name, codec, tmp_path):
    """Each file is one message: every byte value, newlines and NULs, 200 KB."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    rng = random.Random(3)
    payloads = [bytes(range(256)) * 8, b"\n\n\x00\n", rng.randbytes(200_000), b"x"]
    files = []
    for i, data in enumerate(payloads):
        f = tmp_path / f"m{i}.bin"
        f.write_bytes(data)
        files.append(str(f))
    kcat("-P", "-b", node.bootstrap, "-t", topic_name, "-p", "0", "-z", codec, "-k", "bin\tkey", *files)
    msgs = consume(node.bootstrap, topic_name)
    assert [m[2] for m in msgs] == list(range(len(payloads)))
    for (key, value, *_), want in zip(msgs, payloads):
        assert key == b"bin\tkey"
        assert value == want, f"{len(value)} bytes back, {len(want)} sent; first diff at {next((i for i, (a, b) in enumerate(zip(value, want)) if a != b), None)}"


def test_random_partitioner_spreads_and_keeps_order(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 4)
    lines = [b"k%d:v%05d" % (i % 13, i) for i in range(2000)]
    kcat("-P", "-b", node.bootstrap, "-t", topic_name, "-K:", "-z", "lz4", stdin=b"\n".join(lines) + b"\n")
    seen = []
    for p in range(4):
        msgs = consume(node.bootstrap, topic_name, p)
        assert [m[2] for m in msgs] == list(range(len(msgs))), f"partition {p}: offsets not contiguous"
        # the same key always lands on the same partition, in produce order
        vals = [m[1] for m in msgs]
        assert vals == sorted(vals), f"partition {p}: out of order"
        seen += vals
    assert sorted(seen) == sorted(line.split(b":", 1)[1] for line in lines)


def test_metadata_list(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 3)
    md = json.loads(kcat("-L", "-J", "-b", node.bootstrap, "-t", topic_name))
    assert [b["id"] for b in md["brokers"]] == [1], md
    assert md["brokers"][0]["name"] == node.bootstrap, md
    topics = {t["topic"]: t for t in md["topics"]}
    assert topic_name in topics, md
    t = topics[topic_name]
    assert "error" not in t or not t["error"], t
    parts = sorted(t["partitions"], key=lambda p: p["partition"])
    assert [p["partition"] for p in parts] == [0, 1, 2]
    for p in parts:
        assert p["leader"] == 1
        assert [r["id"] for r in p["replicas"]] == [1]
        assert [r["id"] for r in p["isrs"]] == [1]

    text = kcat("-L", "-b", node.bootstrap).decode()
    assert f'topic "{topic_name}" with 3 partitions' in text, text


def test_query_offset_by_timestamp(node, topic_name):
    """kcat -Q: ListOffsets by timestamp through librdkafka 2.0."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    p = ck.producer(node.bootstrap, {"linger.ms": 0})
    base = 1_650_000_000_000
    for i in range(10):
        p.produce(topic_name, value=b"%d" % i, partition=0, timestamp=base + 100 * i)
        ck.flush(p)
    out = kcat("-Q", "-b", node.bootstrap, "-t", f"{topic_name}:0:{base + 450}").decode()
    # "<topic> [0] offset 5"
    assert f"{topic_name} [0] offset 5" in out, out
