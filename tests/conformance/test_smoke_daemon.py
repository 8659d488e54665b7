"""The daemon starts, serves both listeners and lists its deployments."""


def test_both_listeners_serve_the_same_catalog(daemon):
    tcp = daemon.request("GET", "/v1/models").json()
    unix = daemon.request("GET", "/v1/models", unix=True).json()
    assert tcp == unix
    assert sorted(m["id"] for m in tcp["data"]) == ["mini", "spare"]
