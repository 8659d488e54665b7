"""Scale-out: Loom replicas on Ray Serve, routed by where their state lives (docs/scale-out.md).

    routing.py    which replica serves a request (pure: ring, ownership tables, prefixes, load)
    aggregate.py  one answer from many replicas (models, status, lists, metrics, admin outcomes)
    replica.py    one loomd inside a Ray actor
    ingress.py    the Ray Serve ingress: proxies to replicas, fans out administration
    app.py        the application: build and run it (`loomd scale`)

Optional: `pip install loom[scale]` brings Ray Serve; nothing else in loomd imports this package.
"""
