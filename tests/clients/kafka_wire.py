"""Kafka wire bytes built by hand, for tests that must send exactly what a client
would not: CRC-32C, RecordBatch v2, request framing, and the few requests and
responses the raw-socket tests need (ApiVersions, Produce v3-v8, InitProducerId v0-v1,
ListOffsets v1). Nothing here is shared with the node's code, so a mistake in the
node cannot hide behind the same mistake here.
"""

import socket
import struct
import time

# ---------------------------------------------------------------- CRC-32C

_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected


def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _CRC32C_POLY if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the standard check value


# ---------------------------------------------------------------- varints


def zigzag_varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    z &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# ---------------------------------------------------------------- RecordBatch v2

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

# Offsets of fields inside a RecordBatch v2 header.
BATCH_CRC_POS = 17  # u32, covers [21:]
BATCH_ATTRS_POS = 21
BATCH_HEADER_LEN = 61


def encode_record(offset_delta, timestamp_delta, key, value, headers=()):
    body = bytearray()
    body += b"\x00"  # attributes
    body += zigzag_varint(timestamp_delta)
    body += zigzag_varint(offset_delta)
    if key is None:
        body += zigzag_varint(-1)
    else:
        body += zigzag_varint(len(key)) + key
    if value is None:
        body += zigzag_varint(-1)
    else:
        body += zigzag_varint(len(value)) + value
    body += zigzag_varint(len(headers))
    for hk, hv in headers:
        hk = hk.encode() if isinstance(hk, str) else hk
        body += zigzag_varint(len(hk)) + hk
        if hv is None:
            body += zigzag_varint(-1)
        else:
            body += zigzag_varint(len(hv)) + hv
    return zigzag_varint(len(body)) + bytes(body)


def record_batch(
    records,
    base_timestamp=None,
    producer_id=NO_PRODUCER_ID,
    producer_epoch=NO_PRODUCER_EPOCH,
    base_sequence=NO_SEQUENCE,
    timestamps=None,
    transactional=False,
):
    """An uncompressed RecordBatch v2 with base offset 0 and a valid CRC-32C.
    `records` is a list of (key, value) or (key, value, headers)."""
    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)
    if timestamps is None:
        timestamps = [base_timestamp] * len(records)
    encoded = bytearray()
    for i, rec in enumerate(records):
        key, value = rec[0], rec[1]
        headers = rec[2] if len(rec) > 2 else ()
        encoded += encode_record(i, timestamps[i] - base_timestamp, key, value, headers)
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            0x10 if transactional else 0,  # attributes: no compression, CreateTime
            len(records) - 1,  # lastOffsetDelta
            base_timestamp,
            max(timestamps),
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
        + bytes(encoded)
    )
    crc = crc32c(after_crc)
    # batchLength counts from partitionLeaderEpoch to the end.
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", 0, batch_length, -1, 2, crc) + after_crc


def corrupt_payload(batch: bytes) -> bytes:
    """Flip one byte in the last record (past the batch header), CRC left as it was."""
    assert len(batch) > BATCH_HEADER_LEN + 2
    b = bytearray(batch)
    b[-2] ^= 0xFF
    return bytes(b)


# ---------------------------------------------------------------- primitives


def string(s):
    if s is None:
        return struct.pack(">h", -1)
    s = s.encode() if isinstance(s, str) else s
    return struct.pack(">h", len(s)) + s


def compact_string(s):
    if s is None:
        return uvarint(0)
    s = s.encode() if isinstance(s, str) else s
    return uvarint(len(s) + 1) + s


def nbytes(b):
    if b is None:
        return struct.pack(">i", -1)
    return struct.pack(">i", len(b)) + b


class Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, n):
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(
                f"short response: need {n} bytes at {self.pos}, have {len(self.data) - self.pos}"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def i8(self):
        return struct.unpack(">b", self.take(1))[0]

    def i16(self):
        return struct.unpack(">h", self.take(2))[0]

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def i64(self):
        return struct.unpack(">q", self.take(8))[0]

    def string(self):
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def uvarint(self):
        shift, out = 0, 0
        for _ in range(10):
            b = self.take(1)[0]
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
        raise ValueError("varint too long")

    def skip_tagged_fields(self):
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())

    def remaining(self):
        return len(self.data) - self.pos


# ---------------------------------------------------------------- framing

API_PRODUCE = 0
API_FETCH = 1
API_LIST_OFFSETS = 2
API_METADATA = 3
API_API_VERSIONS = 18
API_CREATE_TOPICS = 19
API_DELETE_TOPICS = 20
API_INIT_PRODUCER_ID = 22
API_DESCRIBE_CONFIGS = 32
API_INCREMENTAL_ALTER_CONFIGS = 44

ERR_NONE = 0
ERR_OFFSET_OUT_OF_RANGE = 1
ERR_CORRUPT_MESSAGE = 2
ERR_UNKNOWN_TOPIC_OR_PARTITION = 3
ERR_MESSAGE_TOO_LARGE = 10
ERR_UNSUPPORTED_VERSION = 35
ERR_DUPLICATE_SEQUENCE_NUMBER = 46
ERR_OUT_OF_ORDER_SEQUENCE_NUMBER = 45
ERR_INVALID_RECORD = 87

CLIENT_ID = "skiff-raw-test"


def request_header_v1(api_key, api_version, correlation_id, client_id=CLIENT_ID):
    return struct.pack(">hhi", api_key, api_version, correlation_id) + string(client_id)


def request_header_v2(api_key, api_version, correlation_id, client_id=CLIENT_ID):
    # client_id stays a non-compact nullable string in header v2; then tagged fields.
    return request_header_v1(api_key, api_version, correlation_id, client_id) + uvarint(0)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


class Conn:
    """One blocking TCP connection with a timeout on every call."""

    def __init__(self, bootstrap, timeout=10.0):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.settimeout(timeout)
        self.correlation_id = 0

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def recv_frame(self):
        (size,) = struct.unpack(">i", self.recv_exact(4))
        if size < 4 or size > 64 * 1024 * 1024:
            raise ValueError(f"bad response frame size {size}")
        return self.recv_exact(size)

    def request(self, api_key, api_version, body, flexible_header=False):
        """Send one request, return the response bytes after the correlation id.
        The response header's tagged fields (flexible responses other than
        ApiVersions) are left for the caller to skip."""
        self.correlation_id += 1
        cid = self.correlation_id
        header = (request_header_v2 if flexible_header else request_header_v1)(
            api_key, api_version, cid
        )
        self.send_raw(frame(header + body))
        resp = self.recv_frame()
        (got,) = struct.unpack(">i", resp[:4])
        if got != cid:
            raise ValueError(f"correlation id {got} in response, sent {cid}")
        return resp[4:]

    def closed_by_peer(self, timeout=10.0):
        """True when the peer closes (EOF or reset) within `timeout`; any bytes
        received before that are returned in self.leftover."""
        self.leftover = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not chunk:
                return True
            self.leftover += chunk
            if len(self.leftover) > 1 << 20:
                return False
        return False


# ---------------------------------------------------------------- ApiVersions


def parse_api_versions_v0(body: bytes):
    """(error_code, {api_key: (min, max)}) from an ApiVersions v0 response body."""
    r = Reader(body)
    error = r.i16()
    n = r.i32()
    if n < 0 or n > 1000:
        raise ValueError(f"bad api_keys count {n}")
    apis = {}
    for _ in range(n):
        key, lo, hi = r.i16(), r.i16(), r.i16()
        apis[key] = (lo, hi)
    return error, apis


def api_versions(conn: Conn, version=0):
    if version == 0:
        return parse_api_versions_v0(conn.request(API_API_VERSIONS, 0, b""))
    if version >= 3:
        body = compact_string("skiff-tests") + compact_string("1.0") + uvarint(0)
        # ApiVersions responses always use response header v0: no tagged fields.
        resp = conn.request(API_API_VERSIONS, version, body, flexible_header=True)
        r = Reader(resp)
        error = r.i16()
        n = r.uvarint() - 1
        apis = {}
        for _ in range(max(n, 0)):
            key, lo, hi = r.i16(), r.i16(), r.i16()
            r.skip_tagged_fields()
            apis[key] = (lo, hi)
        return error, apis
    raise ValueError("only v0 and v3+ are built here")


# ---------------------------------------------------------------- Produce v3-v8


def produce_request(topic, partition, records_bytes, acks=-1, timeout_ms=10000, version=7,
                    transactional_id=None):
    assert 3 <= version <= 8
    return (
        string(transactional_id)
        + struct.pack(">hi", acks, timeout_ms)
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">i", partition)
        + nbytes(records_bytes)
    )


def parse_produce_response(body: bytes, version=7):
    """[(topic, partition, error_code, base_offset)] from a Produce v3-v8 response."""
    r = Reader(body)
    out = []
    for _ in range(r.i32()):
        topic = r.string()
        for _ in range(r.i32()):
            partition = r.i32()
            error = r.i16()
            base_offset = r.i64()
            r.i64()  # log_append_time_ms (v2+)
            if version >= 5:
                r.i64()  # log_start_offset
            if version >= 8:
                for _ in range(max(r.i32(), 0)):  # record_errors
                    r.i32()
                    r.string()
                r.string()  # error_message
            out.append((topic, partition, error, base_offset))
    r.i32()  # throttle_time_ms
    return out


def produce(conn, topic, partition, records_bytes, acks=-1, version=7, transactional_id=None):
    resp = conn.request(API_PRODUCE, version, produce_request(topic, partition, records_bytes, acks, version=version,
                                                              transactional_id=transactional_id))
    parts = parse_produce_response(resp, version)
    if len(parts) != 1:
        raise ValueError(f"expected one partition response, got {parts}")
    _, _, error, base_offset = parts[0]
    return error, base_offset


# ---------------------------------------------------------------- InitProducerId v0-v1


def init_producer_id(conn, version=1, transactional_id=None, timeout_ms=60000):
    assert version in (0, 1)
    body = string(transactional_id) + struct.pack(">i", timeout_ms)
    r = Reader(conn.request(API_INIT_PRODUCER_ID, version, body))
    r.i32()  # throttle_time_ms
    error = r.i16()
    producer_id = r.i64()
    epoch = r.i16()
    return error, producer_id, epoch


API_ADD_PARTITIONS_TO_TXN = 24


def add_partitions_to_txn(conn, transactional_id, producer_id, epoch, topic, partitions):
    """AddPartitionsToTxn v1 for one topic: {partition: error code}."""
    body = (string(transactional_id) + struct.pack(">qhi", producer_id, epoch, 1) + string(topic)
            + struct.pack(">i", len(partitions)) + b"".join(struct.pack(">i", p) for p in partitions))
    r = Reader(conn.request(API_ADD_PARTITIONS_TO_TXN, 1, body))
    r.i32()  # throttle_time_ms
    out = {}
    for _ in range(r.i32()):
        r.string()
        for _ in range(r.i32()):
            partition = r.i32()
            out[partition] = r.i16()
    return out


# ---------------------------------------------------------------- ListOffsets v1


def list_offset(conn, topic, partition, timestamp):
    """ListOffsets v1: timestamp -1 latest, -2 earliest. Returns (error, offset)."""
    body = (
        struct.pack(">i", -1)  # replica_id
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">iq", partition, timestamp)
    )
    r = Reader(conn.request(API_LIST_OFFSETS, 1, body))
    r.i32()
    r.string()
    r.i32()
    r.i32()  # partition
    error = r.i16()
    r.i64()  # timestamp
    offset = r.i64()
    return error, offset


# ---------------------------------------------------------------- Fetch v4

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def fetch(conn, topic, partition, offset=0, max_bytes=16 * 1024 * 1024, max_wait_ms=100, min_bytes=1):
    """Fetch v4. Returns (error_code, high_watermark, records bytes)."""
    body = (
        struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes, 0)
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">iqi", partition, offset, max_bytes)
    )
    r = Reader(conn.request(API_FETCH, 4, body))
    r.i32()  # throttle_time_ms
    n_topics = r.i32()
    if n_topics != 1:
        raise ValueError(f"fetch: {n_topics} topics in response")
    r.string()
    if r.i32() != 1:
        raise ValueError("fetch: expected one partition")
    r.i32()  # partition_index
    error = r.i16()
    high_watermark = r.i64()
    r.i64()  # last_stable_offset
    n_aborted = r.i32()
    for _ in range(max(n_aborted, 0)):
        r.i64()
        r.i64()
    n = r.i32()
    records = b"" if n < 0 else r.take(n)
    return error, high_watermark, records


def parse_batches(records: bytes):
    """Batch headers of the complete RecordBatch v2 batches in `records`:
    dicts with base_offset, last_offset_delta, count, codec, crc_ok, producer_id,
    base_sequence, magic, size (bytes of the whole batch). A partial batch at the end (allowed in Fetch) is skipped."""
    out = []
    pos = 0
    while pos + BATCH_HEADER_LEN <= len(records):
        base_offset, batch_length = struct.unpack_from(">qi", records, pos)
        end = pos + 12 + batch_length
        if batch_length < BATCH_HEADER_LEN - 12 or end > len(records):
            break
        magic = records[pos + 16]
        (crc,) = struct.unpack_from(">I", records, pos + BATCH_CRC_POS)
        attrs, last_delta, base_ts, max_ts, pid, epoch, base_seq, count = struct.unpack_from(
            ">hiqqqhii", records, pos + BATCH_ATTRS_POS
        )
        out.append(
            dict(
                base_offset=base_offset,
                last_offset_delta=last_delta,
                count=count,
                codec=CODEC_NAMES.get(attrs & 7, f"codec-{attrs & 7}"),
                crc_ok=crc32c(records[pos + BATCH_ATTRS_POS : end]) == crc,
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=base_seq,
                magic=magic,
                size=end - pos,
            )
        )
        pos = end
    return out


# librdkafka sends a batch uncompressed when compressing it would not make it
# smaller (rd_kafka_msgset_writer_compress): a batch that lingered with one tiny
# record, or one whose only record is random bytes (the samples hold one of 5,000
# bytes; whether it travels alone depends on timing). Larger uncompressed batches
# of several records mean the codec was silently dropped.
SMALL_BATCH_BYTES = 256


def assert_codec(batches, codec, where):
    """The stored batches carry `codec`: a client that silently fell back to no
    compression would test nothing. Tiny uncompressed batches and uncompressed
    single-record batches (an incompressible record alone) are allowed."""
    hint = " (librdkafka uses lz4 only when ApiVersions lists FindCoordinator v0)" if codec == "lz4" else ""
    codecs = {b["codec"] for b in batches}
    assert codec in codecs, f"{where}: stored batches have codecs {codecs}{hint}"
    odd = [
        b
        for b in batches
        if b["codec"] != codec and not (b["codec"] == "none" and (b["size"] <= SMALL_BATCH_BYTES or b["count"] == 1))
    ]
    assert not odd, f"{where}: stored batches with another codec: {odd}{hint}"


def all_batches(bootstrap, topic, partition, timeout_s=30.0):
    """Every batch of a partition up to its high watermark, fetched with Fetch v4."""
    batches = []
    offset = 0
    deadline = time.monotonic() + timeout_s
    with Conn(bootstrap) as c:
        while time.monotonic() < deadline:
            error, hw, records = fetch(c, topic, partition, offset)
            if error != ERR_NONE:
                raise AssertionError(f"Fetch v4 {topic}/{partition} at {offset}: error {error}")
            got = parse_batches(records)
            if not got:
                if offset >= hw:
                    return batches
                raise AssertionError(f"Fetch v4 {topic}/{partition} at {offset}: no complete batch below hw {hw}")
            batches += got
            offset = got[-1]["base_offset"] + got[-1]["last_offset_delta"] + 1
            if offset >= hw:
                return batches
    raise AssertionError(f"fetching {topic}/{partition} did not finish in {timeout_s}s")


# ---------------------------------------------------------------- groups (classic protocol)
# JoinGroup v1, SyncGroup v1, Heartbeat v1, LeaveGroup v1: enough for a member
# that joins, takes an assignment and then goes silent.

API_FIND_COORDINATOR = 10
API_JOIN_GROUP = 11
API_HEARTBEAT = 12
API_LEAVE_GROUP = 13
API_SYNC_GROUP = 14

ERR_ILLEGAL_GENERATION = 22
ERR_UNKNOWN_MEMBER_ID = 25
ERR_REBALANCE_IN_PROGRESS = 27


def consumer_subscription(topics):
    """ConsumerProtocolSubscription v0: the metadata of a 'consumer' protocol."""
    return struct.pack(">hi", 0, len(topics)) + b"".join(string(t) for t in topics) + nbytes(None)


def consumer_assignment(assignment):
    """ConsumerProtocolAssignment v0 from {topic: [partitions]}."""
    out = struct.pack(">hi", 0, len(assignment))
    for topic, partitions in assignment.items():
        out += string(topic) + struct.pack(">i", len(partitions))
        out += b"".join(struct.pack(">i", p) for p in partitions)
    return out + nbytes(None)


def find_coordinator(conn, group):
    """FindCoordinator v0 for a group; returns (error, node id). A client asks
    before its first group request (the first lookup creates __consumer_offsets)."""
    r = Reader(conn.request(API_FIND_COORDINATOR, 0, string(group)))
    error, node_id = r.i16(), r.i32()
    return error, node_id


KEY_TYPE_TRANSACTION = 1


def find_coordinator_v1(conn, key, key_type):
    """FindCoordinator v1 (key type 0: a group, 1: a transactional id);
    returns (error, node id, host, port)."""
    r = Reader(conn.request(API_FIND_COORDINATOR, 1, string(key) + struct.pack(">b", key_type)))
    r.i32()  # throttle_time_ms
    error = r.i16()
    r.string()  # error_message
    node_id = r.i32()
    host = r.string()
    port = r.i32()
    return error, node_id, host, port


def join_group(conn, group, member_id, topics, session_timeout_ms, rebalance_timeout_ms=10000, protocol="range"):
    """JoinGroup v1; returns (error, generation, protocol, leader, member_id, [member ids])."""
    body = (
        string(group)
        + struct.pack(">ii", session_timeout_ms, rebalance_timeout_ms)
        + string(member_id)
        + string("consumer")
        + struct.pack(">i", 1)
        + string(protocol)
        + nbytes(consumer_subscription(topics))
    )
    r = Reader(conn.request(API_JOIN_GROUP, 1, body))
    error, generation = r.i16(), r.i32()
    protocol, leader, member = r.string(), r.string(), r.string()
    members = []
    for _ in range(r.i32()):
        members.append(r.string())
        r.take(r.i32())
    return error, generation, protocol, leader, member, members


def sync_group(conn, group, generation, member_id, assignments):
    """SyncGroup v1 with {member id: {topic: [partitions]}}; returns (error, assignment bytes)."""
    body = string(group) + struct.pack(">i", generation) + string(member_id) + struct.pack(">i", len(assignments))
    for member, assignment in assignments.items():
        body += string(member) + nbytes(consumer_assignment(assignment))
    r = Reader(conn.request(API_SYNC_GROUP, 1, body))
    r.i32()  # throttle
    error = r.i16()
    n = r.i32()
    return error, (r.take(n) if n >= 0 else None)


def heartbeat(conn, group, generation, member_id):
    body = string(group) + struct.pack(">i", generation) + string(member_id)
    r = Reader(conn.request(API_HEARTBEAT, 1, body))
    r.i32()  # throttle
    return r.i16()
