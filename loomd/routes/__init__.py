"""HTTP routes, one module per spec section; each exposes `add_routes(add)`."""
