"""`.kvpack` files: export and build, import with proof of origin, and the keys you trust."""
