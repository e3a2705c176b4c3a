"""/metrics and /health of a running node, scraped the way Prometheus and a load
balancer would (urllib), while real clients (confluent-kafka, kcat) produce and
consume."""

import re
import subprocess

import ck

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')


def parse(text):
    """{(name, labels string): value}, checking every line's grammar on the way."""
    samples = {}
    types = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            types[name] = kind
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        samples[(m.group(1), m.group(3) or "")] = float(m.group(4))
    for name, kind in types.items():
        assert name == name.lower() and name.startswith("skiff_"), name
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
    return samples


def scrape(node):
    status, body = node.http_get("/metrics")
    assert status == 200, body
    return parse(body)


def test_scrape_follows_real_clients(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 2)
    before = scrape(node)
    values = [f"value-{i}".encode() for i in range(50)]
    p = ck.producer(node.bootstrap, {"acks": "all"})
    for v in values:
        ck.produce_bounded(p, topic=topic_name, value=v)
    ck.flush(p)
    # kcat consumes everything (it fetches through librdkafka).
    out = subprocess.run(
        ["kcat", "-b", node.bootstrap, "-C", "-t", topic_name, "-e", "-o", "beginning", "-q"],
        capture_output=True, timeout=60, check=True,
    ).stdout.decode().split()
    assert sorted(out) == sorted(v.decode() for v in values)
    after = scrape(node)

    def delta(name, labels=""):
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    topic = f'topic="{topic_name}"'
    assert delta("skiff_topic_records_in_total", topic) == 50
    assert delta("skiff_topic_bytes_in_total", topic) > 50 * len(b"value-00")
    assert delta("skiff_topic_records_out_total", topic) >= 50
    assert delta("skiff_topic_bytes_out_total", topic) >= delta("skiff_topic_bytes_in_total", topic)
    assert delta("skiff_requests_total", 'api="Produce"') >= 1
    assert delta("skiff_requests_total", 'api="Fetch"') >= 1
    assert delta("skiff_produce_latency_seconds_count", 'acks="all"') >= 1
    end_offsets = sum(
        v for (name, labels), v in after.items()
        if name == "skiff_log_end_offset" and topic in labels
    )
    assert end_offsets == 50
    assert after[("skiff_partitions_offline", "")] == 0


def test_health_and_refusals(node):
    assert node.http_get("/health") == (200, "ok\n")
    assert node.http_get("/no-such-path")[0] == 404
    # The node still answers Kafka clients afterwards.
    assert ck.admin(node.bootstrap).list_topics(timeout=10) is not None


def test_a_bearer_token_guards_metrics(node_factory, tmp_path):
    """metrics.bearer.token.file: /metrics answers 401 without the token (or
    with another), the scrape with it; /health stays open for probes."""
    import urllib.error
    import urllib.request

    token = "a token only the scraper knows"
    path = tmp_path / "metrics.token"
    path.write_text(token + "\n")
    n = node_factory({"metrics.bearer.token.file": str(path)})

    def get(auth=None):
        req = urllib.request.Request(f"http://127.0.0.1:{n.metrics_port}/metrics")
        if auth:
            req.add_header("Authorization", auth)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode(), r.headers
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), e.headers

    status, body, headers = get()
    assert status == 401 and "skiff_" not in body and headers.get("WWW-Authenticate") == "Bearer"
    assert get("Bearer some other token, long enough")[0] == 401
    status, body, _ = get(f"Bearer {token}")
    assert status == 200 and "skiff_" in body
    assert n.http_get("/health") == (200, "ok\n")
